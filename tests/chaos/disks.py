"""Small private filesystems for the servers' data folders, and filling them up.

Each server's data folder is a tmpfs of a fixed size, mounted inside the soak's private
mount namespace (so it vanishes with the soak even on a crash). "Fill the disk" writes a
filler file until the filesystem answers ENOSPC; "free" deletes it. tmpfs keeps its files
across SIGKILLs of the servers (only a reboot clears it), which is all the soak needs;
it does not model a power loss (tests/test_model.py does that for the master).
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess

FILLER = ".soak-filler"
CHUNK = 1 << 20


def mount_tmpfs(path: str, size_mb: int) -> None:
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "soak", path],
                   check=True, capture_output=True, text=True)


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(path: str, max_bytes: int = 8 << 30) -> int:
    """Write a filler file into `path` until the filesystem is full; returns its size."""
    written = 0
    block = b"\xa5" * CHUNK
    fd = os.open(os.path.join(path, FILLER), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while written < max_bytes:
            try:
                written += os.write(fd, block if free_bytes(path) > CHUNK else block[:4096])
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    break
                raise
    finally:
        os.close(fd)
    return written


def free(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(path, FILLER))
