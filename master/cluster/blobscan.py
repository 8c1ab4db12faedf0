"""The paced scan for referenced blobs that no live data node reports.

The block map is soft state: after a master restart it holds only what nodes reported
since, so a blob whose every holder is down (or was wiped) would never be examined, and
nobody would hear it is lost. :class:`BlobScan` walks the index's ``blobs`` table (blob
id → references, see ``index.py``) in id order, ``batch`` ids per tick, and the cluster
examines every id that has fewer live holders than the replication factor: with none it
is counted as lost (``lost`` in the cluster stats and ``squall_blobs_lost``), and it is
repaired as soon as a holder comes back and reports it.

- The first pass starts ``grace_s`` after the master's first tick, i.e. after recovery,
  once it serves heartbeats, and once every live node has sent a full report since the
  master started (the master asks a node it does not know for one; a node that has not
  after three graces does not hold the scan up); the next ones ``interval_s`` after the
  previous pass ended.
- A pass that found referenced blobs without a live holder logs one warning with their
  number and a few ids; ``info()`` shows passes, progress and the last pass's count.
- Work per tick is bounded by ``batch`` (one read transaction, one lookup per id).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import lmdb

log = logging.getLogger("squall.master.cluster.blobscan")
EXAMPLES = 5


class BlobScan:
    def __init__(self, read: Callable[[str | None, int], list[str]] | None, grace_s: float,
                 interval_s: float, batch: int) -> None:
        self.read, self.interval_s, self.batch = read, interval_s, max(1, batch)
        self.grace_s = grace_s
        self.next_pass_at: float | None = None  # set by the first step
        self.cursor: str | None = None
        self.running = False
        self.passes = 0
        self.scanned = 0  # ids read in the current pass
        self.found_now = 0  # blobs without a live holder in the current pass
        self.last_found = 0  # ... in the last finished pass
        self.last_pass_at: float | None = None
        self.examples: list[str] = []
        self._ended = False

    def step(self, now: float, ready: bool = True) -> list[str]:
        """The next ids to examine ([] when no pass is due). A pass starts only when
        `ready` (every live node has sent a full report), or two graces later anyway.
        Call :meth:`found` after."""
        self._ended = False
        if self.next_pass_at is None:
            self.next_pass_at = now + self.grace_s
        if self.read is None:
            return []
        if not self.running:
            due = self.next_pass_at
            if now < due or (not ready and now < due + 2 * self.grace_s):
                return []
            self.running, self.cursor, self.scanned, self.found_now = True, None, 0, 0
            self.examples = []
        ids = self.read(self.cursor, self.batch)
        self.scanned += len(ids)
        if len(ids) < self.batch:
            self.running, self.cursor, self._ended = False, None, True
        else:
            self.cursor = ids[-1]
        return ids

    def found(self, unreported: list[str], now: float) -> None:
        """These ids of the last step have no live holder."""
        self.found_now += len(unreported)
        self.examples = (self.examples + unreported[:EXAMPLES])[:EXAMPLES]
        if self._ended:
            self._finish(now)

    def _finish(self, now: float) -> None:
        self._ended = False
        self.passes += 1
        self.last_found = self.found_now
        self.last_pass_at = now
        self.next_pass_at = now + self.interval_s
        if self.found_now:
            log.warning("blob scan: %d referenced blob(s) have no live replica (lost until "
                        "a data node holding them reports back), e.g. %s", self.found_now,
                        ", ".join(self.examples) or "?")
        else:
            log.info("blob scan: %d referenced blob(s), every one held by a live node",
                     self.scanned)

    def info(self) -> dict[str, Any]:
        return {"passes": self.passes, "running": self.running, "scanned": self.scanned,
                "unreported_last_pass": self.last_found}


def blob_ids_after(env: lmdb.Environment, db: Any, after: str | None, limit: int
                   ) -> list[str]:
    """Up to `limit` keys of an LMDB table after `after` (from the start when None)."""
    out: list[str] = []
    with env.begin(db=db) as txn:
        cur = txn.cursor(db=db)
        ok = cur.set_range(after.encode() + b"\0") if after is not None else cur.first()
        while ok and len(out) < limit:
            out.append(cur.key().decode())
            ok = cur.next()
    return out
