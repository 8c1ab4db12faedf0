"""Decommissioning data nodes (HDFS's model) and forgetting them.

States a data node shows (``state`` in ``GET /v1/cluster`` and ``GET /v1/nodes/{id}``):
``alive`` / ``suspect`` / ``dead`` from its heartbeats (also in ``health``), and, once an
operator asked to decommission it:

- ``draining``: it gets no new blobs, its copies do not count toward the replication
  factor, so the repair in ``master/cluster/state.py`` copies every blob it holds to other nodes
  (node to node, fewest copies first, within the per-node repair budgets of
  ``master/cluster/repair.py``). It keeps serving reads meanwhile. ``decommission.blobs_remaining``
  counts its blobs that tasks still reference (or that were allocated recently and may still be
  committed) and that do not yet have RF live copies on other, non-draining nodes; of those,
  ``uploads_uncommitted`` are allocated uploads no task refers to yet: nothing to copy, so
  the drain waits for their enqueue or for the end of their orphan grace, at most
  ``uncommitted_wait_secs`` more.
- ``decommissioned``: that count reached zero after a full block report from the node
  (a master that just restarted knows nothing about a node until its full report, so it
  can never declare a node empty by ignorance). Stopping it loses no replica.

The request is persisted (a ``("C", "N", "", node_id, mark)`` WAL op, see
``master/storage/ops.py``), so a master restart resumes it; ``decommissioned`` is derived from
the block map each time, never stored. Cancelling (recommission) clears the mark; the
node then takes new blobs again and its extra copies are trimmed.

Forgetting removes a node from the table (and clears its mark). It is refused for a node
that is alive and not decommissioned. A forgotten node that heartbeats again rejoins as a
new node; whatever it still holds is then an extra copy and is trimmed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from squall.common.errors import Conflict, NotFound

if TYPE_CHECKING:
    from squall.master.cluster.nodes import Node
    from squall.master.cluster.state import Cluster

DRAINING, DECOMMISSIONED = "draining", "decommissioned"
REFERENCED_BATCH = 10_000


def state_of(c: Cluster, n: Node, health: str) -> str:
    if n.node_id not in c.draining:
        return health
    if n.reported_full and n.drain_remaining == 0:
        return DECOMMISSIONED
    return "dead" if health == "dead" else DRAINING


def progress(c: Cluster, n: Node | None, node_id: str = "") -> dict[str, Any] | None:
    since = c.draining.get(n.node_id if n else node_id)
    if since is None:
        return None
    known = n is not None and n.reported_full and n.drain_remaining >= 0
    waiting = n.drain_uncommitted if known and n else 0
    return {"requested_at": since,
            "blobs_remaining": n.drain_remaining if known and n else None,
            "uploads_uncommitted": waiting,
            "uncommitted_wait_secs": round(max(0.0, n.drain_uncommitted_until
                                               - c.clock.now()), 1) if waiting and n else None}


def update(c: Cluster, now: float) -> None:
    """Recount every draining node's blobs still short of RF elsewhere, and queue them for
    repair (so a copy that failed or timed out is planned again)."""
    rf = c.s.replication_factor
    for node_id in list(c.draining):
        n = c.nodes.get(node_id)
        if n is None:
            continue
        if not n.reported_full:
            n.drain_remaining = -1
            continue
        short = []
        for b in n.blobs:
            others = sum(1 for h in c.holders.get(b, ()) if h not in c.draining
                         and h in c.nodes and c.state(c.nodes[h], now) != "dead")
            if others < rf:
                short.append(b)
        remaining = uncommitted = 0
        until = 0.0
        for i in range(0, len(short), REFERENCED_BATCH):
            batch = short[i:i + REFERENCED_BATCH]
            for b, ref in zip(batch, c.referenced(batch), strict=True):
                if ref:
                    remaining += 1
                    c.check.add(b)
                elif b in c.allocated:
                    # uploaded and not (yet) enqueued: nothing to copy until a task refers
                    # to it; waited for until its orphan grace ends, and said so
                    remaining += 1
                    uncommitted += 1
                    until = max(until, c.allocated[b] + c.s.orphan_grace_s)
        n.drain_remaining = remaining
        n.drain_uncommitted, n.drain_uncommitted_until = uncommitted, until


def describe(c: Cluster, node_id: str) -> dict[str, Any]:
    n = c.nodes.get(node_id)
    if n is not None:
        return c.describe(n, c.clock.now())
    if node_id in c.draining:  # marked, but not heard from since the master started
        return {"node_id": node_id, "address": "", "state": DRAINING, "health": "unknown",
                "last_beat_secs_ago": None, "capacity_bytes": 0, "used_bytes": 0,
                "free_bytes": 0, "blob_count": 0, "decommission": progress(c, None, node_id)}
    raise NotFound(f"data node {node_id!r} is not in the master's node table")


def check_known(c: Cluster, node_id: str) -> None:
    if node_id not in c.nodes and node_id not in c.draining:
        raise NotFound(f"data node {node_id!r} is not in the master's node table "
                       "(`squall nodes` lists them)")


def check_room(c: Cluster, node_id: str) -> None:
    """Refuse a decommission that could never finish: the other nodes that take blobs must
    be able to hold the replication factor."""
    rf = c.s.replication_factor
    others = [n for n in c.live(strict=True) if n.node_id != node_id]
    if len(others) < rf:
        raise Conflict(f"cannot decommission data node {node_id!r}: {len(others)} other data "
                       f"node(s) alive and in service, the replication factor is {rf}; add a "
                       "data node first")


def start(c: Cluster, node_id: str, since: float) -> None:
    """The node is marked draining: every blob it holds is examined again."""
    c.draining[node_id] = since
    n = c.nodes.get(node_id)
    if n is not None:
        n.drain_remaining = -1
        c.check.update(n.blobs)
    c.drain_checked_at = 0.0


def cancel(c: Cluster, node_id: str) -> None:
    """The mark is gone: the node takes blobs again; extra copies get trimmed."""
    c.draining.pop(node_id, None)
    n = c.nodes.get(node_id)
    if n is not None:
        n.drain_remaining = -1
        c.check.update(n.blobs)


def check_forget(c: Cluster, node_id: str) -> None:
    check_known(c, node_id)
    n = c.nodes.get(node_id)
    if n is None:
        return
    now = c.clock.now()
    health = c.state(n, now)
    if health != "dead" and state_of(c, n, health) != DECOMMISSIONED:
        what = ("still draining: wait for `decommissioned` (`squall nodes decommission "
                f"{node_id} --wait`)" if node_id in c.draining else
                f"{health} and not decommissioned: decommission it first (`squall nodes "
                f"decommission {node_id} --wait`) or stop it and wait until it is dead")
        raise Conflict(f"data node {node_id!r} is {what}; forgetting it now could drop "
                       "replicas below the replication factor")


def forget(c: Cluster, node_id: str) -> None:
    """Remove the node from the table, the block map and the copy plans."""
    c.draining.pop(node_id, None)
    n = c.nodes.pop(node_id, None)
    c.commands.pop(node_id, None)
    c.delivered_deletes.pop(node_id, None)
    if n is not None:
        for b in list(n.blobs):
            c._drop(b, node_id)
    c.check.update(c.repair.abandon(node_id))  # copies from or to it are replanned
