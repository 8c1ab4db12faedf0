"""The master's view of the data nodes: node table, block map, re-replication and blob GC.

All of this is soft state, rebuilt from heartbeats after a master restart (a node whose
beats failed, or that the master does not know, sends its full inventory):

- **Node table**: a node is *alive* while it beats, *suspect* after missing one beat
  (no new blobs go there), *dead* after ``dead_after_beats`` missed beats. A dead node that
  beats again is re-admitted; whatever it holds that is no longer needed is deleted.
- **Decommissioning** (HDFS's model; the bookkeeping is in ``master/cluster/drain.py``): a node in
  ``draining`` (persisted in the index, so it survives a master restart) gets no new blobs
  and its copies do not count toward the replication factor, so repair copies every blob
  it holds to other nodes while it keeps serving reads; once all of them have their
  replication factor elsewhere it is ``decommissioned`` and can be stopped and forgotten.
- **Block map**: blob id → nodes that reported holding it (full or incremental reports,
  write receipts, finished copies).
- **Repair**: blobs to re-examine wait in ``check``: a holder died, came back or reported
  corruption, a node reported a copy the master did not know of, a copy failed. A report
  of a copy the master already knows (the write's receipt or the copy's own report came
  first) changes nothing and is not examined again. Each :meth:`Cluster.tick` examines a
  bounded batch (``CHECK_BATCH``: a slice of a few milliseconds, so that a node's death
  does not hold the event loop; the master ticks again at once while any are left). A blob that
  tasks still reference and that has fewer live copies than the replication factor waits
  for copies, which ``repair.py`` plans: fewest-copies-left first, from a live holder to a
  live node that lacks it, node to node (the master never touches bytes), small blobs many
  per command, within per-node budgets of bytes (``max_repair_bytes_per_node``) and blobs
  (``max_copies_per_node``) in flight. Finished copies free budget at once: the heartbeat
  that reports them gets the next commands. Extra copies beyond the replication factor (a
  node came back) are trimmed.
- **Unreported blobs**: after a master restart (once nodes had time to send their full
  reports, counted from the first tick) and then every ``blob_scan_interval_s``, a paced
  scan of the index's blob table (``blobscan.py``) finds referenced blobs that no live node
  reports: they are counted as lost (``lost`` in :meth:`Cluster.info`, a metric, a log
  line) and repaired as soon as a holder comes back and reports them.

Commands wait per node and ride on the answer to its next heartbeat.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from squall.common.errors import Unauthorized
from squall.common.security.tokens import verify_receipt
from squall.common.server.metrics import WorkTimes
from squall.common.wire.cluster import (
    MAX_COMMANDS,
    DeleteCommand,
    HeartbeatRequest,
    HeartbeatResponse,
)
from squall.master.cluster import blobgc, drain
from squall.master.cluster.blobscan import BlobScan
from squall.master.cluster.nodes import ClusterSettings, Node
from squall.master.cluster.repair import Repair

CHECK_BATCH = 100  # blobs examined per tick (one index read each): bounded loop time
LATER_S = 1.0  # how often an unreferenced blob in its orphan grace is looked at again
DRAIN_CHECK_S = 0.5  # how often draining nodes' progress is recounted


class Cluster:
    def __init__(self, clock: Any, settings: ClusterSettings, key: bytes,
                 referenced: Callable[[list[str]], list[bool]],
                 blob_ids_after: Callable[[str | None, int], list[str]] | None = None
                 ) -> None:
        self.clock, self.s, self.key, self.referenced = clock, settings, key, referenced
        self.nodes: dict[str, Node] = {}
        self.holders: dict[str, set[str]] = {}
        # blob -> nodes whose copy a signed receipt proved (a write, or a replicate report
        # carrying the target's receipt); a node's own report alone never trims these
        self.verified: dict[str, set[str]] = {}
        self.check: set[str] = set()
        self.later: set[str] = set()  # unreferenced blobs in their grace: looked at each second
        self._later_at = float("-inf")
        self.repair = Repair(key, settings.max_repair_bytes_per_node,
                             settings.max_copies_per_node)
        self.inflight = self.repair.inflight  # blob -> target node -> Copy
        s = settings
        grace = s.blob_scan_grace_s or (s.dead_after_beats + 2) * s.heartbeat_interval_s
        self.scan = BlobScan(blob_ids_after, grace, s.blob_scan_interval_s, s.blob_scan_batch)
        self._planned_at = 0.0
        self.full_reports: set[str] = set()  # nodes that sent a full report since start
        self.commands: dict[str, list[Any]] = {}
        # node -> blobs whose delete went out with its last answer: it runs before the node's
        # next report, and until then no copy of them goes there (see `_deleting`)
        self.delivered_deletes: dict[str, set[str]] = {}
        self.allocated: dict[str, float] = {}  # blob -> allocation time (orphan grace)
        self.unreferenced_since: dict[str, float] = {}
        self.under: set[str] = set()
        self.lost: set[str] = set()
        self.deleted = 0
        # node id -> time decommissioning was asked (persisted by the master;
        # master/cluster/drain.py)
        self.draining: dict[str, float] = {}
        self.drain_checked_at = 0.0
        self.work = WorkTimes(("heartbeat", "tick"))  # event-loop time per call (a metric)

    @property
    def copies_done(self) -> int:
        return self.repair.copies_done

    # -- node states ---------------------------------------------------------------------
    def state(self, n: Node, now: float) -> str:
        missed = (now - n.last_beat) / self.s.heartbeat_interval_s
        if n.dead or missed > self.s.dead_after_beats:
            return "dead"
        return "suspect" if missed > 1.5 else "alive"

    def live(self, now: float | None = None, *, strict: bool = False) -> list[Node]:
        """Nodes not dead (strict: only alive ones, for new placements)."""
        now = self.clock.now() if now is None else now
        ok = ("alive",) if strict else ("alive", "suspect")
        return [n for n in self.nodes.values() if self.state(n, now) in ok
                and not (strict and n.node_id in self.draining)]

    def not_dead(self, now: float) -> dict[str, Node]:
        """The nodes not dead at `now`, by id: for a loop over many blobs, one state check
        per node instead of one per copy (pass it to :meth:`live_holders`)."""
        return {i: n for i, n in self.nodes.items() if self.state(n, now) != "dead"}

    def live_holders(self, blob_id: str, now: float | None = None,
                     alive: dict[str, Node] | None = None) -> list[Node]:
        """The nodes not dead that hold `blob_id` (`alive`: :meth:`not_dead` at `now`)."""
        if alive is not None:
            return [alive[i] for i in self.holders.get(blob_id, ()) if i in alive]
        now = self.clock.now() if now is None else now
        return [self.nodes[i] for i in self.holders.get(blob_id, ()) if i in self.nodes
                and self.state(self.nodes[i], now) != "dead"]

    # -- heartbeats ----------------------------------------------------------------------
    @WorkTimes.timed("heartbeat")
    def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResponse:
        now = self.clock.now()
        n = self.nodes.get(req.node_id)
        fresh = n is None or n.started_at != req.started_at or n.dead
        if n is not None and n.started_at != req.started_at:
            self.check.update(self.repair.abandon(n.node_id))  # its copies died with it
        if n is None:
            n = self.nodes[req.node_id] = Node(req.node_id, req.address, req.started_at, now)
        if fresh:
            n.reported_full = False
            n.vouched.clear()  # (re)joined: receipts from before do not outlive a restart
        n.address, n.started_at, n.last_beat, n.dead = req.address, req.started_at, now, False
        if fresh:
            self.repair.dirty = True  # a new target
            self.check.update(n.blobs)  # back from the dead: copies made meanwhile are extra
        n.capacity_bytes, n.used_bytes = req.capacity_bytes, req.used_bytes
        n.free_bytes, n.blob_count = req.free_bytes, req.blob_count
        # deletes sent with its last answer ran before this report was made (or the answer
        # was lost and this is a full report of what it still holds): it is the truth now
        self.delivered_deletes.pop(n.node_id, None)
        # blobs this node is about to delete (commands not yet delivered) are listed in a
        # report made before the delete: re-adding them would count a copy that is going
        # away, and a trim could then delete a second, real copy
        doomed = self._pending_deletes(n.node_id) if req.full or req.added else set()
        if req.full:
            self.full_reports.add(n.node_id)  # since this master started
            listed = set(req.blob_ids) - doomed
            for b in n.blobs - listed - n.vouched:
                self._drop(b, n.node_id)
            self._add(listed, n)
            n.reported_full = True
            self._sizes(req.blob_ids, req.blob_sizes)
        else:
            self._add((b for b in req.added if b not in doomed), n)
            self._sizes(req.added, req.added_sizes)
            for b in req.deleted:
                self._drop(b, n.node_id)
        n.vouched.clear()  # its next report is made after this answer: after they landed
        for b in req.corrupt:
            self._drop(b, n.node_id)
        if req.replicated:
            self._copies_reported(req.replicated, now)
        cmds = self.commands.pop(n.node_id, [])
        if len(cmds) > MAX_COMMANDS:
            self.commands[n.node_id] = cmds[MAX_COMMANDS:]
            cmds = cmds[:MAX_COMMANDS]
        gone = {b for c in cmds if isinstance(c, DeleteCommand) for b in c.blob_ids}
        if gone:
            self.delivered_deletes[n.node_id] = gone
        need_full = fresh and not req.full
        return HeartbeatResponse(commands=cmds, full_report=need_full)

    def _add(self, blob_ids: Iterable[str], n: Node) -> None:
        for b in blob_ids:
            if b in n.blobs:
                continue  # known already (a receipt, a copy's report): nothing changed
            n.blobs.add(b)
            self.holders.setdefault(b, set()).add(n.node_id)
            if b in self.inflight:
                self.repair.end(b, n.node_id)
            self.check.add(b)

    def _sizes(self, blob_ids: list[str], sizes: list[int]) -> None:
        if len(sizes) == len(blob_ids):
            self.repair.sizes.update(zip(blob_ids, sizes, strict=True))

    def _drop(self, blob_id: str, node_id: str) -> None:
        """Forget `node_id`'s copy; the blob is examined again if that changed anything (a
        node's report of a delete the master sent already changes nothing: not again)."""
        changed = False
        n = self.nodes.get(node_id)
        if n is not None and blob_id in n.blobs:
            n.blobs.discard(blob_id)
            changed = True
        hs = self.holders.get(blob_id)
        if hs is not None and node_id in hs:
            hs.discard(node_id)
            changed = True
            if not hs:
                del self.holders[blob_id]
                self.repair.sizes.pop(blob_id, None)
        vs = self.verified.get(blob_id)
        if vs is not None and node_id in vs:  # a node may always report the loss of its copy
            vs.discard(node_id)
            changed = True
            if not vs:
                del self.verified[blob_id]
        if changed:
            self.check.add(blob_id)

    def _receipt_ok(self, receipt: str | None, blob_id: str, node_id: str) -> bool:
        try:
            verify_receipt(self.key, receipt, blob_id, node_id=node_id)
        except Unauthorized:
            return False
        return True

    def record_holders(self, blob_id: str, node_ids: Iterable[str],
                       size: int | None = None) -> None:
        """Write receipts proved these nodes hold the blob (before their next report)."""
        for i in node_ids:
            n = self.nodes.get(i)
            if n is not None:
                self._add([blob_id], n)
                n.vouched.add(blob_id)
                self.verified.setdefault(blob_id, set()).add(i)
        if size is not None and blob_id in self.holders:
            self.repair.sizes[blob_id] = size

    def record_holders_many(self, blob_ids: list[str], node_ids: Iterable[str],
                            sizes: list[int]) -> None:
        """:meth:`record_holders` for many blobs proved by the same nodes (a front-door
        request's): one pass per node over the batch, not one call per blob and node."""
        holders, verified, inflight = self.holders, self.verified, self.inflight
        for i in node_ids:
            n = self.nodes.get(i)
            if n is None:
                continue
            known = n.blobs
            new = [b for b in blob_ids if b not in known]
            if new:
                known.update(new)
                for b in new:
                    hs = holders.get(b)
                    if hs is None:
                        holders[b] = {i}
                    else:
                        hs.add(i)
                    if b in inflight:
                        self.repair.end(b, i)
                self.check.update(new)
            n.vouched.update(blob_ids)
            for b in blob_ids:
                vs = verified.get(b)
                if vs is None:
                    verified[b] = {i}
                else:
                    vs.add(i)
        rs = self.repair.sizes
        for b, size in zip(blob_ids, sizes, strict=True):
            if b in holders:
                rs[b] = size

    def _pending_deletes(self, node_id: str) -> set[str]:
        return {b for c in self.commands.get(node_id, ()) if isinstance(c, DeleteCommand)
                for b in c.blob_ids}

    def _deleting(self, node_id: str) -> set[str]:
        """Blobs the node was asked to delete and has not reported on since: a copy of one
        of them sent there could land before the delete runs and be counted, then deleted."""
        return self._pending_deletes(node_id) | self.delivered_deletes.get(node_id, set())

    def _send(self, node_id: str, cmd: Any) -> None:
        self.commands.setdefault(node_id, []).append(cmd)

    # -- repair and GC -------------------------------------------------------------------
    @WorkTimes.timed("tick")
    def tick(self, freed: list[str]) -> dict[str, int]:
        """Declare dead nodes, free dequeued blobs, and examine a batch of blobs."""
        now = self.clock.now()
        self._declare_dead(now)
        self._expire_copies(now)  # a dead node's copies end at once (it lost its commands)
        if self.draining and now - self.drain_checked_at >= max(
                DRAIN_CHECK_S, self.s.heartbeat_interval_s):
            self.drain_checked_at = now
            drain.update(self, now)
        blobgc.free(self, freed, now)
        while self.allocated:  # oldest first (insertion order): no walk over all of them
            b, t = next(iter(self.allocated.items()))
            if now - t <= self.s.orphan_grace_s:
                break
            del self.allocated[b]
        scanned = self._scan_unreported(now)
        if self.later and now >= self._later_at:
            self.check |= self.later
            self.later.clear()
            self._later_at = now + LATER_S
        batch = [self.check.pop() for _ in range(min(CHECK_BATCH, len(self.check)))]
        refs = self.referenced(batch) if batch else []
        alive = self.not_dead(now) if batch else {}  # no node's state changes in this loop
        for b, ref in zip(batch, refs, strict=True):
            live = self.live_holders(b, alive=alive)
            if ref:
                blobgc.examine(self, b, live)
            else:
                blobgc.maybe_orphan(self, b, live, now)
        copies = 0
        if self.repair.waiting and (self.repair.dirty or now - self._planned_at >= 1.0):
            copies = self._plan(now)  # else nothing changed that could make room
        return {"checked": len(batch), "copies": copies, "scanned": scanned,
                "backlog": len(self.check) + (self.repair.dirty and bool(self.repair.waiting))}

    def _declare_dead(self, now: float) -> None:
        for n in self.nodes.values():
            if not n.dead and self.state(n, now) == "dead":
                n.dead = True
                self.check.update(n.blobs)
                self.commands.pop(n.node_id, None)  # never delivered: replanned elsewhere
                self.delivered_deletes.pop(n.node_id, None)

    def _expire_copies(self, now: float) -> None:
        """Forget copies that timed out or whose source or target died; re-examine them."""
        def gone(node_id: str) -> bool:
            return node_id not in self.nodes or self.nodes[node_id].dead

        self.check.update(self.repair.expire(now, gone))

    # -- re-replication (planned by repair.py) ---------------------------------------------
    def _copies_reported(self, reports: Iterable[Any], now: float) -> None:
        """Outcomes of copies a source ran; a good one means the target holds the blob."""
        by_address = {n.address.rstrip("/"): n for n in self.nodes.values()}
        for rep in reports:
            target = by_address.get(rep.target.rstrip("/"))
            if target is not None:
                copy = self.repair.finished(rep.blob_id, target.node_id, rep.ok)
                # only a copy still in flight proves the target holds the blob now: a late
                # report (the target's own report ended the copy, then a trim deleted it)
                # would count a copy that is gone; the target's reports tell the rest
                if rep.ok and copy is not None:
                    self._add([rep.blob_id], target)  # examined again if it was news
                    target.vouched.add(rep.blob_id)
                    if self._receipt_ok(rep.receipt, rep.blob_id, target.node_id):
                        self.verified.setdefault(rep.blob_id, set()).add(target.node_id)
                    continue
            self.check.add(rep.blob_id)
        if self.repair.waiting:  # the budget this freed goes to the next copies at once
            self._plan(now)

    def _need(self, b: str, now: float, deleting: dict[str, set[str]]
              ) -> tuple[list[Node], set[str], int] | None:
        """For planning: (live holders, nodes holding or receiving it, copies wanted)."""
        live = self.live_holders(b, now)
        if not live:
            self.check.add(b)  # examined again: lost until a holder reports it
            return None
        copying = self.inflight.get(b, {})
        holding = {n.node_id for n in live} | set(copying)
        # not to a node that has yet to receive a delete of this blob: the copy could land
        # first and be deleted after its receipt was counted
        holding |= {i for i, doomed in deleting.items() if b in doomed}
        # a draining node's copy is a source (others first), not a copy that counts
        counting = sum(1 for n in live if n.node_id not in self.draining)
        live = sorted(live, key=lambda n: n.node_id in self.draining)
        return live, holding, self.s.replication_factor - counting - len(copying)

    def _plan(self, now: float) -> int:
        self._planned_at = now
        candidates = self.live(now, strict=True)
        deleting = {i: d for i in {*self.commands, *self.delivered_deletes}
                    if (d := self._deleting(i))} if self.repair.waiting else {}
        planned = self.repair.plan(now, candidates, lambda b: self._need(b, now, deleting))
        for src, cmd in planned:
            self._send(src, cmd)
        return sum(len(getattr(c, "blob_ids", ())) or 1 for _, c in planned)

    def _scan_unreported(self, now: float) -> int:
        """One paced step of the scan for referenced blobs that no live node reports."""
        ready = all(n.node_id in self.full_reports for n in self.live(now))
        ids = self.scan.step(now, ready)
        unreported = []
        alive = self.not_dead(now) if ids else {}
        for b in ids:
            live = self.live_holders(b, alive=alive)
            if len(live) < self.s.replication_factor and not self.inflight.get(b):
                self.check.add(b)
                if not live:
                    unreported.append(b)
        self.scan.found(unreported, now)
        return len(ids)

    def describe(self, n: Node, now: float) -> dict[str, Any]:
        health = self.state(n, now)
        return {"node_id": n.node_id, "address": n.address,
                "state": drain.state_of(self, n, health), "health": health,
                "last_beat_secs_ago": round(now - n.last_beat, 3),
                "capacity_bytes": n.capacity_bytes, "used_bytes": n.used_bytes,
                "free_bytes": n.free_bytes, "blob_count": n.blob_count,
                "decommission": drain.progress(self, n)}

    def info(self) -> dict[str, Any]:
        now = self.clock.now()
        nodes = [self.describe(n, now)
                 for n in sorted(self.nodes.values(), key=lambda n: n.node_id)]
        copies, nbytes = self.repair.in_flight()
        return {"nodes": nodes, "replication_factor": self.s.replication_factor,
                "write_quorum": self.s.quorum, "under_replicated": len(self.under),
                "lost": len(self.lost), "copies_in_flight": copies,
                "copy_bytes_in_flight": nbytes, "copies_waiting": self.repair.waiting_count(),
                "copies_done": self.repair.copies_done, "blobs": len(self.holders),
                "blob_scan": self.scan.info()}
