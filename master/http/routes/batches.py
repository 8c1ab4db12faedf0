"""Batch routes: create a batch (members and a callback), its progress, its members'
results, list and delete (``master/tasks/batches.py``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from squall.common.wire.models import NAME_PATTERN, BatchRequest
from squall.master.http.answers import JSON
from squall.master.http.deps import MasterDep, ReadMasterDep
from squall.master.http.routes.tasks import GroupP

BatchP = Annotated[str, Path(description="batch id", pattern=NAME_PATTERN)]


async def create_batch(group: GroupP, body: BatchRequest, m: MasterDep) -> JSON:
    """Enqueue a batch: its members (queues of the group) and a callback, enqueued in the
    same WAL record as the last member's dequeue. Role: producer."""
    return JSON(await m.create_batch(group, body, answer_when_durable=True))


async def get_batch(group: GroupP, batch: BatchP, m: ReadMasterDep) -> JSON:
    """A batch's progress: members total, done and failed, and its state. 404 once its
    callback is done (the batch is gone then)."""
    return JSON(m.batch_info(group, batch))


async def list_batches(group: GroupP, m: ReadMasterDep,
                       after: Annotated[str | None, Query(max_length=128)] = None,
                       limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> JSON:
    """The group's batches (open, done with their callback not yet done, failed), by id."""
    return JSON(m.list_batches(group, after, limit))


async def batch_results(group: GroupP, batch: BatchP, m: ReadMasterDep,
                        after: Annotated[str | None, Query(max_length=4096)] = None,
                        limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> JSON:
    """The results the batch's members returned with their dequeue, by queue and pid."""
    return JSON(m.batch_results(group, batch, after, limit))


async def delete_batch(group: GroupP, batch: BatchP, m: MasterDep) -> JSON:
    """Forget a batch and its results (its members stay queued; their dequeues then count
    nothing). Role: producer."""
    return JSON(await m.delete_batch(group, batch))
