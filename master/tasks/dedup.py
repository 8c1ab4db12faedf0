"""Enqueue idempotency keys (SQS's deduplication id): an enqueue that carries
``idempotency_key`` is applied at most once per ``(group, key)`` within the retention
window (``dedup_retention_s``, 5 minutes by default), *even if the task it made has been
leased and dequeued since* — which pid collapse alone cannot promise, since it only holds
while the task is queued.

What is deduplicated: a second enqueue with the same group and key whose first one was
applied less than the retention window ago. It answers ``collapsed: true`` with the
*first* enqueue's queue and pid and changes nothing, whatever its own queue, pid or
payload. Not deduplicated: enqueues without a key; the same key in another group; a key
whose window has passed (it is applied again, as new); keys of enqueues that failed (a
refused request records nothing).

Storage: LMDB database ``dedup`` of the master's index environment, key
``group \\0 idempotency key`` → msgpack ``[expires_ms, queue, pid]``. Records are written
by the WAL op ``("K", group, key, queue, pid, expires_ms)`` (applied live and on replay, so
a window survives restarts); expired records count as absent and are deleted by a paced
sweep (:meth:`Dedup.sweep`, derived work of the master's background tick; not logged: a replayed
record that has expired is absent all the same).
"""

from __future__ import annotations

from typing import Any

import lmdb
import msgpack

KEY_MAX_CHARS = 128
SWEEP_BATCH = 1000


def _key(group: str, key: str) -> bytes:
    return f"{group}\x00{key}".encode()


class Dedup:
    def __init__(self, db: Any, retention_s: float = 300.0) -> None:
        self.db, self.retention_ms = db, int(retention_s * 1000)  # db: the index's `dedup`
        self._after = b""  # where the paced sweep goes on

    def get(self, txn: lmdb.Transaction, group: str, key: str, now_ms: int
            ) -> tuple[str, str] | None:
        """(queue, pid) of the enqueue that used this key within the window, or None."""
        raw = txn.get(_key(group, key), db=self.db)
        if raw is None:
            return None
        expires_ms, queue, pid = msgpack.unpackb(raw)
        return (queue, pid) if expires_ms > now_ms else None

    def op(self, group: str, key: str, queue: str, pid: str, now_ms: int) -> tuple[Any, ...]:
        return ("K", group, key, queue, pid, now_ms + self.retention_ms)

    def sweep(self, txn: lmdb.Transaction, now_ms: int, limit: int = SWEEP_BATCH) -> int:
        """Delete up to `limit` expired records in `txn` (the master runs it as derived
        work of a group commit, never in a write txn of its own), scanning on from where
        the last sweep stopped (wrapping around). Returns how many were deleted."""
        gone: list[bytes] = []
        seen = 0
        cur = txn.cursor(db=self.db)
        found = cur.set_range(self._after) if self._after else cur.first()
        while found and seen < limit:
            k, v = cur.item()
            seen += 1
            if msgpack.unpackb(v)[0] <= now_ms:
                gone.append(bytes(k))
            found = cur.next()
        self._after = bytes(cur.key()) if found else b""
        cur.close()
        for k in gone:
            txn.delete(k, db=self.db)
        return len(gone)

def apply_op(index: Any, txn: lmdb.Transaction, op: tuple[Any, ...]) -> None:
    """Apply a ("K", ...) op (see the module docstring): a plain put, so replaying it again
    changes nothing."""
    _, group, key, queue, pid, expires_ms = op
    txn.put(_key(group, key), msgpack.packb([expires_ms, queue, pid]), db=index.dedup)
