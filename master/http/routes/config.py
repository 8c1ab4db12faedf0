"""Policy and schedule routes: persisted configuration of queues and groups."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from squall.common.errors import NotFound
from squall.common.wire.models import NAME_PATTERN, Policy, Schedule
from squall.master.http.answers import JSON
from squall.master.http.deps import MasterDep, ReadMasterDep
from squall.master.http.routes.tasks import GroupP, QueueP
from squall.master.tasks.admin import describe_schedule

NameP = Annotated[str, Path(description="schedule name", pattern=NAME_PATTERN)]


async def get_group_policy(group: GroupP, m: ReadMasterDep) -> JSON:
    """The group's default policy (fields a queue's own policy does not set)."""
    return JSON(m.index.policies.get((group, ""), Policy().model_dump()))


async def put_group_policy(group: GroupP, body: Policy, m: MasterDep) -> JSON:
    """Set the group's default policy."""
    return JSON((await m.set_policy(group, "", body))["policy"])


async def get_policy(group: GroupP, queue: QueueP, m: ReadMasterDep) -> JSON:
    """The queue's effective policy: its own fields, else the group's."""
    from squall.master.tasks.policies import effective

    return JSON({**Policy().model_dump(), **effective(m.index, group, queue)})


async def put_policy(group: GroupP, queue: QueueP, body: Policy, m: MasterDep) -> JSON:
    """Set the queue's policy (max attempts and dead-letter queue, retry backoff, default
    lease length). It persists while the queue is empty or deleted."""
    return JSON((await m.set_policy(group, queue, body))["policy"])


async def delete_policy(group: GroupP, queue: QueueP, m: MasterDep) -> JSON:
    """Remove the queue's own policy (the group's default applies)."""
    await m.set_policy(group, queue, None)
    return JSON(Policy().model_dump())


async def list_schedules(group: GroupP, m: ReadMasterDep) -> JSON:
    """The group's recurring schedules."""
    items = [describe_schedule(n, s) for (g, n), s in sorted(m.index.schedules.items())
             if g == group]
    return JSON({"schedules": items})


async def put_schedule(group: GroupP, name: NameP, body: Schedule, m: MasterDep) -> JSON:
    """Create or replace a schedule. It first fires at the next slot start."""
    return JSON((await m.set_schedule(group, name, body))["schedule"])


async def get_schedule(group: GroupP, name: NameP, m: ReadMasterDep) -> JSON:
    s = m.index.schedules.get((group, name))
    if s is None:
        raise NotFound(f"schedule {name!r} does not exist in group {group!r}")
    return JSON(describe_schedule(name, s))


async def delete_schedule(group: GroupP, name: NameP, m: MasterDep) -> JSON:
    """Delete a schedule (tasks it already enqueued stay)."""
    return JSON(await m.set_schedule(group, name, None))
