"""Lease tokens on the wire: the engine's fencing number, sealed so nobody can guess one.

The engine fences leases with one global sequence (``lease_seq``, see engine.py): every
lease takes the next number, and only the holder of the task's current number may renew,
release or dequeue it. Those numbers are small and sequential, so on the wire each is
sealed: ``<seq>.<mac>``, mac = BLAKE2b-128 keyed with the master's *lease key* over the
group, queue, pid and seq (32 hex digits). A token is good for the one task and lease it
was issued for; a guessed, forged or borrowed one opens to 0, a number no lease ever has,
so the engine answers it exactly as a stale token (409 ``lease_lost``, or 404 when the task
is gone) and changes nothing.

The lease key is 32 random bytes in ``<data_dir>/lease.key`` (mode 0600, made on first
start), apart from the cluster key (payload tokens, shared with data nodes) and the auth
key (credentials): only the master needs it, and leases taken before a restart are still
acknowledged with their tokens after it, because the key lives with the WAL and the index.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from squall.common.security.auth import new_key, write_secret

KEY_FILE = "lease.key"
MIN_KEY_BYTES = 16


def load_or_make_key(data_dir: str) -> bytes:
    """The master's lease key, made in `data_dir` on first start."""
    path = os.path.join(data_dir, KEY_FILE)
    if not os.path.exists(path):
        write_secret(path, new_key() + b"\n")
    with open(path, "rb") as f:
        key = f.read().strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"{path}: the lease key is {len(key)} bytes; delete the file to "
                         "make a new one (leases taken before are then refused)")
    return key


class LeaseTokens:
    """Seal fencing numbers into wire tokens and open them again."""

    __slots__ = ("_base",)

    def __init__(self, key: bytes) -> None:
        # the keyed hash's state after the key block, copied for each token: cheaper than
        # keying a new hash every time (this runs for every leased and dequeued task)
        self._base = hashlib.blake2b(key=key, digest_size=16)

    def _mac(self, group: str, queue: str, pid: str, seq: str) -> str:
        # names hold no NUL and seq is digits: the fields cannot run into each other
        h = self._base.copy()
        h.update(f"{group}\0{queue}\0{seq}\0{pid}".encode("utf-8", "surrogatepass"))
        return h.hexdigest()

    def seal(self, group: str, queue: str, pid: str, seq: int) -> str:
        s = str(seq)
        return f"{s}.{self._mac(group, queue, pid, s)}"

    def open(self, group: str, queue: str, pid: str, token: str) -> int:
        """The fencing number of `token` if this master issued it for this task, else 0
        (never a lease's number: the engine then answers it as a stale token)."""
        s, dot, mac = token.partition(".")
        if not dot or not s.isdigit() or not s.isascii() or not mac.isascii():
            return 0
        if not hmac.compare_digest(mac, self._mac(group, queue, pid, s)):
            return 0
        return int(s)
