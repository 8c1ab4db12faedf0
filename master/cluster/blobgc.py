"""What the master does with a blob once it looked at it (``Cluster.tick``): a referenced
blob is noted lost or under-replicated (repair copies it) or trimmed back to the
replication factor; an unreferenced one is deleted everywhere after its orphan grace; a
freed one (its last task went) at once. Deletes ride on the nodes' next heartbeat answers,
many blobs per command."""

from __future__ import annotations

from typing import TYPE_CHECKING

from squall.common.wire.cluster import DeleteCommand

if TYPE_CHECKING:
    from squall.master.cluster.nodes import Node
    from squall.master.cluster.state import Cluster

DELETE_BATCH = 1000


def free(c: Cluster, freed: list[str], now: float) -> None:
    """Delete every copy of blobs whose last reference went away (no orphan grace)."""
    if not freed:
        return
    freed = list(dict.fromkeys(freed))
    alive = c.not_dead(now)
    for b, ref in zip(freed, c.referenced(freed), strict=True):
        if not ref:
            c.under.discard(b)
            c.lost.discard(b)
            c.repair.forget(b)
            delete(c, b, c.live_holders(b, alive=alive))


def enqueued(c: Cluster, blob_ids: list[str]) -> None:
    """Blobs a durable enqueue just referenced, their holders recorded from its write
    receipts: examined now, not by a later tick slice. The enqueue proves them referenced,
    so the slice's index read per blob (on the busiest path, a put) is not needed. The
    caller passes only the blobs of a durable enqueue: a refused one's stay queued, and,
    unreferenced, are examined as orphans."""
    alive: dict[str, Node] | None = None
    for b in blob_ids:
        if b in c.check:
            if alive is None:
                alive = c.not_dead(c.clock.now())
            c.check.discard(b)
            examine(c, b, c.live_holders(b, alive=alive))


def examine(c: Cluster, b: str, live: list[Node]) -> None:
    """A referenced blob: note it lost or under-replicated, or trim extra copies."""
    rf = c.s.replication_factor
    c.unreferenced_since.pop(b, None)
    c.lost.discard(b)
    c.under.discard(b)
    # a draining node's copy is a source for copies, but does not count toward RF
    counting = [n for n in live if n.node_id not in c.draining]
    if not live:
        c.lost.add(b)
        c.repair.forget(b)
    elif len(counting) < rf:
        if len(live) < rf:
            c.under.add(b)  # a draining node's copy still exists: not under RF
        c.repair.want(b, len(counting))
    else:
        c.repair.forget(b)
        if len(counting) > rf and not c.inflight.get(b):
            trim(c, b, counting, rf)


def trim(c: Cluster, b: str, counting: list[Node], rf: int) -> None:
    """Delete copies above `rf`, only while `rf` proven copies stay: unproven claims (a
    node's own report, e.g. a fake node's) go first, and a proven copy only above `rf`
    proven ones."""
    proven = {n.node_id for n in counting} & c.verified.get(b, set())
    if len(proven) < rf:
        return
    extras = sorted(counting, key=lambda x: (x.node_id in proven, -x.used_bytes))
    for extra in extras[:len(counting) - rf]:
        if extra.node_id in proven:
            if len(proven) <= rf:
                break
            proven.discard(extra.node_id)
        delete(c, b, [extra])


def maybe_orphan(c: Cluster, b: str, live: list[Node], now: float) -> None:
    c.under.discard(b)
    c.lost.discard(b)
    c.repair.forget(b)
    if not live:
        c.unreferenced_since.pop(b, None)
        return
    first = c.unreferenced_since.setdefault(b, c.allocated.get(b, now))
    if now - first >= c.s.orphan_grace_s:
        c.unreferenced_since.pop(b, None)
        delete(c, b, live)
    else:
        c.later.add(b)  # look again in a second (one index lookup)


def delete(c: Cluster, b: str, nodes: list[Node]) -> None:
    for n in nodes:
        pending = c.commands.setdefault(n.node_id, [])
        last = pending[-1] if pending else None
        if isinstance(last, DeleteCommand) and len(last.blob_ids) < DELETE_BATCH:
            last.blob_ids.append(b)  # one command deletes many blobs
        else:
            pending.append(DeleteCommand(op="delete", blob_ids=[b]))
        c._drop(b, n.node_id)
        c.deleted += 1
    c.check.discard(b)
