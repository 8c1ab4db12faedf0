"""Planning of the queue-management verbs: delete, reset leases, redrive dead letters,
policies, schedules (and firing them), and paging through a queue's tasks.

Like :mod:`squall.master.tasks.engine`, every function here returns a :class:`Plan` built inside
the write transaction that applies it; nothing changes unless the whole plan is valid.
"""

from __future__ import annotations

from typing import Any

import lmdb

from squall.common.errors import BadRequest, Conflict, NotFound
from squall.common.wire.models import Policy, Schedule, TaskSpec
from squall.common.wire.names import check_name, check_pid, join_queue
from squall.master.storage.records import (
    AVAILABLE,
    DELAYED,
    LEASED,
    STATE_NAMES,
    QueueRec,
    Task,
    pidkey,
    qprefix,
)
from squall.master.tasks import batches, policies, schedules
from squall.master.tasks.engine import Engine
from squall.master.tasks.view import Plan, View

MAX_SCHEDULES_PER_TICK = 1000


def _queue(e: Engine, group: str, queue: str) -> QueueRec:
    q = e.index.queues.get((check_name("group", group), check_name("queue", queue)))
    if q is None:
        raise NotFound(f"queue {join_queue(group, queue)} does not exist")
    return q


def plan_delete(e: Engine, group: str, queue: str) -> Plan:
    """O(1): a new generation hides every task at once; the old one is reaped later."""
    q = _queue(e, group, queue)
    p = Plan([("G", q.qid, q.gen + 1, e.now_ms())])
    p.result = {"deleted": q.size}
    return p


def plan_reset(e: Engine, group: str, queue: str) -> Plan:
    q = _queue(e, group, queue)
    return Plan([("R", q.qid, q.gen)], {"reset": q.leased})


def _task(v: View, group: str, queue: str, pid: str) -> tuple[QueueRec, Task, bytes, str]:
    """The queue and the task of `pid` (NotFound when either is gone), the pid's key, and
    how messages name the task."""
    q = v.queue(check_name("queue", queue))
    raw = check_pid(pid)
    t = v.task(q, raw) if q is not None else None
    where = f"task {pid!r} in queue {join_queue(group, queue)}"
    if q is None or t is None:
        raise NotFound(f"{where} does not exist (done, deleted, or never enqueued)")
    return q, t, raw, where


def plan_cancel(e: Engine, txn: lmdb.Transaction, group: str, queue: str, pid: str) -> Plan:
    """Remove one queued task (available or delayed) by pid without leasing it; a task under
    a live lease is refused (its holder would otherwise finish work nobody tracks)."""
    v = View(e, txn, group)
    q, t, _, where = _task(v, group, queue, pid)
    if t.state == LEASED and t.expiry_ms > e.now_ms():
        raise Conflict(f"{where} is leased (by {t.worker or 'a worker'}) until its lease "
                       "expires: it cannot be cancelled now. Release it with its lease token, "
                       "reset the queue's leases, or cancel it after the lease ends.")
    state = "available" if t.state == LEASED else STATE_NAMES[t.state]
    v.delete(q, t.pid, completed=False)
    if t.ext and "b" in t.ext:  # a batch member: counted failed (batches.py)
        batches.failed(v, t)
    v.plan.events[(q.group, q.name, "cancel")] += 1
    return v.finish({"cancelled": t.pid, "state": state})


def plan_retry(e: Engine, txn: lmdb.Transaction, group: str, queue: str, pid: str) -> Plan:
    """Retry one task now: a dead letter (a task of a dead-letter queue with its origin)
    goes back into the queue it failed in, attempts reset; a delayed task (a delay or a
    retry backoff) becomes available now. A leased or available task is refused (409)."""
    v = View(e, txn, group)
    q, t, raw, where = _task(v, group, queue, pid)
    if t.origin and t.origin != q.name:  # a dead letter
        target = v.queue(t.origin, create=True)
        assert target is not None
        v.delete(q, t.pid, completed=False)
        if v.task(target, raw) is None:  # else a task of that pid is queued there already
            v.put(target, Task(t.pid, enqueued_ms=t.enqueued_ms, payload=t.payload,
                               token=t.token), enqueue=True)
        return v.finish({"retried": t.pid, "queue": join_queue(group, t.origin),
                         "was": "dead letter"})
    if t.state == DELAYED:
        d = t.copy()
        d.state, d.not_before_ms = AVAILABLE, 0
        v.put(q, d, enqueue=False)
        return v.finish({"retried": t.pid, "queue": join_queue(group, queue), "was": "delayed"})
    what = f"leased (by {t.worker or 'a worker'})" if t.state == LEASED else "available"
    raise Conflict(f"{where} is {what}: there is nothing to retry (a dead letter or a "
                   "delayed task can be retried)")


def plan_redrive(e: Engine, txn: lmdb.Transaction, group: str, queue: str, max_tasks: int
                 ) -> Plan:
    """Move up to `max_tasks` available dead letters of `queue` back into it, attempts 0.
    A queue that does not exist and has no dead-letter queue is a 404 (a typo must not
    create an empty queue and report success)."""
    v = View(e, txn, group)
    src_name = policies.dead_letter_queue(policies.effective(e.index, group, queue), queue)
    src = v.queue(src_name)
    if v.queue(queue) is None and src is None:
        raise NotFound(f"queue {join_queue(group, queue)} does not exist, nor its dead-letter "
                       f"queue {join_queue(group, src_name)}: nothing to redrive")
    target = v.queue(queue, create=True)
    assert target is not None
    moved = 0
    if src is not None:
        pre = qprefix(src.qid, src.gen)
        for pk in list(e.index.iter_ready(txn, src, None, max_tasks * 4)):
            if moved >= max_tasks:
                break
            t = e.index.read_task(txn, pre + pk)
            if t.origin and t.origin != queue:
                continue  # a shared dead-letter queue: leave other queues' tasks
            v.delete(src, t.pid, completed=False)
            if v.task(target, t.pid.encode()) is None:
                back = Task(t.pid, enqueued_ms=t.enqueued_ms, payload=t.payload,
                            token=t.token, key=t.key)
                v.put(target, back, enqueue=True)
            moved += 1
    return v.finish({"moved": moved, "source": join_queue(group, src_name)})


