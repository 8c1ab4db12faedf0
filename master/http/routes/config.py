"""Policy and schedule routes: persisted configuration of queues and groups."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path

from squall.common.errors import NotFound
from squall.common.wire.models import NAME_PATTERN, Policy, Schedule, ScheduleInfo, ScheduleList
from squall.master.http.answers import ERROR_RESPONSES, JSON
from squall.master.http.deps import MasterDep, ReadMasterDep
from squall.master.http.routes.tasks import GroupP, QueueP
from squall.master.tasks.admin import describe_schedule

router = APIRouter(prefix="/v1/groups/{group}", tags=["config"], responses=ERROR_RESPONSES)
NameP = Annotated[str, Path(description="schedule name", pattern=NAME_PATTERN)]


@router.get("/policy", response_model=Policy)
async def get_group_policy(group: GroupP, m: ReadMasterDep) -> JSON:
    """The group's default policy (fields a queue's own policy does not set)."""
    return JSON(m.index.policies.get((group, ""), Policy().model_dump()))


@router.put("/policy", response_model=Policy)
async def put_group_policy(group: GroupP, body: Policy, m: MasterDep) -> JSON:
    """Set the group's default policy."""
    return JSON((await m.set_policy(group, "", body))["policy"])


@router.get("/queues/{queue}/policy", response_model=Policy)
async def get_policy(group: GroupP, queue: QueueP, m: ReadMasterDep) -> JSON:
    """The queue's effective policy: its own fields, else the group's."""
    from squall.master.tasks.policies import effective

    return JSON({**Policy().model_dump(), **effective(m.index, group, queue)})


@router.put("/queues/{queue}/policy", response_model=Policy)
async def put_policy(group: GroupP, queue: QueueP, body: Policy, m: MasterDep) -> JSON:
    """Set the queue's policy (max attempts and dead-letter queue, retry backoff, default
    lease length). It persists while the queue is empty or deleted."""
    return JSON((await m.set_policy(group, queue, body))["policy"])


@router.delete("/queues/{queue}/policy", response_model=Policy)
async def delete_policy(group: GroupP, queue: QueueP, m: MasterDep) -> JSON:
    """Remove the queue's own policy (the group's default applies)."""
    await m.set_policy(group, queue, None)
    return JSON(Policy().model_dump())


@router.get("/schedules", response_model=ScheduleList)
async def list_schedules(group: GroupP, m: ReadMasterDep) -> JSON:
    """The group's recurring schedules."""
    items = [describe_schedule(n, s) for (g, n), s in sorted(m.index.schedules.items())
             if g == group]
    return JSON({"schedules": items})


@router.put("/schedules/{name}", response_model=ScheduleInfo)
async def put_schedule(group: GroupP, name: NameP, body: Schedule, m: MasterDep) -> JSON:
    """Create or replace a schedule. It first fires at the next slot start."""
    return JSON((await m.set_schedule(group, name, body))["schedule"])


@router.get("/schedules/{name}", response_model=ScheduleInfo)
async def get_schedule(group: GroupP, name: NameP, m: ReadMasterDep) -> JSON:
    s = m.index.schedules.get((group, name))
    if s is None:
        raise NotFound(f"schedule {name!r} does not exist in group {group!r}")
    return JSON(describe_schedule(name, s))


@router.delete("/schedules/{name}")
async def delete_schedule(group: GroupP, name: NameP, m: MasterDep) -> JSON:
    """Delete a schedule (tasks it already enqueued stay)."""
    return JSON(await m.set_schedule(group, name, None))
