"""Task semantics: turn a request into WAL ops (a plan), all or nothing.

Planning reads the index inside the write transaction that will apply the plan, through a
small overlay holding what earlier items of the same request changed, so an update such as
"dequeue X from A, enqueue X into B" sees its own effects. Any invalid item raises before
anything is applied; the transaction then aborts and nothing is logged.

Leases: a lease sets the task LEASED with a new token from one global sequence (tokens are
never reused, so a token from a dequeued-and-requeued task can never match). The holder of
the current token may renew, release or dequeue; an expired lease keeps its token valid
until someone else leases the task. The sweeper (:meth:`Engine.sweep`) moves due timers
(expired leases, delays that ended) to ``ready``; it runs before every lease and in the
background, so an expired task is hidden for at most one sweep interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import lmdb

from squall.common.clock import Clock
from squall.common.errors import BadRequest, LeaseLost, NotFound
from squall.common.models import (
    EnqueueItem,
    LeaseRequest,
    ReleaseItem,
    RenewItem,
    TaskRef,
    TaskSpec,
    UpdateRequest,
)
from squall.common.names import check_name, check_pid, join_queue
from squall.master.index import (
    AVAILABLE,
    DELAYED,
    LEASED,
    STATE_NAMES,
    Index,
    Op,
    QueueRec,
    Task,
    apply,
    pidkey,
)

AUTO_PID_DIGITS = 20


def ms(t: float) -> int:
    return int(t * 1000)


@dataclass
class Plan:
    """Ops to log and apply, plus what to answer once they are durable."""

    ops: list[Op] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)


class _View:
    """The index as seen by one request: committed state plus this request's own changes."""

    def __init__(self, engine: Engine, txn: lmdb.Transaction, group: str) -> None:
        self.e, self.txn, self.group = engine, txn, check_name("group", group)
        self.tasks: dict[tuple[int, bytes], Task | None] = {}
        self.new_queues: dict[str, QueueRec] = {}
        self.ops: list[Op] = []
        self.lease_seq = engine.index.lease_seq
        self.auto_pid = engine.index.auto_pid

    def queue(self, name: str, create: bool = False) -> QueueRec | None:
        check_name("queue", name)
        q = self.e.index.queues.get((self.group, name)) or self.new_queues.get(name)
        if q is None and create:
            qid = self.e.index.next_qid + len(self.new_queues)
            q = QueueRec(self.group, name, qid)
            self.new_queues[name] = q
            self.ops.append(("Q", self.group, name, qid, self.e.now_ms()))
        return q

    def task(self, q: QueueRec, pid: bytes) -> Task | None:
        key = (q.qid, pid)
        if key in self.tasks:
            return self.tasks[key]
        if q.name in self.new_queues:
            return None
        return self.e.index.get_task(self.txn, q, pid)

    def put(self, q: QueueRec, t: Task, *, enqueue: bool) -> None:
        self.tasks[(q.qid, t.pid.encode())] = t
        self.ops.append(("P", q.qid, q.gen, t.to_wire(), enqueue))

    def delete(self, q: QueueRec, pid: str) -> None:
        self.tasks[(q.qid, pid.encode())] = None
        self.ops.append(("D", q.qid, q.gen, pid, True))

    def finish(self) -> list[Op]:
        idx = self.e.index
        if self.lease_seq != idx.lease_seq or self.auto_pid != idx.auto_pid:
            self.ops.append(("M", self.lease_seq, self.auto_pid))
        return self.ops


