"""Model-based test of the master: a Hypothesis state machine drives a real `Master`
(ManualClock, private event loop) and a small in-memory model side by side.

After every step the master must agree with the model: per-queue counters, the ready
index in pid order, every task record (state, token, live flag, attempts, due time),
`task_info`, and the global token / FIFO-pid high-water marks. Crash rules stop the master
the way kill -9 would (no sync, no close) and reopen it from the same directory; the
"power loss" variant also rolls the LMDB index back to the copy taken at the last
checkpoint, so recovery has to replay the WAL onto an older index. Either way the
recovered state must equal the acknowledged state exactly.

Model semantics (docs/concepts.md, tasks/engine.py): tokens come from one global sequence; attempts
counts leases; an expired lease keeps its token valid until someone else leases the task;
release gives the token up; FIFO pids sort after every earlier FIFO pid; an update applies
dequeue, renew, release, enqueue in that order, all or nothing.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from squall.common.errors import (
    BadRequest,
    LeaseLost,
    NotFound,
    PayloadTooLarge,
    StatusError,
)
from squall.common.wire.models import (
    EnqueueItem,
    LeaseRequest,
    Policy,
    ReleaseItem,
    RenewItem,
    TaskRef,
    TaskSpec,
    UpdateRequest,
)
from squall.common.wire.names import PID_MAX_BYTES
from squall.master.storage.records import AVAILABLE, DELAYED, LEASED, STATE_NAMES, Task, pidkey
from squall.master.tasks.engine import AUTO_PID_DIGITS, ms
from tests.crashkit import InProcessMaster, dump_index
from tests.helpers import FAKE_TOKEN, forge_token, lease_seq

G = "g"
QUEUES = ("a", "b")
MAX_ATTEMPTS = 2  # the policy of queue "a": dead letters after 2 leases, into "a.dead"
DLQ = "a.dead"
CHECKED = (*QUEUES, DLQ)
LONG1 = "x" * 460 + "1"  # > 448 bytes: stored under a cut + hashed key
LONG2 = "x" * 460 + "2"
PIDS = ("a", "ab", "b", "c0", "é", LONG1, LONG2)
FORGED = 10**9  # added to a token's number to make one that was never issued

queue_st = st.sampled_from(QUEUES)
pid_st = st.sampled_from([None, None, *PIDS])  # None: FIFO
timing_st = st.sampled_from([
    None, None, None, ("delay", 0.0), ("delay", 0.0004), ("delay", 1.5), ("delay", 10.0),
    ("nb", -5.0), ("nb", 0.0), ("nb", 20.0), ("both", 5.0),
])
lease_secs_st = st.sampled_from([1.0, 10.0, 60.0])
release_delay_st = st.sampled_from([None, None, 0.0, 0.0004, 2.0, 30.0])
error_st = st.sampled_from([None, None, "boom"])
handle_st = st.integers(0, 10**6)


def wire_ms(secs: float) -> int:
    """A wire time (float seconds) back to the integer ms it was made from."""
    return round(secs * 1000)


def reason(why: str, error: str | None) -> str:
    """A dead letter's reason: the last error's first line, why, the error's other lines."""
    if not error:
        return why
    lines = error.split("\n")
    return "\n".join([lines[0], why, *lines[1:]])


def key(pid: str) -> bytes:
    return pidkey(pid.encode())


# -- the model ------------------------------------------------------------------------------
@dataclass
class MTask:
    pid: str
    state: int  # raw state, as stored: LEASED / DELAYED stay so until a sweep runs
    due: int = 0  # expiry (LEASED) or not_before (DELAYED), ms
    token: int = 0
    live: bool = False
    attempts: int = 0
    enqueued_ms: int = 0
    worker: str = ""
    error: str = ""


@dataclass
class MQueue:
    tasks: dict[str, MTask] = field(default_factory=dict)
    completed: int = 0
    enqueued_total: int = 0

    def counts(self) -> tuple[int, int, int]:
        states = [t.state for t in self.tasks.values()]
        return states.count(AVAILABLE), states.count(LEASED), states.count(DELAYED)


