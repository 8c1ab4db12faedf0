"""Model-based test of batches and unique tasks (master/tasks/batches.py, unique.py): a
Hypothesis state machine drives a real `Master` (ManualClock) and a small model side by
side, with kill -9 and power-loss restarts (the index rolled back to the last checkpoint,
the WAL replayed onto it).

Checked after every step: each batch's members total, done and failed and its state as
the model counts them (and gone once its callback is dequeued); the callback queue's
`enqueued_total` (a durable counter) equal to the callbacks the model fired — so every
callback is enqueued exactly once, and never before its last member (done + failed =
total); every callback task present until it is dequeued; a unique enqueue collapses
exactly when the model says its key's holder is queued (or leased, for `active`); and a
restart (either kind) gives back exactly the index it had.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from squall.common.errors import Conflict, NotFound
from squall.common.wire.models import (
    BatchRequest,
    LeaseRequest,
    Policy,
    ReleaseItem,
    TaskRef,
    TaskSpec,
    UpdateRequest,
)
from tests.crashkit import InProcessMaster, dump_index

G = "g"
W, CB, U = "w", "cb", "u"  # members (max_attempts 1: a failure dead-letters), callbacks,
KEYS = ("k1", "k2")        # unique tasks
LEASE_S = 60.0


@dataclass
class MTask:
    state: str = "queued"  # queued | leased
    token: str = ""
    expiry: float = 0.0
    batch: str | None = None
    cb_of: str | None = None
    key: str | None = None


@dataclass
class MBatch:
    total: int
    on_dead: str
    parent: str | None
    has_error_cb: bool
    done: int = 0
    failed: int = 0
    state: str = "open"


@dataclass
class Model:
    tasks: dict[tuple[str, str], MTask] = field(default_factory=dict)
    batches: dict[str, MBatch] = field(default_factory=dict)
    fired: int = 0  # callbacks and error callbacks enqueued
    holders: dict[str, str] = field(default_factory=dict)  # unique key -> holder pid
    n: int = 0  # ids made

    def finish(self, bid: str, ok: bool) -> None:
        b = self.batches[bid]
        assert b.state == "open"
        if ok:
            assert b.done + b.failed >= b.total  # only after the last member
        b.state = "done" if ok else "failed"
        if ok or b.has_error_cb:
            self.fired += 1
            pid = f"cb-{bid}" if ok else f"err-{bid}"
            self.tasks[(CB, pid)] = MTask(cb_of=bid, batch=b.parent if ok else None)
        if b.parent is not None and not ok:
            self.count_failed(b.parent)

    def count_failed(self, bid: str) -> None:
        b = self.batches.get(bid)
        if b is None:
            return
        b.failed += 1
        if b.state != "open":
            return
        if b.on_dead == "fail":
            self.finish(bid, ok=False)
        elif b.done + b.failed >= b.total:
            self.finish(bid, ok=True)

    def dequeued(self, t: MTask) -> None:
        if t.batch is not None and t.batch in self.batches:
            b = self.batches[t.batch]
            b.done += 1
            if b.state == "open" and b.done + b.failed >= b.total:
                self.finish(t.batch, ok=True)
        if t.cb_of is not None:
            self.batches.pop(t.cb_of, None)


class FaninMachine(InProcessMaster, RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__("squall-fanin-model-", segment_bytes=2048)
        self.run(self.m.set_policy(G, W, Policy(max_attempts=1)))
        self.model = Model()

    def teardown(self) -> None:
        self.close()

    def leased(self, queue: str) -> list[tuple[tuple[str, str], MTask]]:
        return sorted((k, t) for k, t in self.model.tasks.items()
                      if k[0] == queue and t.state == "leased"
                      and t.expiry > self.clock.now())

    # -- rules -------------------------------------------------------------------------------
    @rule(n=st.integers(0, 3), on_dead=st.sampled_from(["fail", "ignore"]),
          nest=st.booleans(), error_cb=st.booleans(), data=st.data())
    def create_batch(self, n: int, on_dead: str, nest: bool, error_cb: bool,
                     data: st.DataObject) -> None:
        mm = self.model
        mm.n += 1
        bid = f"b{mm.n}"
        open_ = sorted(b for b, x in mm.batches.items() if x.state == "open")
        parent = data.draw(st.sampled_from(open_)) if nest and open_ else None
        req = BatchRequest.model_validate({
            "id": bid, "on_dead": on_dead,
            "tasks": [{"queue": W, "pid": f"{bid}-m{i}"} for i in range(n)],
            "callback": {"queue": CB, "pid": f"cb-{bid}",
                         **({"batch": parent} if parent else {})},
            **({"error_callback": {"queue": CB, "pid": f"err-{bid}"}} if error_cb else {})})
        self.run(self.m.create_batch(G, req))
        if parent is not None:
            mm.batches[parent].total += 1
        mm.batches[bid] = MBatch(n, on_dead, parent, error_cb)
        for i in range(n):
            mm.tasks[(W, f"{bid}-m{i}")] = MTask(batch=bid)
        if n == 0:
            mm.finish(bid, ok=True)

    @rule(data=st.data())
    def join(self, data: st.DataObject) -> None:
        mm = self.model
        if not mm.batches:
            return
        bid = data.draw(st.sampled_from(sorted(mm.batches)))
        mm.n += 1
        pid = f"{bid}-j{mm.n}"
        spec = TaskSpec(pid=pid, batch=bid)
        if mm.batches[bid].state != "open":
            with pytest.raises(Conflict):
                self.run(self.m.enqueue(G, W, [spec]))
            return
        self.run(self.m.enqueue(G, W, [spec]))
        mm.batches[bid].total += 1
        mm.tasks[(W, pid)] = MTask(batch=bid)

    @rule(queue=st.sampled_from([W, CB, U]), k=st.integers(1, 3))
    def lease(self, queue: str, k: int) -> None:
        got = self.run(self.m.lease(G, queue, LeaseRequest(max_tasks=k, lease_secs=LEASE_S),
                                    ""))["tasks"]
        now = self.clock.now()
        for t in got:
            mt = self.model.tasks[(queue, t["pid"])]
            # only a queued task, or one whose lease expired
            assert mt.state == "queued" or mt.expiry <= now
            assert t.get("batch") == mt.batch and t.get("callback_of") == mt.cb_of
            mt.state, mt.token, mt.expiry = "leased", t["token"], now + LEASE_S
        took = {x["pid"] for x in got}
        if queue == W:  # max_attempts 1: an expired member that comes up is dead-lettered
            for (q, pid), t in sorted(self.model.tasks.items()):
                if q == W and pid not in took and t.state == "leased" and t.expiry <= now:
                    try:
                        self.m.task_info(G, W, pid)
                    except NotFound:
                        assert self.m.task_info(G, W + ".dead", pid).get("batch") is None
                        del self.model.tasks[(q, pid)]
                        if t.batch is not None:
                            self.model.count_failed(t.batch)
        # a lease takes what is there: if it took fewer than k, nothing else was leasable
        if len(got) < k:
            assert not [pid for (q, pid), t in self.model.tasks.items()
                        if q == queue and pid not in took
                        and (t.state == "queued" or t.expiry <= now)]

    @rule(i=st.integers(0, 100), result=st.booleans(), n=st.integers(1, 3))
    def ack(self, i: int, result: bool, n: int) -> None:
        """Dequeue up to `n` leased tasks (of any queue) in one update."""
        held = self.leased(W) + self.leased(CB) + self.leased(U)
        if not held:
            return
        picked = [held[(i + j) % len(held)] for j in range(min(n, len(held)))]
        picked = list(dict(picked).items())  # no task twice
        self.run(self.m.update(G, UpdateRequest(dequeue=[TaskRef(
            queue=q, pid=pid, token=mt.token, result=f'"{pid}"' if result else None)
            for (q, pid), mt in picked])))
        before = self.model.fired
        for k, mt in picked:
            del self.model.tasks[k]
            self.model.dequeued(mt)
        event("ack fired a callback" if self.model.fired > before else "ack")

    @rule(queue=st.sampled_from([W, W, CB, U]), k=st.integers(1, 4), result=st.booleans())
    def work(self, queue: str, k: int, result: bool) -> None:
        """Lease up to `k` tasks of `queue` and dequeue them all (a worker's round)."""
        self.lease(queue, k)
        self.ack(0, result, 1000)

    @rule(i=st.integers(0, 100))
    def fail_member(self, i: int) -> None:
        held = self.leased(W)
        if not held:
            return
        (q, pid), mt = held[i % len(held)]
        self.run(self.m.update(G, UpdateRequest(release=[ReleaseItem(
            queue=q, pid=pid, token=mt.token, error="boom")])))  # max_attempts 1: dead
        del self.model.tasks[(q, pid)]
        if mt.batch is not None:
            self.model.count_failed(mt.batch)

    @rule(i=st.integers(0, 100))
    def cancel_member(self, i: int) -> None:
        queued = sorted(k for k, t in self.model.tasks.items()
                        if k[0] == W and t.state == "queued")
        if not queued:
            return
        q, pid = queued[i % len(queued)]
        self.run(self.m.cancel(G, q, pid))
        mt = self.model.tasks.pop((q, pid))
        if mt.batch is not None:
            self.model.count_failed(mt.batch)

    @rule(key=st.sampled_from(KEYS), mode=st.sampled_from(["queued", "active"]))
    def put_unique(self, key: str, mode: str) -> None:
        mm = self.model
        mm.n += 1
        pid = f"u{mm.n}"
        res = self.run(self.m.enqueue(G, U, [TaskSpec(pid=pid, key=key, unique=mode)]))
        got = res["enqueued"][0]
        holder = mm.holders.get(key)
        h = mm.tasks.get((U, holder)) if holder is not None else None
        now = self.clock.now()
        blocks = h is not None and (h.state == "queued" or h.expiry <= now or mode == "active")
        if blocks:
            assert got == {"queue": U, "pid": holder, "collapsed": True}
        else:
            assert got == {"queue": U, "pid": pid, "collapsed": False}
            mm.holders[key] = pid
            mm.tasks[(U, pid)] = MTask(key=key)

    @rule(secs=st.sampled_from([1.0, 61.0]))
    def advance_clock(self, secs: float) -> None:
        self.clock.advance(secs)

    @rule()
    def checkpoint(self) -> None:
        self.checkpoint_and_snapshot()

    @rule()
    def crash_and_replay(self) -> None:
        before = dump_index(self.m)
        self.restart()
        assert dump_index(self.m) == before

    @precondition(lambda self: self.snapshot is not None)
    @rule()
    def power_loss_and_replay(self) -> None:
        self.m.sweep_once()  # sweeps are derived state, not logged: compare swept states
        before = dump_index(self.m)
        self.restart(power_loss=True)
        self.m.sweep_once()
        assert dump_index(self.m) == before

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def batches_agree(self) -> None:
        mm = self.model
        for bid, b in mm.batches.items():
            info = self.m.batch_info(G, bid)
            assert (info["total"], info["done"], info["failed"], info["state"]) == (
                b.total, b.done, b.failed, b.state), bid
        for i in range(1, mm.n + 1):
            if f"b{i}" not in mm.batches:
                with pytest.raises(NotFound):
                    self.m.batch_info(G, f"b{i}")
        q = self.m.index.queues.get((G, CB))
        assert (q.enqueued_total if q else 0) == mm.fired  # every callback exactly once
        for (queue, pid), t in mm.tasks.items():
            info = self.m.task_info(G, queue, pid)
            assert info.get("callback_of") == t.cb_of and info.get("batch") == t.batch
        for queue in (W, CB, U):
            q = self.m.index.queues.get((G, queue))
            assert (q.size if q else 0) == sum(1 for k in mm.tasks if k[0] == queue)


FaninMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("SQUALL_MODEL_EXAMPLES", "40")), stateful_step_count=40,
    deadline=None, print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestFaninModel = pytest.mark.timeout(300, method="thread")(FaninMachine.TestCase)
