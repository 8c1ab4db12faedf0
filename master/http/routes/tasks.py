"""Task routes: the atomic update, enqueue, lease, and task lookup.

The writes are answered once durable in the WAL (``answer_when_durable``); the reads wait
for the index commit of every answered write first (``ReadMasterDep``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query, Request

from squall.common.server.guard import PRINCIPAL
from squall.common.wire.models import (
    NAME_PATTERN,
    EnqueueRequest,
    LeaseRequest,
    UpdateRequest,
)
from squall.master.http.answers import JSON
from squall.master.http.deps import MasterDep, ReadMasterDep, client_addr
from squall.master.http.routes.traced import traced_enqueue, traced_lease, traced_update
from squall.master.security import check_update

GroupP = Annotated[str, Path(description="consistency group", pattern=NAME_PATTERN)]
QueueP = Annotated[str, Path(description="queue name", pattern=NAME_PATTERN)]


async def update(group: GroupP, body: UpdateRequest, m: MasterDep, request: Request) -> JSON:
    """Apply enqueues, dequeues (acks), renewals and releases on queues of one group,
    all or nothing, in the order dequeue, renew, release, enqueue; then, with `lease`,
    lease the next tasks of a queue of the group in the same atomic update. Enqueues need
    the producer role, the others the consumer role."""
    check_update(request.scope.get(PRINCIPAL), bool(body.enqueue),
                 bool(body.dequeue or body.renew or body.release or body.lease))
    if m.spans.tracer is not None:
        return JSON(await traced_update(m, group, body, client_addr(request)))
    return JSON(await m.update(group, body, client_addr(request), answer_when_durable=True))


async def enqueue(group: GroupP, queue: QueueP, body: EnqueueRequest, m: MasterDep) -> JSON:
    """Enqueue a batch of tasks into one queue (a pid already queued collapses)."""
    if m.spans.tracer is not None:
        return JSON(await traced_enqueue(m, group, queue, body))
    return JSON(await m.enqueue(group, queue, body.tasks, answer_when_durable=True))


async def lease(group: GroupP, queue: QueueP, body: LeaseRequest, m: MasterDep,
                request: Request) -> JSON:
    """Lease up to `max_tasks` available tasks, smallest pid first, for `lease_secs`."""
    if m.spans.tracer is not None:
        return JSON(await traced_lease(m, group, queue, body, client_addr(request)))
    return JSON(await m.lease(group, queue, body, client_addr(request),
                                answer_when_durable=True))


async def task_info(group: GroupP, queue: QueueP, pid: str, m: ReadMasterDep) -> JSON:
    """Look up one task by pid: state, attempts, lease holder, payload reference."""
    return JSON(m.task_info(group, queue, pid))


async def cancel_task(group: GroupP, queue: QueueP, pid: str, m: MasterDep) -> JSON:
    """Cancel a queued task (available or delayed) by pid without leasing it. A task under
    a live lease is refused with 409. Role: admin."""
    return JSON(await m.cancel(group, queue, pid))


async def list_tasks(group: GroupP, queue: QueueP, m: ReadMasterDep,
                     after: Annotated[str | None, Query(max_length=1024)] = None,
                     limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> JSON:
    """A queue's tasks in pid order, a page at a time (pass `next` back as `after`)."""
    return JSON(m.list_tasks(group, queue, after, limit))