@dataclass
class Model:
    queues: dict[str, MQueue] = field(default_factory=dict)
    lease_seq: int = 0
    auto_pid: int = 0
    issued: set[str] = field(default_factory=set)  # wire tokens the master answered

    def fence(self, token: str) -> int:
        """The fencing number of a wire token, 0 for one the master never issued (the
        model cannot seal; it knows which tokens it was given)."""
        return lease_seq(token) if token in self.issued else 0

    def sweep(self, now: int) -> None:
        for q in self.queues.values():
            for t in q.tasks.values():
                if t.state != AVAILABLE and t.due <= now:
                    if t.state == LEASED:
                        t.error = "lease expired"
                    t.state, t.due = AVAILABLE, 0

    def held(self, queue: str, pid: str, token: str) -> tuple[MQueue, MTask]:
        q = self.queues.get(queue)
        t = q.tasks.get(pid) if q is not None else None
        if q is None or t is None:
            raise NotFound("gone")
        if t.token != self.fence(token) or not t.live:
            raise LeaseLost("stale")
        return q, t

    def dequeue(self, queue: str, pid: str, token: str) -> None:
        q, _ = self.held(queue, pid, token)
        del q.tasks[pid]
        q.completed += 1

    def renew(self, queue: str, pid: str, token: str, lease_secs: float, now: int) -> int:
        _, t = self.held(queue, pid, token)
        t.state, t.due = LEASED, now + ms(lease_secs)
        return t.due

    def dead_letter(self, queue: str, t: MTask, reason: str) -> None:
        del self.queues[queue].tasks[t.pid]
        dlq = self.queues.setdefault(DLQ, MQueue())
        if t.pid not in dlq.tasks:
            dlq.enqueued_total += 1
        dlq.tasks[t.pid] = MTask(t.pid, AVAILABLE, 0, t.token, False, t.attempts,
                                 t.enqueued_ms, t.worker, reason)

    def release(self, queue: str, pid: str, token: str, delay: float | None,
                error: str | None, now: int) -> None:
        _, t = self.held(queue, pid, token)
        t.live = False
        if error is not None:  # queue "a" dead-letters; no backoff policy anywhere
            t.error = error
            if queue == "a" and t.attempts >= MAX_ATTEMPTS:
                t.state, t.due = AVAILABLE, 0
                self.dead_letter(queue, t, reason(f"dead-lettered: failed {t.attempts} times "
                                                  f"(max_attempts {MAX_ATTEMPTS})", error))
                return
        if delay is not None and ms(delay) > 0:
            t.state, t.due = DELAYED, now + ms(delay)
        else:
            t.state, t.due = AVAILABLE, 0

    def enqueue(self, queue: str, spec: TaskSpec, now: int) -> tuple[str, bool]:
        q = self.queues.setdefault(queue, MQueue())
        if spec.pid is None:
            self.auto_pid = max(now * 1000, self.auto_pid + 1)
            pid = f"{self.auto_pid:0{AUTO_PID_DIGITS}d}"
        else:
            pid = spec.pid
        if len(pid.encode()) > PID_MAX_BYTES:
            raise PayloadTooLarge("pid too long")
        if "\x00" in pid:
            raise BadRequest("NUL in pid")
        if spec.not_before is not None and spec.delay_secs is not None:
            raise BadRequest("both")  # even when the pid would collapse
        if pid in q.tasks:
            return pid, True
        nb = ms(spec.not_before) if spec.not_before is not None else now + ms(spec.delay_secs or 0)
        delayed = nb > now
        q.tasks[pid] = MTask(pid, DELAYED if delayed else AVAILABLE, nb if delayed else 0,
                             enqueued_ms=now)
        q.enqueued_total += 1
        return pid, False

    def update(self, req: UpdateRequest, now: int) -> dict[str, Any]:
        for d in req.dequeue:
            self.dequeue(d.queue, d.pid, d.token)
        renewed = [(r.queue, r.pid, self.renew(r.queue, r.pid, r.token, r.lease_secs, now))
                   for r in req.renew]
        for r in req.release:
            self.release(r.queue, r.pid, r.token, r.delay_secs, r.error, now)
        enqueued = [(e.queue, *self.enqueue(e.queue, e, now)) for e in req.enqueue]
        return {"enqueued": enqueued, "renewed": renewed, "dequeued": len(req.dequeue),
                "released": len(req.release)}

    def lease(self, queue: str, req: LeaseRequest, now: int) -> list[tuple[str, int, int, int]]:
        if req.max_pid is not None and "\x00" in req.max_pid:
            raise BadRequest("NUL in max_pid")
        self.sweep(now)
        q = self.queues.get(queue)
        if q is None:
            return []
        ready = sorted((t for t in q.tasks.values() if t.state == AVAILABLE),
                       key=lambda t: key(t.pid))
        if req.max_pid is not None:
            ready = [t for t in ready if key(t.pid) <= key(req.max_pid)]
        out: list[tuple[str, int, int, int]] = []
        scan = req.max_tasks * (4 if queue == "a" else 1)
        for t in ready[:scan]:
            if len(out) >= req.max_tasks:
                break
            if queue == "a" and t.attempts >= MAX_ATTEMPTS:
                self.dead_letter(queue, t, reason(f"dead-lettered: leased {t.attempts} times "
                                                  "without being dequeued (max_attempts "
                                                  f"{MAX_ATTEMPTS})", t.error))
                continue
            self.lease_seq += 1
            t.state, t.token, t.live = LEASED, self.lease_seq, True
            t.due, t.attempts, t.worker = now + ms(req.lease_secs), t.attempts + 1, req.worker
            out.append((t.pid, t.token, t.attempts, t.due))
        return out

    def delete(self, queue: str) -> int:
        if queue not in self.queues:
            raise NotFound("no such queue")
        n = len(self.queues[queue].tasks)
        self.queues[queue] = MQueue()  # a new generation: empty, counters from zero
        return n

    def reset(self, queue: str) -> None:
        if queue not in self.queues:
            raise NotFound("no such queue")
        for t in self.queues[queue].tasks.values():
            if t.live or t.state == LEASED:  # swept since its lease expired or not: alike
                t.state, t.due, t.live, t.error = AVAILABLE, 0, False, "lease reset"


