"""Queue routes: list queues and one queue's statistics."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Query

from squall.common.errors import BadRequest, NotFound
from squall.common.models import QueueList, QueueStats
from squall.common.names import join_queue
from squall.master.deps import MasterDep
from squall.master.http import ERROR_RESPONSES, JSON
from squall.master.index import QueueRec
from squall.master.routes.tasks import GroupP, QueueP

router = APIRouter(tags=["queues"], responses=ERROR_RESPONSES)
MAX_LIST = 10_000


def stats(q: QueueRec) -> dict[str, Any]:
    return {"group": q.group, "queue": q.name, "available": q.available, "leased": q.leased,
            "delayed": q.delayed, "total": q.size, "completed": q.completed,
            "enqueued_total": q.enqueued_total}


@router.get("/v1/groups/{group}/queues/{queue}", response_model=QueueStats)
async def queue_stats(group: GroupP, queue: QueueP, m: MasterDep) -> JSON:
    """Counts of a queue's tasks by state (exact), and its completion counter."""
    q = m.queue(group, queue)
    if q is None:
        raise NotFound(f"queue {join_queue(group, queue)} does not exist (it has never held "
                       "a task)")
    return JSON(stats(q))


@router.get("/v1/queues", response_model=QueueList)
async def list_queues(
    m: MasterDep,
    regex: Annotated[str | None, Query(max_length=256, description="search in group#name")] = None,
    group: Annotated[str | None, Query(max_length=128)] = None,
    min_tasks: Annotated[int, Query(ge=0)] = 1,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 1000,
) -> JSON:
    """Queues sorted by group then name, filtered by regex, group and minimum size."""
    try:
        rx = re.compile(regex) if regex else None
    except re.error as e:
        raise BadRequest(f"invalid regex {regex!r}: {e}") from None
    out = []
    for (g, n), q in sorted(m.index.queues.items()):
        if (group is None or g == group) and q.size >= min_tasks and (
                rx is None or rx.search(join_queue(g, n))):
            out.append(stats(q))
            if len(out) >= limit:
                break
    return JSON({"queues": out})