def plan_policy(e: Engine, group: str, queue: str, policy: Policy | None) -> Plan:
    """Set (or clear, with None) a queue's policy; queue "" is the group's default."""
    check_name("group", group)
    if queue:
        check_name("queue", queue)
    value = None
    if policy is not None:
        if policy.dead_letter_queue is not None and policy.dead_letter_queue == queue:
            raise BadRequest("a queue cannot be its own dead-letter queue")
        value = policy.model_dump()
    return Plan([("C", "P", group, queue, value)], {"policy": value})


PAUSED_KEYS_MAX = 1000


def plan_pause(e: Engine, group: str, queue: str, key: str | None, paused: bool) -> Plan:
    """Pause or resume a queue (`key` None) or one key of it: one ("C", "F", ...) op."""
    check_name("group", group)
    check_name("queue", queue)
    if key is not None:
        check_name("key", key)
    old = e.index.pauses.get((group, queue)) or {}
    whole, keys = bool(old.get("paused")), list(old.get("keys") or ())
    if key is None:
        whole = paused
    elif paused and key not in keys:
        if len(keys) >= PAUSED_KEYS_MAX:
            raise BadRequest(f"queue {join_queue(group, queue)} has {len(keys)} paused keys, "
                             "the limit: resume some, or pause the queue")
        keys.append(key)
    elif not paused and key in keys:
        keys.remove(key)
    value = {"paused": whole, "keys": sorted(keys)} if whole or keys else None
    if value == (old or None):
        return Plan([], describe_pause(value))
    return Plan([("C", "F", group, queue, value)], describe_pause(value))


def describe_pause(value: dict[str, Any] | None) -> dict[str, Any]:
    value = value or {}
    return {"paused": bool(value.get("paused")), "paused_keys": list(value.get("keys") or ())}


def plan_schedule(e: Engine, group: str, name: str, s: Schedule | None) -> Plan:
    """Create, replace (keeping its last slot) or delete (None) a schedule."""
    check_name("group", group)
    check_name("schedule", name)
    if s is None:
        if (group, name) not in e.index.schedules:
            raise NotFound(f"schedule {name!r} does not exist in group {group!r}")
        return Plan([("C", "S", group, name, None)], {"deleted": True})
    if (s.interval_secs is None) == (s.cron is None):
        raise BadRequest("a schedule needs exactly one of interval_secs or cron")
    if s.cron is not None:
        schedules.check_cron(s.cron)
    check_pid(schedules.slot_pid(name, 0))
    value = s.model_dump(mode="json")
    value["payload"] = e.store_payload(s.payload) if s.payload is not None else None
    old = e.index.schedules.get((group, name))
    value["last_slot_ms"] = (old["last_slot_ms"] if old and _same_timing(old, value) else
                             schedules.slot_at_or_before(value, e.now_ms()))
    return Plan([("C", "S", group, name, value)], {"schedule": describe_schedule(name, value)})


def _same_timing(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("interval_secs") == b.get("interval_secs") and a.get("cron") == b.get("cron")


def describe_schedule(name: str, s: dict[str, Any]) -> dict[str, Any]:
    out = {k: s.get(k) for k in ("queue", "interval_secs", "cron", "payload", "catch_up")}
    out["name"] = name
    out["last_slot"] = s["last_slot_ms"] / 1000
    out["next_slot"] = schedules.next_slot(s, int(s["last_slot_ms"])) / 1000
    return out


def due_schedules(e: Engine) -> list[tuple[str, str]]:
    now = e.now_ms()
    out = []
    for key, s in e.index.schedules.items():
        if schedules.next_slot(s, int(s["last_slot_ms"])) <= now:
            out.append(key)
            if len(out) >= MAX_SCHEDULES_PER_TICK:
                break
    return out


def plan_fire(e: Engine, txn: lmdb.Transaction, group: str, name: str) -> Plan:
    """Enqueue the due slots of one schedule and record the last one, in one record."""
    s = e.index.schedules.get((group, name))
    if s is None:
        return Plan()
    v = View(e, txn, group)
    now = e.now_ms()
    slots = schedules.due_slots(s, now)
    fired = []
    for slot in slots:
        spec = TaskSpec(pid=schedules.slot_pid(name, slot))
        fired.append(e.enqueue(v, s["queue"], spec, now, stored_payload=s.get("payload")))
    if slots:
        v.plan.ops.append(("C", "S", group, name, {**s, "last_slot_ms": slots[-1]}))
    return v.finish({"enqueued": fired})


def list_tasks(e: Engine, txn: lmdb.Transaction, group: str, queue: str, after: str | None,
               limit: int) -> dict[str, Any]:
    q = _queue(e, group, queue)
    start = pidkey(check_pid(after)) if after else b""
    tasks = [e.describe(q, t) for t in e.index.iter_tasks(txn, q, start, limit)]
    nxt = tasks[-1]["pid"] if len(tasks) == limit else None
    return {"tasks": tasks, "next": nxt}