# -- the machine ----------------------------------------------------------------------------
class MasterMachine(InProcessMaster, RuleBasedStateMachine):
    def __init__(self) -> None:
        # small segments, so checkpoints really drop WAL files
        super().__init__("squall-model-", segment_bytes=1024)
        self.run(self.m.set_policy(G, "a", Policy(max_attempts=MAX_ATTEMPTS)))
        self.model = Model()
        self.handles: list[tuple[str, str, str]] = []  # every lease ever granted
        self.auto_pids: list[str] = []

    def teardown(self) -> None:
        self.close()

    # -- helpers ---------------------------------------------------------------------------
    def now(self) -> int:
        return ms(self.clock.now())

    def both(self, model_step: Callable[[Model], Any],
             master_step: Callable[[], Coroutine[Any, Any, dict[str, Any]]]
             ) -> tuple[Any, dict[str, Any] | None, bool]:
        """Run one request on a copy of the model and on the master. The model's error
        (or success) is what the master must do; the copy replaces the model on success."""
        trial = copy.deepcopy(self.model)
        try:
            expected = model_step(trial)
        except StatusError as e:
            event(f"rejected: {type(e).__name__}")
            try:
                got = self.loop.run_until_complete(master_step())
            except StatusError as e2:
                assert type(e2) is type(e), f"expected {type(e).__name__}, got {e2!r}"
                assert e2.status == e.status and e2.message
                return None, None, False
            raise AssertionError(
                f"expected {type(e).__name__}, master answered {got}") from None
        got = self.loop.run_until_complete(master_step())
        changed = trial != self.model
        event("accepted, changed" if changed else "accepted, no change")
        self.model = trial
        return expected, got, changed

    def handle(self, i: int, forge: bool = False) -> tuple[str, str, str]:
        queue, pid, token = self.handles[i % len(self.handles)]
        if not forge:
            return queue, pid, token
        # a guessed number under a real mac, or the real number under a forged mac
        return queue, pid, (forge_token(token, lease_seq(token) + FORGED) if i % 2
                            else forge_token(token, flip=True))

    def spec(self, pid: str | None, timing: tuple[str, float] | None) -> dict[str, Any]:
        if timing is None:
            return {"pid": pid}
        kind, v = timing
        if kind == "delay":
            return {"pid": pid, "delay_secs": v}
        if kind == "nb":
            return {"pid": pid, "not_before": self.clock.now() + v}
        return {"pid": pid, "delay_secs": v, "not_before": self.clock.now() + v}

    def note_enqueued(self, enqueued: list[dict[str, Any]]) -> None:
        for e in enqueued:
            if e["pid"] not in PIDS and not e["collapsed"]:
                if self.auto_pids:  # FIFO: after every earlier automatic pid
                    assert e["pid"] > self.auto_pids[-1]
                self.auto_pids.append(e["pid"])

    # -- rules: requests -------------------------------------------------------------------
    @rule(queue=queue_st, items=st.lists(st.tuples(pid_st, timing_st), min_size=1, max_size=3))
    def enqueue(self, queue: str, items: list[tuple[str | None, Any]]) -> None:
        specs = [TaskSpec(**self.spec(p, t)) for p, t in items]
        now = self.now()
        expected, got, changed = self.both(
            lambda mdl: [mdl.enqueue(queue, s, now) for s in specs],
            lambda: self.m.enqueue(G, queue, specs))
        if got is None:
            return
        assert [(e["pid"], e["collapsed"]) for e in got["enqueued"]] == expected
        assert (got["ticket"] > 0) == changed
        self.note_enqueued(got["enqueued"])

    @rule(queue=queue_st, k=st.integers(1, 4), max_pid=st.sampled_from([None, None, "0", *PIDS]),
          lease_secs=lease_secs_st, worker=st.sampled_from(["w1", "w2"]))
    def lease(self, queue: str, k: int, max_pid: str | None, lease_secs: float,
              worker: str) -> None:
        now = self.now()
        q = self.model.queues.get(queue)
        validly_leased = {p for p, t in (q.tasks.items() if q else ())
                          if t.state == LEASED and t.due > now}
        req = LeaseRequest(max_tasks=k, lease_secs=lease_secs, max_pid=max_pid, worker=worker)
        expected, got, _ = self.both(lambda mdl: mdl.lease(queue, req, now),
                                     lambda: self.m.lease(G, queue, req, "10.0.0.1"))
        assert got is not None
        tasks = got["tasks"]
        assert [(t["pid"], lease_seq(t["token"]), t["attempts"], wire_ms(t["expires_at"]))
                for t in tasks] == expected
        self.model.issued.update(t["token"] for t in tasks)
        # invariant 3: a task under a valid lease is never leased again
        assert not validly_leased & {t["pid"] for t in tasks}
        # smallest pids first, none above max_pid
        keys = [key(t["pid"]) for t in tasks]
        assert keys == sorted(keys)
        if max_pid is not None:
            assert all(kk <= key(max_pid) for kk in keys)
        # logged iff something changed: tasks leased, or exhausted ones dead-lettered
        dead_lettered = set(q.tasks if q else ()) - set(self.model.queues[queue].tasks
                                                         if queue in self.model.queues else ())
        assert (got["ticket"] > 0) == bool(tasks or dead_lettered)
        event(f"leased {min(len(tasks), 2)}+ tasks")
        self.handles.extend((queue, t["pid"], t["token"]) for t in tasks)

    @rule(queue=queue_st)
    def lease_with_bad_max_pid(self, queue: str) -> None:
        """Rejected before anything happens: no sweep, no lease, counters untouched."""
        req = LeaseRequest(max_pid="a\x00b")
        now = self.now()
        _, got, _ = self.both(lambda mdl: mdl.lease(queue, req, now),
                              lambda: self.m.lease(G, queue, req, ""))
        assert got is None

    @precondition(lambda self: self.handles)
    @rule(i=handle_st, lease_secs=lease_secs_st, forge=st.booleans())
    def renew(self, i: int, lease_secs: float, forge: bool) -> None:
        queue, pid, token = self.handle(i, forge)
        now = self.now()
        req = UpdateRequest(renew=[RenewItem(queue=queue, pid=pid, token=token,
                                             lease_secs=lease_secs)])
        expected, got, _ = self.both(lambda mdl: mdl.renew(queue, pid, token, lease_secs, now),
                                     lambda: self.m.update(G, req))
        if got is not None:
            assert [wire_ms(r["expires_at"]) for r in got["renewed"]] == [expected]
            assert got["ticket"] > 0

    @precondition(lambda self: self.handles)
    @rule(i=handle_st, delay=release_delay_st, error=error_st, forge=st.booleans())
    def release(self, i: int, delay: float | None, error: str | None, forge: bool) -> None:
        queue, pid, token = self.handle(i, forge)
        now = self.now()
        req = UpdateRequest(release=[ReleaseItem(queue=queue, pid=pid, token=token,
                                                 delay_secs=delay, error=error)])
        _, got, _ = self.both(lambda mdl: mdl.release(queue, pid, token, delay, error, now),
                              lambda: self.m.update(G, req))
        if got is not None:
            assert got["released"] == 1 and got["ticket"] > 0

    @precondition(lambda self: self.handles)
    @rule(i=handle_st, forge=st.booleans())
    def dequeue(self, i: int, forge: bool) -> None:
        queue, pid, token = self.handle(i, forge)
        req = UpdateRequest(dequeue=[TaskRef(queue=queue, pid=pid, token=token)])
        _, got, _ = self.both(lambda mdl: mdl.dequeue(queue, pid, token),
                              lambda: self.m.update(G, req))
        if got is not None:
            assert got["dequeued"] == 1 and got["ticket"] > 0

    @precondition(lambda self: self.handles)
    @rule(i=handle_st, j=handle_st, dst=queue_st, pid=pid_st,
          bad=st.sampled_from([None, None, "both", "nul", "toolong", "stale", "gone"]))
    def move(self, i: int, j: int, dst: str, pid: str | None, bad: str | None) -> None:
        """Stage transition: dequeue from one queue + enqueue into another, atomically.
        With an invalid item (always last in its list), nothing at all is applied."""
        src, spid, token = self.handle(i)
        deq = [TaskRef(queue=src, pid=spid, token=token)]
        enq = [EnqueueItem(queue=dst, pid=pid)]
        renew: list[RenewItem] = []
        now_s = self.clock.now()
        if bad == "both":
            enq.append(EnqueueItem(queue=dst, pid="fresh", delay_secs=1, not_before=now_s + 1))
        elif bad == "nul":
            enq.append(EnqueueItem(queue=dst, pid="a\x00"))
        elif bad == "toolong":
            enq.append(EnqueueItem(queue=dst, pid="é" * 600))  # 1200 bytes > 1 KiB
        elif bad == "stale":
            q2, p2, t2 = self.handle(j, forge=True)
            renew.append(RenewItem(queue=q2, pid=p2, token=t2))
        elif bad == "gone":
            deq.append(TaskRef(queue=src, pid="never-enqueued", token=FAKE_TOKEN))
        self._update(UpdateRequest(dequeue=deq, enqueue=enq, renew=renew))

    @rule(data=st.data())
    def update_mix(self, data: st.DataObject) -> None:
        """Any mix of the four item kinds, drawn from every lease ever granted."""
        refs = st.tuples(handle_st, st.sampled_from([False, False, False, True]))

        def pick(n: int) -> list[tuple[str, str, str]]:
            if not self.handles:
                return []
            return [self.handle(i, f) for i, f in data.draw(st.lists(refs, max_size=n))]

        deq = [TaskRef(queue=q, pid=p, token=t) for q, p, t in pick(2)]
        ren = [RenewItem(queue=q, pid=p, token=t, lease_secs=data.draw(lease_secs_st))
               for q, p, t in pick(2)]
        rel = [ReleaseItem(queue=q, pid=p, token=t, delay_secs=data.draw(release_delay_st),
                           error=data.draw(error_st))
               for q, p, t in pick(2)]
        enq = [EnqueueItem(queue=q, **self.spec(p, tm)) for q, p, tm in data.draw(
            st.lists(st.tuples(queue_st, pid_st, timing_st), max_size=2))]
        self._update(UpdateRequest(dequeue=deq, renew=ren, release=rel, enqueue=enq))

    def _update(self, req: UpdateRequest) -> None:
        now = self.now()
        expected, got, changed = self.both(lambda mdl: mdl.update(req, now),
                                           lambda: self.m.update(G, req))
        if got is None:
            return
        assert [(e["queue"], e["pid"], e["collapsed"]) for e in got["enqueued"]] \
            == expected["enqueued"]
        assert [(r["queue"], r["pid"], wire_ms(r["expires_at"])) for r in got["renewed"]] \
            == expected["renewed"]
        assert got["dequeued"] == expected["dequeued"]
        assert got["released"] == expected["released"]
        # logged iff anything was written (a renew to the same expiry still is)
        wrote = bool(req.dequeue or req.renew or req.release) or any(
            not collapsed for _, _, collapsed in expected["enqueued"])
        assert (got["ticket"] > 0) == wrote
        assert wrote or not changed
        self.note_enqueued(got["enqueued"])

    # -- rules: time, background work, crashes ---------------------------------------------
    @rule(queue=st.sampled_from(CHECKED))
    def delete_queue(self, queue: str) -> None:
        expected, got, _ = self.both(lambda mdl: mdl.delete(queue),
                                     lambda: self.m.delete_queue(G, queue))
        if got is not None:
            assert got["deleted"] == expected

    @rule(queue=st.sampled_from(CHECKED))
    def reset_leases(self, queue: str) -> None:
        _, got, _ = self.both(lambda mdl: mdl.reset(queue),
                              lambda: self.m.reset_leases(G, queue))
        if got is not None:
            assert got["ticket"] > 0

    @rule()
    def reap(self) -> None:
        self.m.reap_once()  # background cleanup of deleted generations: invisible

    @rule(secs=st.sampled_from([0.001, 0.5, 1.0, 2.0, 5.0, 11.0, 31.0, 61.0]))
    def advance_clock(self, secs: float) -> None:
        self.clock.advance(secs)

    @rule()
    def sweep(self) -> None:
        self.m.sweep_once()
        self.model.sweep(self.now())

    @rule()
    def checkpoint(self) -> None:
        self.checkpoint_and_snapshot()

    @rule()
    def crash_and_replay(self) -> None:
        before = dump_index(self.m)
        self.restart()
        assert self.m.replayed == 0  # LMDB survived the process: nothing to redo
        assert dump_index(self.m) == before

    @rule()
    def power_loss_and_replay(self) -> None:
        """The index on disk rolls back to the last checkpoint; the WAL must bring it back."""
        # sweeps and reaps are derived state and not logged: compare swept, reaped states
        self.m.sweep_once()
        self.model.sweep(self.now())
        self.reap_all()
        before = dump_index(self.m)
        self.restart(power_loss=True)
        event(f"power loss: replayed {'some' if self.m.replayed else 'no'} records")
        self.m.sweep_once()
        self.reap_all()
        assert dump_index(self.m) == before

    def reap_all(self) -> None:
        """Reap every deleted generation. `reap_once` answers tasks reaped, which is 0 for an
        empty generation although it did remove its entry: drain by the pending list."""
        for _ in range(10_000):
            with self.m.index.env.begin() as txn:
                if self.m.index.pending_reap(txn) is None:
                    return
            self.m.reap_once()
        raise AssertionError("reaping did not finish")

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def master_agrees_with_model(self) -> None:
        m, now = self.m, self.now()
        assert m.index.lease_seq == self.model.lease_seq
        assert m.index.auto_pid == self.model.auto_pid
        with m.index.env.begin() as txn:
            not_ready = 0
            for name in CHECKED:
                mq = self.model.queues.get(name)
                q = m.queue(G, name)
                if mq is None:
                    assert q is None
                    continue
                assert q is not None
                assert (q.available, q.leased, q.delayed) == mq.counts()
                assert (q.completed, q.enqueued_total) == (mq.completed, mq.enqueued_total)
                not_ready += q.leased + q.delayed
                # the ready index: exactly the available tasks, in pid order
                assert list(m.index.iter_ready(txn, q, None, 10**6)) == sorted(
                    key(p) for p, t in mq.tasks.items() if t.state == AVAILABLE)
                stored = {t.pid: t for t in m.index.iter_tasks(txn, q, limit=10**6)}
                assert set(stored) == set(mq.tasks)
                for pid, mt in mq.tasks.items():
                    self._check_record(stored[pid], mt)
            # timers of deleted generations linger until due (the sweeper drops them)
            gens = {q.qid: q.gen for q in m.index.queues.values()}
            live_timers = sum(1 for k in txn.cursor(db=m.index.timers).iternext(values=False)
                              if gens.get(int.from_bytes(k[8:12], "big"))
                              == int.from_bytes(k[12:16], "big"))
            assert live_timers == not_ready
        for name in CHECKED:
            mq = self.model.queues.get(name) or MQueue()
            for pid in {*PIDS, *self.auto_pids, *mq.tasks}:
                self._check_info(name, pid, mq.tasks.get(pid), now)

    @staticmethod
    def _check_record(t: Task, mt: MTask) -> None:
        assert (t.state, t.token, t.live, t.attempts, t.enqueued_ms) == (
            mt.state, mt.token, mt.live, mt.attempts, mt.enqueued_ms), (t, mt)
        expiry, nb = (mt.due, 0) if mt.state == LEASED else (0, mt.due)
        assert (t.expiry_ms, t.not_before_ms) == (expiry, nb), (t, mt)
        assert t.worker == mt.worker
        assert t.error == mt.error
        assert t.payload is None

    def _check_info(self, queue: str, pid: str, mt: MTask | None, now: int) -> None:
        try:
            info = self.m.task_info(G, queue, pid)
        except NotFound as e:
            assert mt is None, f"{queue}/{pid[:20]} lost: {e}"
            return
        assert mt is not None, f"{queue}/{pid[:20]} should not exist: {info}"
        state = AVAILABLE if mt.state != AVAILABLE and mt.due <= now else mt.state
        assert info["state"] == STATE_NAMES[state]
        assert info["attempts"] == mt.attempts
        assert info["enqueued_at"] == mt.enqueued_ms / 1000
        assert info["expires_at"] == (mt.due / 1000 if state == LEASED else None)
        assert info["not_before"] == (mt.due / 1000 if state == DELAYED else None)
        assert info["worker"] == (mt.worker if state == LEASED else None)
        assert info["error"] == (mt.error or None)