class Engine:
    def __init__(self, index: Index, clock: Clock) -> None:
        self.index = index
        self.clock = clock

    def now_ms(self) -> int:
        return ms(self.clock.now())

    # -- update (enqueue / dequeue / renew / release, atomically) ------------------------
    def plan_update(self, txn: lmdb.Transaction, group: str, req: UpdateRequest) -> Plan:
        v = _View(self, txn, group)
        now = self.now_ms()
        for d in req.dequeue:
            q, t = self._held(v, d)
            v.delete(q, t.pid)
        renewed = [self._renew(v, r, now) for r in req.renew]
        for r in req.release:
            self._release(v, r, now)
        enqueued = [self._enqueue(v, e.queue, e, now) for e in req.enqueue]
        plan = Plan(v.finish())
        plan.result = {"enqueued": enqueued, "dequeued": len(req.dequeue),
                       "renewed": renewed, "released": len(req.release)}
        return plan

    def plan_enqueue(self, txn: lmdb.Transaction, group: str, queue: str,
                     tasks: list[TaskSpec]) -> Plan:
        v = _View(self, txn, group)
        now = self.now_ms()
        enqueued = [self._enqueue(v, queue, s, now) for s in tasks]
        return Plan(v.finish(), {"enqueued": enqueued})

    def _enqueue(self, v: _View, queue: str, s: TaskSpec | EnqueueItem, now: int
                 ) -> dict[str, Any]:
        q = v.queue(queue, create=True)
        assert q is not None
        if s.pid is None:
            v.auto_pid = max(now * 1000, v.auto_pid + 1)
            pid = f"{v.auto_pid:0{AUTO_PID_DIGITS}d}"
        else:
            pid = s.pid
        raw = check_pid(pid)
        if v.task(q, raw) is not None:
            return {"queue": queue, "pid": pid, "collapsed": True}
        if s.not_before is not None and s.delay_secs is not None:
            raise BadRequest(f"task {pid!r}: give not_before or delay_secs, not both")
        nb = ms(s.not_before) if s.not_before is not None else now + ms(s.delay_secs or 0)
        t = Task(pid, DELAYED if nb > now else AVAILABLE, not_before_ms=nb if nb > now else 0,
                 enqueued_ms=now,
                 payload=s.payload.model_dump() if s.payload is not None else None)
        v.put(q, t, enqueue=True)
        return {"queue": queue, "pid": pid, "collapsed": False}

    def _held(self, v: _View, ref: TaskRef) -> tuple[QueueRec, Task]:
        """The task `ref` names, checked to be held by the caller's lease token."""
        where = f"task {ref.pid!r} in queue {join_queue(v.group, ref.queue)}"
        q = v.queue(ref.queue)
        t = v.task(q, check_pid(ref.pid)) if q is not None else None
        if t is None:
            raise NotFound(f"{where} does not exist (already dequeued, or never enqueued)")
        if t.token == 0:
            raise LeaseLost(f"{where} is not leased; lease it before acting on it.",
                            {"queue": ref.queue, "pid": ref.pid, "token": ref.token})
        if t.token != ref.token:
            raise LeaseLost(
                f"{where}: lease token {ref.token} is stale; the task was leased again since "
                f"(current token {t.token}). Another worker owns it now: drop this result.",
                {"queue": ref.queue, "pid": ref.pid, "token": ref.token},
            )
        if not t.live:
            raise LeaseLost(
                f"{where}: lease token {ref.token} was given up (released or reset); "
                "lease the task again to work on it.",
                {"queue": ref.queue, "pid": ref.pid, "token": ref.token},
            )
        return q, t

    def _renew(self, v: _View, r: RenewItem, now: int) -> dict[str, Any]:
        q, t = self._held(v, r)
        t = Task(**{k: getattr(t, k) for k in Task.__slots__})
        t.state, t.expiry_ms, t.not_before_ms = LEASED, now + ms(r.lease_secs), 0
        v.put(q, t, enqueue=False)
        return {"queue": r.queue, "pid": r.pid, "expires_at": t.expiry_ms / 1000}

    def _release(self, v: _View, r: ReleaseItem, now: int) -> None:
        q, t = self._held(v, r)
        t = Task(**{k: getattr(t, k) for k in Task.__slots__})
        t.live, t.expiry_ms = False, 0
        if r.delay_secs > 0:
            t.state, t.not_before_ms = DELAYED, now + ms(r.delay_secs)
        else:
            t.state, t.not_before_ms = AVAILABLE, 0
        v.put(q, t, enqueue=False)

    # -- lease ---------------------------------------------------------------------------
    def plan_lease(self, txn: lmdb.Transaction, group: str, queue: str, req: LeaseRequest,
                   worker_addr: str) -> Plan:
        v = _View(self, txn, group)
        q = v.queue(queue)
        if q is None:
            return Plan([], {"tasks": []})
        now = self.now_ms()
        max_key = pidkey(check_pid(req.max_pid)) if req.max_pid is not None else None
        expiry = now + ms(req.lease_secs)
        leased = []
        for pk in list(self.index.iter_ready(txn, q, max_key, req.max_tasks)):
            raw = txn.get(q.qid.to_bytes(4, "big") + q.gen.to_bytes(4, "big") + pk,
                          db=self.index.tasks)
            assert raw is not None, "ready index points at a missing task"
            t = Task.unpack(raw)
            v.lease_seq += 1
            t.state, t.token, t.live, t.expiry_ms = LEASED, v.lease_seq, True, expiry
            t.attempts += 1
            t.leased_ms, t.worker, t.worker_addr = now, req.worker, worker_addr
            v.put(q, t, enqueue=False)
            leased.append({"queue": queue, "pid": t.pid, "token": t.token,
                           "expires_at": expiry / 1000, "attempts": t.attempts,
                           "enqueued_at": t.enqueued_ms / 1000, "payload": t.payload})
        return Plan(v.finish(), {"tasks": leased})

    # -- apply and sweep -----------------------------------------------------------------
    def apply(self, txn: lmdb.Transaction, ops: list[Op], ticket: int) -> None:
        apply(self.index, txn, ops, ticket)

    def sweep(self, txn: lmdb.Transaction, limit: int) -> int:
        """Make due timers ready: expired leases (token stays valid) and ended delays."""
        idx = self.index
        due = idx.due_timers(txn, self.now_ms(), limit)
        touched: dict[int, QueueRec] = {}
        for qid, gen, pk in due:
            q = idx.by_qid.get(qid)
            pre = qid.to_bytes(4, "big") + gen.to_bytes(4, "big")
            raw = txn.get(pre + pk, db=idx.tasks) if q is not None and q.gen == gen else None
            if raw is None:  # a deleted queue generation: drop the stale timer
                continue
            t = Task.unpack(raw)
            t.state, t.expiry_ms, t.not_before_ms = AVAILABLE, 0, 0
            idx.put_task(txn, q, t, enqueue=False)  # type: ignore[arg-type]
            touched[qid] = q  # type: ignore[assignment]
        for q in touched.values():
            idx.save_queue(txn, q)
        return len(due)

    # -- reads ---------------------------------------------------------------------------
    def task_info(self, txn: lmdb.Transaction, group: str, queue: str, pid: str
                  ) -> dict[str, Any]:
        q = self.index.queues.get((check_name("group", group), check_name("queue", queue)))
        t = self.index.get_task(txn, q, check_pid(pid)) if q is not None else None
        if t is None:
            raise NotFound(f"task {pid!r} is not in queue {join_queue(group, queue)} "
                           "(done, deleted, or never enqueued)")
        now = self.now_ms()
        state = t.state
        if state != AVAILABLE and t.due_ms() <= now:
            state = AVAILABLE
        return {
            "queue": queue, "pid": t.pid, "state": STATE_NAMES[state], "attempts": t.attempts,
            "enqueued_at": t.enqueued_ms / 1000,
            "expires_at": t.expiry_ms / 1000 if state == LEASED else None,
            "not_before": t.not_before_ms / 1000 if state == DELAYED else None,
            "worker": t.worker if state == LEASED else None,
            "worker_addr": t.worker_addr if state == LEASED else None,
            "payload": t.payload,
        }
