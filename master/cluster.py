"""The master's view of the data nodes: node table, block map, re-replication and blob GC.

All of this is soft state, rebuilt from heartbeats after a master restart (a node whose
beats failed, or that the master does not know, sends its full inventory):

- **Node table**: a node is *alive* while it beats, *suspect* after missing one beat
  (no new blobs go there), *dead* after ``dead_after_beats`` missed beats. A dead node that
  beats again is re-admitted; whatever it holds that is no longer needed is deleted.
- **Block map**: blob id → nodes that reported holding it (full or incremental reports,
  write receipts, finished copies).
- **Repair**: blobs to re-examine (a holder died or reported corruption, a new report came
  in) wait in ``check``; each :meth:`Cluster.tick` examines a bounded batch. A blob that
  tasks still reference and that has fewer live copies than the replication factor gets
  copy commands, fewest-copies-left first, from a live holder to the least-used live node
  that lacks it, node to node (the master never touches bytes), with at most
  ``max_copies_per_node`` copies in flight per source and per target. Extra copies beyond
  the replication factor (a node came back) are trimmed.
- **GC**: blobs of dequeued or deleted tasks (``Index.freed``), and orphans (reported by a
  node, referenced by no task, and not allocated within ``orphan_grace_s``) are deleted.
  Every deletion re-checks the index first, so a blob is never deleted while a task
  references it.

Commands wait per node and ride on the answer to its next heartbeat.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from squall.common.cluster import (
    MAX_COMMANDS,
    DeleteCommand,
    HeartbeatRequest,
    HeartbeatResponse,
    ReplicateCommand,
)
from squall.common.tokens import sign

CHECK_BATCH = 20_000
DELETE_BATCH = 1000
COPY_TIMEOUT_S = 300.0


@dataclass
class ClusterSettings:
    replication_factor: int = 2
    write_quorum: int = 0  # 0: all of the replica set
    heartbeat_interval_s: float = 3.0
    dead_after_beats: int = 3
    max_copies_per_node: int = 4
    orphan_grace_s: float = 600.0

    def __post_init__(self) -> None:
        if self.replication_factor < 1:
            raise ValueError("replication_factor must be at least 1")
        if not 0 <= self.write_quorum <= self.replication_factor:
            raise ValueError(f"write_quorum {self.write_quorum} must be 0 (all of the replica "
                             f"set) up to the replication factor {self.replication_factor}")
        if not self.heartbeat_interval_s > 0:
            raise ValueError(f"heartbeat_interval_s must be > 0, not {self.heartbeat_interval_s}")

    @property
    def quorum(self) -> int:
        return self.write_quorum or self.replication_factor


@dataclass
class Node:
    node_id: str
    address: str
    started_at: float
    last_beat: float
    capacity_bytes: int = 0
    used_bytes: int = 0
    free_bytes: int = 0
    blob_count: int = 0
    dead: bool = False
    blobs: set[str] = field(default_factory=set)
    block_grants: list[float] = field(default_factory=list)  # front-door block expiries


class Cluster:
    def __init__(self, clock: Any, settings: ClusterSettings, key: bytes,
                 referenced: Callable[[list[str]], list[bool]]) -> None:
        self.clock, self.s, self.key, self.referenced = clock, settings, key, referenced
        self.nodes: dict[str, Node] = {}
        self.holders: dict[str, set[str]] = {}
        self.check: set[str] = set()
        # blob -> target node -> (source node, deadline)
        self.inflight: dict[str, dict[str, tuple[str, float]]] = {}
        self.commands: dict[str, list[Any]] = {}
        self.allocated: dict[str, float] = {}  # blob -> allocation time (orphan grace)
        self.unreferenced_since: dict[str, float] = {}
        self.under: set[str] = set()
        self.lost: set[str] = set()
        self.copies_done = 0
        self.deleted = 0

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
        return [n for n in self.nodes.values() if self.state(n, now) in ok]

    def live_holders(self, blob_id: str, now: float | None = None) -> list[Node]:
        now = self.clock.now() if now is None else now
        return [self.nodes[i] for i in self.holders.get(blob_id, ()) if i in self.nodes
                and self.state(self.nodes[i], now) != "dead"]

    # -- heartbeats ----------------------------------------------------------------------
    def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResponse:
        now = self.clock.now()
        n = self.nodes.get(req.node_id)
        fresh = n is None or n.started_at != req.started_at or n.dead
        if n is None:
            n = self.nodes[req.node_id] = Node(req.node_id, req.address, req.started_at, now)
        n.address, n.started_at, n.last_beat, n.dead = req.address, req.started_at, now, False
        n.capacity_bytes, n.used_bytes = req.capacity_bytes, req.used_bytes
        n.free_bytes, n.blob_count = req.free_bytes, req.blob_count
        if req.full:
            for b in n.blobs - set(req.blob_ids):
                self._drop(b, n.node_id)
            self._add(req.blob_ids, n)
        else:
            self._add(req.added, n)
            for b in req.deleted:
                self._drop(b, n.node_id)
        for b in req.corrupt:
            self._drop(b, n.node_id)
        for rep in req.replicated:
            targets = self.inflight.get(rep.blob_id, {})
            target = next((t for t, node in self.nodes.items()
                           if node.address.rstrip("/") == rep.target.rstrip("/")), None)
            if target is not None:
                targets.pop(target, None)
                if rep.ok:
                    self.copies_done += 1
                    self._add([rep.blob_id], self.nodes[target])
            self.check.add(rep.blob_id)
        cmds = self.commands.pop(n.node_id, [])
        if len(cmds) > MAX_COMMANDS:
            self.commands[n.node_id] = cmds[MAX_COMMANDS:]
            cmds = cmds[:MAX_COMMANDS]
        need_full = fresh and not req.full
        return HeartbeatResponse(commands=cmds, full_report=need_full)

    def _add(self, blob_ids: Iterable[str], n: Node) -> None:
        for b in blob_ids:
            n.blobs.add(b)
            self.holders.setdefault(b, set()).add(n.node_id)
            self.inflight.get(b, {}).pop(n.node_id, None)
            self.check.add(b)

    def _drop(self, blob_id: str, node_id: str) -> None:
        n = self.nodes.get(node_id)
        if n is not None:
            n.blobs.discard(blob_id)
        hs = self.holders.get(blob_id)
        if hs is not None:
            hs.discard(node_id)
            if not hs:
                del self.holders[blob_id]
        self.check.add(blob_id)

    def record_holders(self, blob_id: str, node_ids: Iterable[str]) -> None:
        """Write receipts proved these nodes hold the blob (before their next report)."""
        for i in node_ids:
            n = self.nodes.get(i)
            if n is not None:
                self._add([blob_id], n)

    def _send(self, node_id: str, cmd: Any) -> None:
        self.commands.setdefault(node_id, []).append(cmd)

    # -- repair and GC -------------------------------------------------------------------
    def tick(self, freed: list[str]) -> dict[str, int]:
        """Declare dead nodes, free dequeued blobs, and examine a batch of blobs."""
        now = self.clock.now()
        self._declare_dead(now)
        self._expire_copies(now)
        self._free(freed, now)
        for b, t in list(self.allocated.items()):
            if now - t > self.s.orphan_grace_s:
                del self.allocated[b]
        batch = [self.check.pop() for _ in range(min(CHECK_BATCH, len(self.check)))]
        refs = self.referenced(batch) if batch else []
        needy: list[tuple[int, str, list[Node]]] = []
        for b, ref in zip(batch, refs, strict=True):
            live = self.live_holders(b, now)
            if ref:
                self._examine(b, live, needy)
            else:
                self._maybe_orphan(b, live, now)
        needy.sort(key=lambda x: x[0])  # fewest copies left first
        return {"checked": len(batch), "copies": self._plan_copies(needy, now)}

    def _declare_dead(self, now: float) -> None:
        for n in self.nodes.values():
            if not n.dead and self.state(n, now) == "dead":
                n.dead = True
                self.check.update(n.blobs)
                self.commands.pop(n.node_id, None)  # never delivered: replanned elsewhere

    def _expire_copies(self, now: float) -> None:
        """Forget copies that timed out or whose source or target died; re-examine them."""
        def gone(node_id: str) -> bool:
            return node_id not in self.nodes or self.nodes[node_id].dead

        for b, targets in list(self.inflight.items()):
            for t, (src, deadline) in list(targets.items()):
                if deadline < now or gone(t) or gone(src):
                    del targets[t]
                    self.check.add(b)
            if not targets:
                del self.inflight[b]

    def _free(self, freed: list[str], now: float) -> None:
        """Delete every copy of blobs whose last reference went away (no orphan grace)."""
        freed = list(dict.fromkeys(freed))
        for b, ref in zip(freed, self.referenced(freed) if freed else [], strict=True):
            if not ref:
                self.under.discard(b)
                self.lost.discard(b)
                self._delete(b, self.live_holders(b, now))

    def _examine(self, b: str, live: list[Node], needy: list[tuple[int, str, list[Node]]]
                 ) -> None:
        """A referenced blob: note it lost or under-replicated, or trim extra copies."""
        rf = self.s.replication_factor
        self.unreferenced_since.pop(b, None)
        self.lost.discard(b)
        self.under.discard(b)
        if not live:
            self.lost.add(b)
        elif len(live) < rf:
            self.under.add(b)
            needy.append((len(live), b, live))
        elif len(live) > rf and not self.inflight.get(b):
            for extra in sorted(live, key=lambda x: -x.used_bytes)[:len(live) - rf]:
                self._delete(b, [extra])

    def _maybe_orphan(self, b: str, live: list[Node], now: float) -> None:
        self.under.discard(b)
        self.lost.discard(b)
        if not live:
            self.unreferenced_since.pop(b, None)
            return
        first = self.unreferenced_since.setdefault(b, self.allocated.get(b, now))
        if now - first >= self.s.orphan_grace_s:
            self.unreferenced_since.pop(b, None)
            self._delete(b, live)
        else:
            self.check.add(b)  # look again later (cheap: one index lookup per tick)

    def _delete(self, b: str, nodes: list[Node]) -> None:
        for n in nodes:
            pending = self.commands.setdefault(n.node_id, [])
            last = pending[-1] if pending else None
            if isinstance(last, DeleteCommand) and len(last.blob_ids) < DELETE_BATCH:
                last.blob_ids.append(b)  # one command deletes many blobs
            else:
                pending.append(DeleteCommand(op="delete", blob_ids=[b]))
            self._drop(b, n.node_id)
            self.deleted += 1
        self.check.discard(b)

    def _plan_copies(self, needy: list[tuple[int, str, list[Node]]], now: float) -> int:
        busy: dict[str, int] = {}
        for targets in self.inflight.values():
            for t, (src, _) in targets.items():
                busy[t] = busy.get(t, 0) + 1
                busy[src] = busy.get(src, 0) + 1
        cap = self.s.max_copies_per_node
        planned = 0
        candidates = sorted(self.live(now, strict=True), key=lambda n: n.used_bytes)
        for count, b, live in needy:
            want = self.s.replication_factor - count - len(self.inflight.get(b, {}))
            holding = {n.node_id for n in live} | set(self.inflight.get(b, {}))
            for _ in range(max(0, want)):
                src = min((n for n in live if busy.get(n.node_id, 0) < cap),
                          key=lambda n: busy.get(n.node_id, 0), default=None)
                dst = next((n for n in candidates if n.node_id not in holding
                            and busy.get(n.node_id, 0) < cap), None)
                if src is None or dst is None:
                    self.check.add(b)  # no capacity now: try again next tick
                    break
                token = sign(self.key, "replicate", [b], now + COPY_TIMEOUT_S)
                self._send(src.node_id, ReplicateCommand(op="replicate", blob_id=b,
                                                         target=dst.address, token=token))
                self.inflight.setdefault(b, {})[dst.node_id] = (src.node_id,
                                                                now + COPY_TIMEOUT_S)
                holding.add(dst.node_id)
                busy[src.node_id] = busy.get(src.node_id, 0) + 1
                busy[dst.node_id] = busy.get(dst.node_id, 0) + 1
                planned += 1
        return planned

    def info(self) -> dict[str, Any]:
        now = self.clock.now()
        nodes = [{"node_id": n.node_id, "address": n.address, "state": self.state(n, now),
                  "last_beat_secs_ago": round(now - n.last_beat, 3),
                  "capacity_bytes": n.capacity_bytes, "used_bytes": n.used_bytes,
                  "free_bytes": n.free_bytes, "blob_count": n.blob_count}
                 for n in sorted(self.nodes.values(), key=lambda n: n.node_id)]
        return {"nodes": nodes, "replication_factor": self.s.replication_factor,
                "write_quorum": self.s.quorum, "under_replicated": len(self.under),
                "lost": len(self.lost),
                "copies_in_flight": sum(len(t) for t in self.inflight.values()),
                "blobs": len(self.holders)}