# `make test` runs a fixed seed (the Makefile passes --hypothesis-seed and prints it);
# `make soak` runs many random seeds. SQUALL_MODEL_EXAMPLES sets the examples per run.
MasterMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("SQUALL_MODEL_EXAMPLES", "40")), stateful_step_count=40,
    deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
# The thread method ends the whole run with a stack dump: under Hypothesis the signal
# method's exception would be caught as a failure and shrunk, and the run could go on for
# hours past its timeout.
TestMasterModel = pytest.mark.timeout(300, method="thread")(MasterMachine.TestCase)


# -- flow control: keys, limits, pause, fairness, across crashes and replay ----------------
FQ = "f"
FKEYS = ("k0", "k1", "k2")
fkey_st = st.sampled_from([None, *FKEYS])


class FlowMachine(InProcessMaster, RuleBasedStateMachine):
    """Queue "f" with keyed tasks under changing flow policies and pauses. Every lease is
    checked against a model of the selection (pid order, skipping what a limit or a pause
    holds; or, for a fair queue, the same counts and per-key pid order), and the master's
    in-memory per-key counts against a recount of the index, across kill -9 and power
    loss (the index rolled back to a checkpoint and the WAL replayed)."""

    def __init__(self) -> None:
        super().__init__("squall-flow-model-", segment_bytes=1024)
        # pid -> [key, state, due, token]; the limits and pauses in force
        self.tasks: dict[str, list[Any]] = {}
        self.policies: dict[str, dict[str, Any]] = {"": {}, FQ: {}}  # group's, queue's
        self.paused = False
        self.paused_keys: set[str] = set()
        self.held: list[tuple[str, str]] = []  # (pid, token) of leases granted
        self.n = 0

    def teardown(self) -> None:
        self.close()

    def pol(self, name: str) -> Any:
        """The effective policy field: the queue's, else the group's."""
        v = self.policies[FQ].get(name)
        return self.policies[""].get(name) if v is None else v

    @property
    def key_limit(self) -> int | None:
        return self.pol("key_limit")  # type: ignore[no-any-return]

    @property
    def queue_limit(self) -> int | None:
        return self.pol("queue_limit")  # type: ignore[no-any-return]

    @property
    def fair(self) -> bool:
        return bool(self.pol("fair"))

    def now(self) -> int:
        return ms(self.clock.now())

    def sweep_model(self) -> None:
        now = self.now()
        for t in self.tasks.values():
            if t[1] != AVAILABLE and t[2] <= now:
                t[1], t[2] = AVAILABLE, 0

    def leased_of(self, key: str | None) -> int:
        return sum(1 for t in self.tasks.values() if t[0] == key and t[1] == LEASED)

    @rule(keys=st.lists(st.tuples(fkey_st, st.sampled_from([None, None, 0.5, 5.0])),
                        min_size=1, max_size=6))
    def enqueue(self, keys: list[tuple[str | None, float | None]]) -> None:
        specs = []
        for k, delay in keys:
            self.n += 1
            pid = f"p{(self.n * 7919) % 1000:03d}.{self.n}"  # not in enqueue order
            specs.append(TaskSpec(pid=pid, key=k, delay_secs=delay))
            self.tasks[pid] = [k, DELAYED if delay else AVAILABLE,
                               self.now() + ms(delay) if delay else 0, ""]
        self.run(self.m.enqueue(G, FQ, specs))

    @rule(max_tasks=st.integers(1, 6), max_pid=st.sampled_from([None, None, "p5"]))
    def lease(self, max_tasks: int, max_pid: str | None) -> None:
        self.sweep_model()
        req = LeaseRequest(max_tasks=max_tasks, lease_secs=10.0, max_pid=max_pid)
        got = self.run(self.m.lease(G, FQ, req, ""))["tasks"]
        expected = self.expected(max_tasks, max_pid)
        if self.fair:  # the same number, each key's tasks in pid order, none held back
            assert len(got) == len(expected), (got, expected)
            by_key: dict[str | None, list[str]] = {}
            for t in got:
                by_key.setdefault(t.get("key"), []).append(t["pid"])
            for k, pids in by_key.items():
                ready = sorted(p for p, t in self.tasks.items() if t[0] == k
                               and t[1] == AVAILABLE and (max_pid is None or p <= max_pid))
                assert pids == ready[:len(pids)], (k, pids)
        else:
            assert [t["pid"] for t in got] == expected
        for t in got:
            assert t.get("key") == self.tasks[t["pid"]][0]
            assert not self.paused and t.get("key") not in self.paused_keys
            self.tasks[t["pid"]][1:] = [LEASED, self.now() + 10_000, t["token"]]
            self.held.append((t["pid"], t["token"]))
        for k in FKEYS:  # no lease ever exceeds a limit
            if self.key_limit is not None and any(t.get("key") == k for t in got):
                assert self.leased_of(k) <= self.key_limit
        if self.queue_limit is not None and got:
            assert sum(1 for t in self.tasks.values() if t[1] == LEASED) <= self.queue_limit

    def expected(self, max_tasks: int, max_pid: str | None) -> list[str]:
        if self.paused:
            return []
        allow = max_tasks
        if self.queue_limit is not None:
            allow = min(allow, self.queue_limit
                        - sum(1 for t in self.tasks.values() if t[1] == LEASED))
        out: list[str] = []
        taken: dict[str, int] = {}
        for pid in sorted(self.tasks):
            k, state = self.tasks[pid][:2]
            if len(out) >= allow:
                break
            if state != AVAILABLE or (max_pid is not None and pid > max_pid):
                continue
            if k is not None:
                if k in self.paused_keys:
                    continue
                if (self.key_limit is not None
                        and self.leased_of(k) + taken.get(k, 0) >= self.key_limit):
                    continue
                taken[k] = taken.get(k, 0) + 1
            out.append(pid)
        return out

    @precondition(lambda self: self.held)
    @rule(i=st.integers(0, 10**6), release=st.booleans())
    def finish(self, i: int, release: bool) -> None:
        pid, token = self.held.pop(i % len(self.held))
        t = self.tasks.get(pid)
        if t is None or t[1] != LEASED or t[2] <= self.now() or t[3] != token:
            return  # expired, or leased again since: the model keeps it simple
        ref = {"queue": FQ, "pid": pid, "token": token}
        if release:
            self.run(self.m.update(G, UpdateRequest(release=[ReleaseItem(**ref)])))
            t[1:] = [AVAILABLE, 0, ""]
        else:
            self.run(self.m.update(G, UpdateRequest(dequeue=[TaskRef(**ref)])))
            del self.tasks[pid]

    @rule(key_limit=st.sampled_from([None, 1, 2]), queue_limit=st.sampled_from([None, None, 3]),
          fair=st.sampled_from([None, False, True]), group=st.booleans(),
          clear=st.booleans())
    def set_policy(self, key_limit: int | None, queue_limit: int | None, fair: bool | None,
                   group: bool, clear: bool) -> None:
        """Set the group's or the queue's policy (a queue's fields win), or clear the
        queue's."""
        if clear:
            self.run(self.m.set_policy(G, FQ, None))
            self.policies[FQ] = {}
            return
        pol = Policy(key_limit=key_limit, queue_limit=queue_limit, fair=fair)
        self.run(self.m.set_policy(G, "" if group else FQ, pol))
        self.policies["" if group else FQ] = {"key_limit": key_limit,
                                              "queue_limit": queue_limit, "fair": fair}

    @rule(key=fkey_st, paused=st.booleans())
    def pause(self, key: str | None, paused: bool) -> None:
        self.run(self.m.pause(G, FQ, key, paused))
        if key is None:
            self.paused = paused
        elif paused:
            self.paused_keys.add(key)
        else:
            self.paused_keys.discard(key)

    @rule(secs=st.sampled_from([0.5, 3.0, 11.0]))
    def advance_clock(self, secs: float) -> None:
        self.clock.advance(secs)

    @rule()
    def checkpoint(self) -> None:
        self.checkpoint_and_snapshot()

    @rule()
    def crash_and_replay(self) -> None:
        self.restart()

    @rule()
    def power_loss_and_replay(self) -> None:
        self.restart(power_loss=True)

    @invariant()
    def counts_match_the_index(self) -> None:
        """The in-memory per-key counts equal a recount of the task records (and the
        model), and the pauses are what was asked."""
        m = self.m
        q = m.queue(G, FQ)
        if q is None:
            assert not self.tasks
            return
        recount: dict[str, list[int]] = {}
        now = self.now()
        with m.index.env.begin() as txn:
            for t in m.index.iter_tasks(txn, q, limit=10**6):
                if t.key and t.state in (AVAILABLE, LEASED):  # as stored (before sweeps)
                    recount.setdefault(t.key, [0, 0])[t.state] += 1
                mt = self.tasks[t.pid]
                # states as a lease sees them (sweeps are not logged: a replay may bring
                # back an expired lease, still due for its sweep)
                state = AVAILABLE if t.state != AVAILABLE and t.due_ms() <= now else t.state
                mstate = AVAILABLE if mt[1] != AVAILABLE and mt[2] <= now else mt[1]
                assert t.key == (mt[0] or "") and state == mstate
        assert len(self.tasks) == q.size
        qf = m.engine.flow.queues.get(q.qid)
        mem = {k: [ks.ready, ks.leased] for k, ks in (qf.keys.items() if qf else ())
               if ks.ready or ks.leased}
        assert mem == recount
        if qf is not None:  # the held counts, kept as keys change, equal a recount
            qf = m.engine.flow.state(q)
            assert qf is not None
            assert qf.paused_ready == sum(ks.ready for ks in qf.keys.values()
                                          if ks.key in qf.paused_keys)
            assert qf.held_ready == sum(ks.ready for ks in qf.keys.values()
                                        if ks.key not in qf.paused_keys and not ks.listed)
            assert all(ks.listed == qf.eligible(ks) for ks in qf.keys.values())
        assert m.pause_state(G, FQ) == {"paused": self.paused,
                                        "paused_keys": sorted(self.paused_keys)}


FlowMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("SQUALL_MODEL_EXAMPLES", "40")), stateful_step_count=40,
    deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestFlowModel = pytest.mark.timeout(300, method="thread")(FlowMachine.TestCase)


def test_a_reset_after_an_unswept_expiry_replays_as_it_ran(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two leases expire and the next lease's sweep makes both available again (derived
    state, not logged); then the queue's leases are reset. Replay runs no sweeps: the
    reset must leave both tasks alike either way (found by the machine above, seed 58211
    with 300 examples)."""
    monkeypatch.setitem(globals(), "event", lambda *_a: None)  # outside a Hypothesis run
    m = MasterMachine()
    try:
        m.enqueue(queue="a", items=[(None, None), (None, None)])
        m.lease(queue="a", k=1, max_pid=None, lease_secs=1.0, worker="w1")
        m.lease(queue="a", k=1, max_pid=None, lease_secs=1.0, worker="w1")
        m.advance_clock(secs=1.0)
        m.lease(queue="a", k=1, max_pid=None, lease_secs=1.0, worker="w1")
        m.reset_leases(queue="a")
        m.power_loss_and_replay()
        m.master_agrees_with_model()
    finally:
        m.teardown()
