"""The parallel put: tasks enqueued *pending* while their payloads are being stored, and
the records that settle them (docs/decisions/0028-parallel-put.md).

A data node's front door sends a request's enqueues to the master while it stores and
replicates their payloads. The master logs each task with state ``PENDING``: in the task
table and counted in its queue's ``pending``, never in ``ready``, never leased; its timer
(``expiry_ms``) is the deadline by which the node's confirmation is expected. Its stored
payload reference names the replicas the node writes to, the node, and the enqueue's
idempotency key (both dropped when it is confirmed).

Every change is a WAL record in a group, like any other (decision 0024):

- **confirm**: the node's next grouped commit carries the write receipts of the request's
  payloads; the task is put again as ``AVAILABLE`` (or ``DELAYED`` until its
  ``not_before``) with the verified reference. A "P" op: the new record of the task.
- **abandon**: the node could not store a payload on its write quorum; it asks for the
  request's pending tasks to be removed before it answers the refusal (refused means not
  applied). A "D" op (not completed), and the idempotency key, if any, cleared ("K" with
  an expiry of 0: absent at once).
- **settle** (the master's housekeeping): a task still pending at its deadline (the node
  died, or its confirmation was lost) is decided from what the data nodes report holding
  (:func:`decide`): confirmed once the payload is on its write quorum, removed when it can
  no longer be (it was never acknowledged), else looked at again later.

A confirmation or removal that finds the task no longer pending with that blob (settled
already, cancelled, its queue deleted, or the pid re-enqueued since) changes nothing.
An enqueue (or idempotency key) that meets a pending task of the same pid is refused with
503 until the task is settled: answered as "collapsed" it could be removed afterwards and
the resend's put would be lost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import lmdb

from squall.common.errors import Unavailable
from squall.common.wire.models import PayloadRef
from squall.common.wire.names import check_pid
from squall.master.storage.records import AVAILABLE, DELAYED, PENDING
from squall.master.tasks.view import Plan, View

if TYPE_CHECKING:
    from squall.master.cluster.state import Cluster
    from squall.master.tasks.engine import Engine

RECHECK_MS = 1000  # a pending task past its deadline that cannot be decided yet: again then
UNSETTLED_MAX = 10_000  # pending tasks past their deadline waiting for housekeeping
W_STATE, W_EXPIRY, W_NOT_BEFORE, W_PAYLOAD = 1, 4, 5, 11
PENDING_FIELDS = ("blob_id", "size", "crc32c", "replicas")


@dataclass(frozen=True)
class Settle:
    """One pending task to settle: `stored` is the reference to keep (confirm), None to
    remove it; `blob_id` must still be the task's."""

    queue: str
    pid: str
    blob_id: str
    stored: dict[str, Any] | Callable[[], dict[str, Any]] | None


def busy(queue: str, pid: str) -> Unavailable:
    return Unavailable(f"task {pid!r} of queue {queue!r} is being enqueued by another request "
                       "whose payload is not confirmed yet; retry shortly", retry_after=1)


def pending_wire(pid: str, payload: PayloadRef, extra: dict[str, Any], deadline_ms: int,
                 not_before_ms: int, now: int) -> list[Any]:
    """A pending task's wire list (see Task.to_wire)."""
    stored = {"blob_id": payload.blob_id, "size": payload.size, "crc32c": payload.crc32c,
              **extra}
    return [pid, PENDING, 0, False, deadline_ms, not_before_ms, 0, now, 0, "", "", stored,
            "", ""]


def public(payload: dict[str, Any] | None) -> dict[str, Any] | None:
    """A pending task's payload reference as readers see it (without node and key)."""
    if payload is None or "node" not in payload:
        return payload
    return {k: payload[k] for k in PENDING_FIELDS if k in payload}


def plan_settle(engine: Engine, txn: lmdb.Transaction, group: str, items: list[Settle]
                ) -> Plan:
    """Confirm or remove pending tasks (each item on its own: one that is no longer
    pending changes nothing). A `stored` callable is called only for a task that is still
    pending with that blob (it checks receipts)."""
    v = View(engine, txn, group)
    now = engine.now_ms()
    confirmed = removed = 0
    per_queue: dict[str, int] = {}
    for it in items:
        q = v.queue(it.queue)
        raw = check_pid(it.pid)
        w = v.wire(q, raw) if q is not None else None
        if (q is None or w is None or w[W_STATE] != PENDING or not w[W_PAYLOAD]
                or w[W_PAYLOAD].get("blob_id") != it.blob_id):
            continue
        stored = it.stored() if callable(it.stored) else it.stored
        per_queue[it.queue] = per_queue.get(it.queue, 0) + 1
        if stored is None:
            v.delete(q, it.pid, completed=False)
            key = w[W_PAYLOAD].get("key")
            if key:  # the key may be used again: this enqueue was never acknowledged
                v.plan.ops.append(("K", group, key, it.queue, it.pid, 0))
            removed += 1
            continue
        nw = list(w)
        nb = w[W_NOT_BEFORE]
        nw[W_STATE], nw[W_EXPIRY] = (DELAYED, 0) if nb > now else (AVAILABLE, 0)
        nw[W_NOT_BEFORE] = nb if nb > now else 0
        nw[W_PAYLOAD] = stored
        v.put_wire(q, raw, nw, enqueue=False)
        confirmed += 1
    return v.finish({"confirmed": confirmed, "removed": removed, "queues": per_queue})


def decide(cluster: Cluster, payload: dict[str, Any], enqueued_ms: int, now: float
           ) -> dict[str, Any] | Literal[False] | None:
    """What to do with a task pending past its deadline, from what the data nodes report
    holding (their heartbeats' block reports): the reference to confirm it with (the
    payload is on its write quorum), None to remove it (fewer nodes than the write quorum
    can hold it: the put was never acknowledged), or False to look again later.

    A replica *lacks* the blob when it is alive, sent a full report since this master
    started, and beat at least one heartbeat interval after the task was logged without
    listing it; *unknown* when it is suspect or has not reported yet; *dead* when
    declared dead. With every replica decided, a live holder and the rest dead, the task
    is confirmed: a dead node's copy is lost like any other, and repair copies the blob
    from its live holders (the client of a put whose node died before answering sees an
    unknown outcome, and its resend collapses into the task)."""
    s = cluster.s
    blob = payload["blob_id"]
    holding = cluster.holders.get(blob, set())
    by_addr = {n.address.rstrip("/"): n for n in cluster.nodes.values()}
    have: dict[str, str] = {}
    unknown = dead = 0
    after = enqueued_ms / 1000 + s.heartbeat_interval_s
    for a in payload.get("replicas", ()):
        n = by_addr.get(str(a).rstrip("/"))
        if n is None:
            unknown += 1
            continue
        state = cluster.state(n, now)
        if n.node_id in holding and state != "dead":
            have[n.node_id] = n.address
        elif state == "dead":
            dead += 1
        elif not (state == "alive" and n.reported_full and n.last_beat >= after):
            unknown += 1
    for i in holding:  # a copy repair made meanwhile counts too
        n = cluster.nodes.get(i)
        if n is not None and i not in have and cluster.state(n, now) != "dead":
            have[i] = n.address
    ref = {"blob_id": blob, "size": payload["size"], "crc32c": payload["crc32c"],
           "replicas": list(have.values())}
    if len(have) >= s.quorum:
        return ref
    if len(have) + unknown + dead < s.quorum:
        return None
    if unknown == 0 and have:
        return ref
    return False
