"""Re-replication planning: which under-replicated blobs get copied, from which live holder
to which node, in what commands, within per-node budgets. :class:`~squall.master.cluster.state.
Cluster` owns the block map and decides *that* a blob needs copies; this module decides
*how*, and keeps the ledger of copies in flight.

- **Waiting blobs** are kept per number of live copies left, fewest first (FIFO within, a
  blob that found no room this time moves to the back of its group): a blob the master
  examined below its replication factor waits here until its copies are planned, or it
  no longer needs them (freed, holders came back, or it has no live holder left).
- **Budgets**: a node takes part in at most ``max_bytes`` bytes and ``max_count`` blobs of
  copies in flight, as source and as target together (a copy larger than the byte budget
  runs alone); a target must also have the room free that it last reported. Bytes, not
  copies, are what a node's disk and network spend: a budget of 64 MiB is sixteen 4 MiB
  blobs or sixty thousand 1 KiB ones.
- **Commands**: blobs of known size up to ``SMALL_BLOB_BYTES`` travel together, one
  ``replicate_batch`` command per (source, target) pair and up to ``MAX_REPLICATE_BATCH``
  blobs and ``BATCH_BYTES`` (the source sends each as one request; the target stores it in
  one transaction and one sync); any other blob gets its own ``replicate`` command (a
  stream). Every command carries a replicate token the master signed for its blobs.
  Copies go node to node: the master never touches payload bytes.
- **In flight**: blob → target → :class:`Copy` (source, bytes, deadline). A copy ends when
  its source reports the outcome (ok means the target holds the blob synced, with a
  receipt), when the target reports holding the blob, when it times out, or when its
  source or target dies; the cluster then examines the blob again. Copies are also kept
  in deadline order (every deadline is the start plus one timeout, so start order) and
  per node, so that expiring them costs what expires, never a walk over all in flight
  (10,000 copies of small blobs took a walk of ~10 ms every second).
- **Sizes** come from block reports and write receipts; a blob of unknown size is copied
  alone and counted as ``SMALL_BLOB_BYTES``.

Each :meth:`Repair.plan` looks at no more than ``PLAN_SCAN`` waiting blobs (a slice of a few
milliseconds; it stays ``dirty`` when it stopped there having planned copies, so the next
tick goes on), and stops
early once no target has room, so planning costs little however large the backlog.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from squall.common.security.tokens import sign
from squall.common.wire.cluster import (
    MAX_REPLICATE_BATCH,
    ReplicateBatchCommand,
    ReplicateCommand,
)

SMALL_BLOB_BYTES = 1 << 20
BATCH_BYTES = 4 << 20
COPY_TIMEOUT_S = 300.0
PLAN_SCAN = 100


class NodeLike(Protocol):
    node_id: str
    address: str
    used_bytes: int
    free_bytes: int


# (sources: live holders, ids of nodes holding or receiving it, copies still wanted), or
# None when the blob needs nothing (any more)
Need = Callable[[str], "tuple[Sequence[NodeLike], set[str], int] | None"]


@dataclass(slots=True)
class Copy:
    source: str
    nbytes: int
    deadline: float


class Repair:
    def __init__(self, key: bytes, max_bytes: int, max_count: int) -> None:
        self.key, self.max_bytes, self.max_count = key, max_bytes, max_count
        self.inflight: dict[str, dict[str, Copy]] = {}
        self.node_bytes: dict[str, int] = {}
        self.node_count: dict[str, int] = {}
        self.copies = self.copy_bytes = 0  # in flight, in all
        self.waiting: dict[int, dict[str, None]] = {}  # live copies left -> blobs, in order
        self._group: dict[str, int] = {}  # blob -> its key in `waiting`
        self.sizes: dict[str, int] = {}
        self.copies_done = self.bytes_done = self.copies_failed = 0
        self.dirty = False  # something changed since the last plan (new blobs, freed budget)
        # (blob, target) of each copy in flight, in deadline order, and per source and target
        self._deadlines: dict[tuple[str, str], float] = {}
        self._by_node: dict[str, dict[tuple[str, str], None]] = {}

    # -- waiting blobs ---------------------------------------------------------------------
    def want(self, blob_id: str, live_copies: int) -> None:
        """The blob needs copies; it has `live_copies` left."""
        if self._group.get(blob_id) == live_copies:
            return
        self.forget(blob_id)
        self.waiting.setdefault(live_copies, {})[blob_id] = None
        self._group[blob_id] = live_copies
        self.dirty = True

    def forget(self, blob_id: str) -> None:
        g = self._group.pop(blob_id, None)
        if g is not None:
            del self.waiting[g][blob_id]
            if not self.waiting[g]:
                del self.waiting[g]

    def waiting_count(self) -> int:
        return len(self._group)

    # -- copies in flight ------------------------------------------------------------------
    def cost(self, blob_id: str) -> int:
        return self.sizes.get(blob_id, SMALL_BLOB_BYTES)

    def room(self, node_id: str, nbytes: int) -> bool:
        used = self.node_bytes.get(node_id, 0)
        return self.node_count.get(node_id, 0) < self.max_count and (
            used == 0 or used + nbytes <= self.max_bytes)

    def _charge(self, node_id: str, nbytes: int, count: int) -> None:
        b = self.node_bytes[node_id] = self.node_bytes.get(node_id, 0) + nbytes
        c = self.node_count[node_id] = self.node_count.get(node_id, 0) + count
        if c <= 0 and b <= 0:
            del self.node_bytes[node_id], self.node_count[node_id]

    def start(self, blob_id: str, source: str, target: str, nbytes: int,
              deadline: float) -> None:
        self.end(blob_id, target)
        self.inflight.setdefault(blob_id, {})[target] = Copy(source, nbytes, deadline)
        key = (blob_id, target)
        self._deadlines[key] = deadline
        self._by_node.setdefault(source, {})[key] = None
        self._by_node.setdefault(target, {})[key] = None
        self.copies += 1
        self.copy_bytes += nbytes
        self._charge(source, nbytes, 1)
        self._charge(target, nbytes, 1)

    def end(self, blob_id: str, target: str) -> Copy | None:
        """Forget the copy of `blob_id` to `target` (done, failed or abandoned)."""
        targets = self.inflight.get(blob_id)
        c = targets.pop(target, None) if targets else None
        if c is not None:
            key = (blob_id, target)
            del self._deadlines[key]
            for node_id in {c.source, target}:
                copies = self._by_node[node_id]
                del copies[key]
                if not copies:
                    del self._by_node[node_id]
            self.copies -= 1
            self.copy_bytes -= c.nbytes
            self._charge(c.source, -c.nbytes, -1)
            self._charge(target, -c.nbytes, -1)
            if not targets:
                del self.inflight[blob_id]
            self.dirty = True
        return c

    def finished(self, blob_id: str, target: str, ok: bool) -> Copy | None:
        """The source reported the outcome of a copy; the copy if it was still in flight."""
        c = self.end(blob_id, target)
        if ok:
            self.copies_done += 1
            self.bytes_done += c.nbytes if c is not None else self.cost(blob_id)
        else:
            self.copies_failed += 1
        return c

    def expire(self, now: float, gone: Callable[[str], bool]) -> list[str]:
        """End copies past their deadline or whose source or target is gone; their blobs.
        Costs the number of nodes plus the copies that end."""
        out = [b for node_id in [n for n in self._by_node if gone(n)]
               for b in self.abandon(node_id)]
        due = []
        for key, deadline in self._deadlines.items():  # deadline order
            if deadline >= now:
                break
            due.append(key)
        for b, t in due:
            self.end(b, t)
            out.append(b)
        return out

    def abandon(self, node_id: str) -> list[str]:
        """End the copies from or to `node_id` (it died or restarted: they died with it)."""
        keys = list(self._by_node.get(node_id, ()))
        for b, t in keys:
            self.end(b, t)
        return [b for b, _ in keys]

    def in_flight(self) -> tuple[int, int]:
        """(copies, bytes) in flight (kept as they start and end: the status page and the
        metrics ask often)."""
        return self.copies, self.copy_bytes

    # -- planning --------------------------------------------------------------------------
    def plan(self, now: float, candidates: Sequence[NodeLike], need: Need
             ) -> list[tuple[str, Any]]:
        """Copies for waiting blobs, fewest live copies first, within the budgets:
        (source node id, command) pairs to send."""
        self.dirty = False
        pairs: dict[tuple[str, str], list[str]] = {}  # batchable blobs per (source, target)
        single: list[tuple[str, str, str]] = []
        addr = {n.node_id: n.address for n in candidates}
        deadline = now + COPY_TIMEOUT_S
        scanned = 0
        for g in sorted(self.waiting):
            if scanned >= PLAN_SCAN:
                break
            group = self.waiting[g]
            for b in list(itertools.islice(group, PLAN_SCAN - scanned)):
                scanned += 1
                if not any(self.room(n.node_id, 1) for n in candidates):
                    return self._commands(pairs, single, addr, deadline)
                r = need(b)
                if r is None or r[2] <= 0:
                    self.forget(b)
                    continue
                sources, holding, want = r
                size = self.cost(b)
                for _ in range(want):
                    src = min((n for n in sources if self.room(n.node_id, size)),
                              key=lambda n: self.node_bytes.get(n.node_id, 0), default=None)
                    dst = min((n for n in candidates if n.node_id not in holding
                               and self.room(n.node_id, size)
                               and n.free_bytes >= size + self.node_bytes.get(n.node_id, 0)),
                              key=lambda n: (self.node_bytes.get(n.node_id, 0), n.used_bytes),
                              default=None)
                    if src is None or dst is None:
                        break
                    self.start(b, src.node_id, dst.node_id, size, deadline)
                    addr[src.node_id], addr[dst.node_id] = src.address, dst.address
                    holding.add(dst.node_id)
                    want -= 1
                    if b in self.sizes and size <= SMALL_BLOB_BYTES:
                        pairs.setdefault((src.node_id, dst.node_id), []).append(b)
                    else:
                        single.append((src.node_id, dst.node_id, b))
                if want <= 0:
                    self.forget(b)
                elif b in group:  # no room now: behind the others of its group
                    del group[b]
                    group[b] = None
        if scanned >= PLAN_SCAN and self.waiting:
            # more to look at: the next tick goes on, if this slice got anywhere (else the
            # once-a-second plan retries: never a busy loop over blobs with no room)
            self.dirty = bool(pairs or single)
        return self._commands(pairs, single, addr, deadline)

    def _commands(self, pairs: dict[tuple[str, str], list[str]],
                  single: Iterable[tuple[str, str, str]], addr: dict[str, str],
                  deadline: float) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        for (src, dst), blobs in pairs.items():
            batch: list[str] = []
            nbytes = 0
            for b in [*blobs, None]:
                size = self.sizes.get(b, 0) if b is not None else 0
                if batch and (b is None or len(batch) >= MAX_REPLICATE_BATCH
                              or nbytes + size > BATCH_BYTES):
                    token = sign(self.key, "replicate", batch, deadline)
                    out.append((src, ReplicateBatchCommand(
                        op="replicate_batch", blob_ids=batch, target=addr[dst], token=token)))
                    batch, nbytes = [], 0
                if b is not None:
                    batch.append(b)
                    nbytes += size
        for src, dst, b in single:
            token = sign(self.key, "replicate", [b], deadline)
            out.append((src, ReplicateCommand(op="replicate", blob_id=b, target=addr[dst],
                                              token=token)))
        return out
