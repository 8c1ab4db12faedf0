"""Queue routes: list, statistics, delete, reset leases, dead-letter redrive, cluster totals."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Query

from squall.common.errors import BadRequest, NotFound
from squall.common.wire.models import (
    PauseRequest,
    RedriveRequest,
    RetryRequest,
)
from squall.common.wire.names import join_queue, split_queue
from squall.master.http.answers import JSON
from squall.master.http.deps import MasterDep, ReadMasterDep
from squall.master.http.routes.tasks import GroupP, QueueP
from squall.master.storage.records import QueueRec

MAX_LIST = 10_000
MAX_REGEX = 256


def safe_regex(pattern: str) -> Any:
    """`pattern` compiled with RE2, which matches in time linear in the text (no
    backtracking: `(a+)+$` or `(.*.*)*X` cannot stall the event loop), in bounded memory."""
    import re2

    opts = re2.Options()
    opts.log_errors = False
    opts.max_mem = 1 << 20
    try:
        return re2.compile(pattern, options=opts)
    except re2.error as e:
        msg = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
        raise BadRequest(f"invalid regex {pattern[:MAX_REGEX]!r} (RE2 syntax): {msg}") from None
QPATH = "/v1/groups/{group}/queues/{queue}"


def counts(q: QueueRec) -> dict[str, Any]:
    return {"group": q.group, "queue": q.name, "available": q.available, "leased": q.leased,
            "delayed": q.delayed, "pending": q.pending, "total": q.size,
            "completed": q.completed, "enqueued_total": q.enqueued_total}


async def queue_stats(group: GroupP, queue: QueueP, m: ReadMasterDep) -> JSON:
    """A queue's exact counts by state and completion counter (these survive restarts),
    plus soft-state rates, mean lease time, oldest available age and a leased sample."""
    q = m.queue(group, queue)
    if q is None:
        raise NotFound(f"queue {join_queue(group, queue)} does not exist (it has never held "
                       "a task)")
    return JSON({**counts(q), **m.queue_details(q), **m.flow_details(q)})


async def get_pause(group: GroupP, queue: QueueP, m: ReadMasterDep) -> JSON:
    """Whether the queue, or keys in it, are paused."""
    return JSON(m.pause_state(group, queue))


async def pause(group: GroupP, queue: QueueP, body: PauseRequest, m: MasterDep) -> JSON:
    """Pause the queue, or one key in it (`key`): leases skip its tasks, enqueues go on.
    Persisted (it survives restarts); idempotent."""
    res = await m.pause(group, queue, body.key, True)
    return JSON({"paused": res["paused"], "paused_keys": res["paused_keys"]})


async def resume(group: GroupP, queue: QueueP, body: PauseRequest, m: MasterDep) -> JSON:
    """Resume the queue, or one key in it (`key`); idempotent."""
    res = await m.pause(group, queue, body.key, False)
    return JSON({"paused": res["paused"], "paused_keys": res["paused_keys"]})


async def delete_queue(group: GroupP, queue: QueueP, m: MasterDep) -> JSON:
    """Delete a queue and all its tasks at once (O(1)); storage is reclaimed in the
    background. A queue of the same name starts empty."""
    return JSON(await m.delete_queue(group, queue))


async def reset_leases(group: GroupP, queue: QueueP, m: MasterDep) -> JSON:
    """Make every leased task of the queue available now; every token issued so far
    becomes stale."""
    return JSON(await m.reset_leases(group, queue))


async def retry(group: GroupP, queue: QueueP, body: RetryRequest, m: MasterDep) -> JSON:
    """Retry one task now: a dead letter of this (dead-letter) queue goes back into the
    queue it failed in, attempts reset; a delayed task becomes available now. 409 for a
    leased or available task, 404 for none."""
    return JSON(await m.retry(group, queue, body.pid))


async def redrive(group: GroupP, queue: QueueP, body: RedriveRequest, m: MasterDep) -> JSON:
    """Move up to `max_tasks` dead letters of this queue back into it (attempts reset)."""
    return JSON(await m.redrive(group, queue, body.max_tasks))


async def list_queues(
    m: ReadMasterDep,
    regex: Annotated[str | None, Query(max_length=MAX_REGEX, description="search in group#name "
                                       "(RE2 syntax: linear time, no backreferences)")] = None,
    group: Annotated[str | None, Query(max_length=128)] = None,
    min_tasks: Annotated[int, Query(ge=0)] = 1,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST)] = 1000,
    after: Annotated[str | None, Query(max_length=300, description="group#name to start "
                                       "after (the `next` of the previous page)")] = None,
) -> JSON:
    """Queues sorted by group then name, filtered by regex, group and minimum size.
    Queues are ephemeral: with the default min_tasks=1 only queues holding tasks show."""
    rx = safe_regex(regex) if regex else None
    lo: tuple[str, str] | None = split_queue(after) if after else None
    if group is not None and (lo is None or lo < (group, "")):
        lo = (group, "")
    keys = m.index.queues.irange(minimum=lo, inclusive=(after is None, False))
    out: list[dict[str, Any]] = []
    nxt = None
    for g, n in keys:
        if group is not None and g != group:
            break
        q = m.index.queues[(g, n)]
        if q.size >= min_tasks and (rx is None or rx.search(join_queue(g, n))):
            if len(out) >= limit:
                nxt = join_queue(out[-1]["group"], out[-1]["queue"])
                break
            out.append(counts(q))
    return JSON({"queues": out, "next": nxt})


async def cluster_stats(m: ReadMasterDep) -> JSON:
    """Totals over every queue: kept as the queues change (O(1), whatever their number);
    paused and blocked over the queues with flow state (O(their keys))."""
    t = m.index.totals
    paused, blocked = m.flow_totals()
    return JSON({
        "queues": t.holding, "paused": paused, "blocked": blocked,
        "available": t.available, "leased": t.leased,
        "delayed": t.delayed, "pending": t.pending, "completed": t.completed,
        "rates": m.meters.total.snapshot(m.clock.now()), "wal_ticket": m.wal.last_ticket,
    })
