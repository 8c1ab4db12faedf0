"""Private by default: a server's data folder and every file in it are its owner's alone.

Servers set the process umask to 077 when they start (:func:`private_umask`), create their
folders 0700 (:func:`private_dir`) and files 0600 (LMDB files, WAL segments, keys), and
refuse to start on a data folder that other users can read or enter
(:func:`check_data_dir`) unless told to (``--allow-shared-data-dir`` /
``SQUALL_ALLOW_SHARED_DATA_DIR``): the payloads and the task metadata in it are readable
past every token by anyone who can open the files.
"""

from __future__ import annotations

import os
import stat

DIR_MODE = 0o700
FILE_MODE = 0o600
ALLOW_SHARED_ENV = "SQUALL_ALLOW_SHARED_DATA_DIR"


def private_umask() -> None:
    """Files and folders this process creates from now on are its owner's only."""
    os.umask(0o077)


def private_dir(path: str) -> str:
    """Create `path` (and missing parents) with mode 0700 when absent; return it."""
    os.makedirs(path, mode=DIR_MODE, exist_ok=True)
    return path


def shared_bits(path: str) -> int:
    """The group and other permission bits of `path` (0 when private or absent)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode) & 0o077
    except FileNotFoundError:
        return 0


def check_data_dir(path: str, allow_shared: bool, role: str) -> None:
    """Refuse (SystemExit) a data folder other users can read, write or enter, unless
    `allow_shared`; create it 0700 when absent."""
    bits = shared_bits(path)
    if bits and not allow_shared:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        raise SystemExit(
            f"refusing to start: the {role}'s data folder {path} has mode {mode:04o}: other "
            "users can reach the payloads and metadata in it past every token. Make it "
            f"private (chmod 700 {path}; chmod -R go-rwx {path} for the files made before), "
            f"or pass --allow-shared-data-dir ({ALLOW_SHARED_ENV}=1) if its group is "
            "trusted (e.g. a Kubernetes volume with fsGroup).")
    private_dir(path)
