"""The Worker's data path: a dequeue the master could not take is retried while
the lease lasts (never released with an error, never dead-lettered), an idle worker long-
polls instead of polling, a sync Client's own transport is kept, and finished tasks are
acknowledged in coalesced updates."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

import squall.client as sc
from squall.client import AsyncClient, Client, NewTask, Worker
from squall.client._protocol import held_wire
from squall.client._tasks import TaskBase
from squall.client.worker import runtime
from squall.client.worker.acker import ACK_BATCH_MAX, Acker
from squall.master.http.app import create_master_app
from squall.master.service import MasterSettings
from tests.helpers import MasterProcess, until, wait_for


class Flaky(httpx.AsyncBaseTransport):
    """Forwards to an in-process master; answers 503 to the first `fail_dequeues` updates
    that carry dequeues, and counts requests by path end."""

    def __init__(self, app: Any, fail_dequeues: int = 0, lose_answers: int = 0) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.fail_dequeues = fail_dequeues
        self.lose_answers = lose_answers  # then apply this many such updates, lose the answer
        self.seen: Counter[str] = Counter()
        self.dequeued: list[int] = []
        self.rode = 0  # updates that dequeue and lease the next tasks
        self.renewed = 0  # updates that renew leases

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        end = request.url.path.rsplit("/", 1)[-1]
        self.seen[end] += 1
        if end == "update":
            body = await request.aread()
            self.renewed += b'"renew":[{' in body
            if b'"dequeue":[{' in body:
                self.dequeued.append(body.count(b'"token"'))
                self.rode += b'"lease":{' in body
                if self.fail_dequeues > 0:
                    self.fail_dequeues -= 1
                    return httpx.Response(503, json={"error": {"code": "unavailable",
                                                               "message": "restarting"}})
                if self.lose_answers > 0:
                    self.lose_answers -= 1
                    await self.inner.handle_async_request(request)  # applied
                    raise httpx.ReadError("connection reset before the answer", request=request)
        return await self.inner.handle_async_request(request)


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[Any]:
    a = create_master_app(MasterSettings(data_dir=str(tmp_path / "m"), sweep_interval_s=0.02))
    async with a.router.lifespan_context(a):
        yield a


async def test_done_is_retried_while_the_lease_lasts(app: Any) -> None:
    flaky = Flaky(app, fail_dequeues=5)
    async with AsyncClient("http://127.0.0.1", transport=flaky, retries=0) as c:
        await c.set_policy("wk#once", max_attempts=1)
        await c.put("wk#once", pid="only")

        async def handler(task: sc.AsyncLeasedTask) -> None:
            return None

        stats = await asyncio.wait_for(Worker(c, "wk#once", handler, burst=True,
                                              lease_secs=30).arun(install_signals=False), 60)
        assert (stats.done, stats.failed, stats.lost) == (1, 0, 0)
        assert len(flaky.dequeued) == 6  # five refusals, then saved
        assert (await c.stats("wk#once")).completed == 1
        assert await c.dead_letters("wk#once") == []


async def test_a_dequeue_applied_whose_answer_was_lost_counts_as_done(app: Any) -> None:
    """The update that dequeued a finished task reached the master, but its answer was lost:
    the resend answers NotFound (the task is gone), which is the task done, not lost."""
    flaky = Flaky(app, lose_answers=1)
    async with AsyncClient("http://127.0.0.1", transport=flaky, retries=0) as c:
        await c.put("wk#lost", pid="only")

        async def handler(task: sc.AsyncLeasedTask) -> None:
            return None

        stats = await asyncio.wait_for(Worker(c, "wk#lost", handler, burst=True,
                                              lease_secs=30).arun(install_signals=False), 60)
        assert flaky.lose_answers == 0 and len(flaky.dequeued) == 2  # applied, then resent
        assert (stats.done, stats.failed, stats.lost) == (1, 0, 0)
        assert (await c.stats("wk#lost")).completed == 1


async def test_idle_worker_long_polls_and_acks_in_batches(app: Any) -> None:
    flaky = Flaky(app)
    async with AsyncClient("http://127.0.0.1", transport=flaky) as c:
        done: list[str] = []

        async def handler(task: sc.AsyncLeasedTask) -> None:
            assert await task.payload() == b""
            done.append(task.pid)

        w = Worker(c, "wk#idle", handler, concurrency=50, wait_s=5.0)
        run = asyncio.create_task(w.arun(install_signals=False))
        m = app.state.master  # idle: one lease parked on the master, no polling
        await until(lambda: m.waiters.total >= 1, 10, what="the worker's lease parked")
        assert flaky.seen["lease"] <= 3
        await c.put_many("wk#idle", [NewTask(pid=f"{i:03d}") for i in range(200)])
        await until(lambda: len(done) >= 200, 30, interval=0.01, what="200 tasks done")
        w.stop()
        stats = await asyncio.wait_for(run, 30)
        assert stats.done == 200 and sorted(done) == [f"{i:03d}" for i in range(200)]
        # acks were coalesced: far fewer updates than tasks
        assert sum(flaky.dequeued) == 200 and len(flaky.dequeued) < 100
        assert (await c.stats("wk#idle")).total == 0


@pytest.mark.parametrize("sync", [False, True], ids=["async-handler", "sync-handler"])
async def test_acks_ride_on_the_next_lease(app: Any, monkeypatch: pytest.MonkeyPatch,
                                           sync: bool) -> None:
    """Tasks arriving one at a time: each one's dequeue goes in the update that leases (and
    waits for) the next task, not in an update of its own; every task counts done once that
    update is answered. A sync handler runs on a thread, so it finishes after the answer
    that settled the previous task's ack has woken the lease loop: that wake-up must not
    send the next lease before the task just leased is acked, or every ack goes alone."""
    monkeypatch.setattr(runtime, "RIDE_WAIT_S", 10.0)  # however slow the machine
    flaky = Flaky(app)
    async with AsyncClient("http://127.0.0.1", transport=flaky) as c:
        done: list[str] = []

        async def handler(task: sc.AsyncLeasedTask) -> None:
            done.append(task.pid)

        w = Worker(c, "wk#trickle", (lambda task: done.append(task.pid)) if sync else handler,
                   concurrency=8, wait_s=2.0)
        run = asyncio.create_task(w.arun(install_signals=False))
        m = app.state.master
        for i in range(20):
            await until(lambda: m.waiters.total >= 1, 10, what="the worker's lease parked")
            await c.put("wk#trickle", pid=f"{i:02d}")
            await until(lambda i=i: len(done) > i, 10, interval=0.005, what=f"task {i} ran")
        await until(lambda: m.waiters.total >= 1, 10, what="the last ack rode on a lease")
        w.stop()
        stats = await asyncio.wait_for(run, 30)
        assert stats.done == 20 and (await c.stats("wk#trickle")).completed == 20
        assert sum(flaky.dequeued) == 20
        # plain leases: the first, and a few whose ack the acker sent alone (it waits 2 ms)
        assert flaky.seen["lease"] <= 5 and flaky.rode >= 15, (flaky.seen, flaky.dequeued)


async def test_a_full_worker_acks_on_the_lease_that_refills_it(app: Any) -> None:
    """A backlog and one slot: a finished task frees its slot while its ack is on its way,
    so each ack rides on the update that leases the next task (two requests per task with
    the payload read, not three)."""
    flaky = Flaky(app)
    async with AsyncClient("http://127.0.0.1", transport=flaky) as c:
        await c.put_many("wk#one", [NewTask(pid=f"{i:02d}") for i in range(30)])
        done: list[str] = []

        async def handler(task: sc.AsyncLeasedTask) -> None:
            done.append(task.pid)

        # a long linger: the acker leaves each ack to the lease loop however slow the
        # machine (with the default 2 ms, an ack the loop has not taken by then goes alone)
        stats = await asyncio.wait_for(Worker(c, "wk#one", handler, concurrency=1,
                                              burst=True, ack_linger_s=10).arun(
                                                  install_signals=False), 60)
        assert stats.done == 30 and done == [f"{i:02d}" for i in range(30)]
        assert sum(flaky.dequeued) == 30 and (await c.stats("wk#one")).completed == 30
        assert flaky.rode == len(flaky.dequeued) == 30, (flaky.rode, flaky.dequeued)


async def test_a_worker_whose_acks_are_refused_for_a_while_finishes_everything(
        app: Any) -> None:
    """Finished tasks whose acks are refused (503: retried while their leases last, riding
    on leases or on their own) free their slots; the worker never holds more than
    2 x concurrency tasks, and every task is done once the master takes the acks."""
    flaky = Flaky(app, fail_dequeues=6)
    async with AsyncClient("http://127.0.0.1", transport=flaky, retries=0) as c:
        await c.put_many("wk#hold", [NewTask(pid=f"{i:02d}") for i in range(30)])
        held: list[int] = []
        w: Worker

        async def handler(task: sc.AsyncLeasedTask) -> None:
            held.append(len(w._running))

        w = Worker(c, "wk#hold", handler, concurrency=2, burst=True, lease_secs=30)
        stats = await asyncio.wait_for(w.arun(install_signals=False), 60)
        assert (stats.done, stats.failed, stats.lost) == (30, 0, 0)
        assert flaky.fail_dequeues == 0 and sum(flaky.dequeued) >= 30 + 6
        assert 1 <= max(held) <= 4, held
        assert (await c.stats("wk#hold")).completed == 30


def test_a_lease_takes_at_most_one_updates_worth_of_finished_tasks() -> None:
    """What the lease loop takes from the acker fits one update (ACK_BATCH_MAX dequeues
    and follow-ups, of one group, oldest first); the rest waits for the next."""
    acker = Acker(cast(Any, None), linger_s=0, running=lambda: 0)
    for i in range(300):  # a dequeue and a follow-up each: 600 items of an update
        task = TaskBase(None, *held_wire("g#q", f"{i:03d}", "tok"))
        acker._queue.append((task, [NewTask(pid=f"f{i:03d}", queue="g#next")],
                             cast(Any, None)))
    acker._queue.insert(7, (TaskBase(None, *held_wire("h#q", "x", "tok")), [], cast(Any, None)))
    tx, taken = acker.take("g")
    assert tx is not None and len(taken) == ACK_BATCH_MAX // 2 == len(tx.dequeues)
    assert [t.pid for t, _, _ in taken] == [f"{i:03d}" for i in range(ACK_BATCH_MAX // 2)]
    assert [t.group for t, _, _ in acker._queue].count("h") == 1
    tx, taken = acker.take("g")
    assert tx is not None and len(taken) == 300 - ACK_BATCH_MAX // 2
    assert acker.take("g") == (None, []) and acker.pending == 1


def test_free_slots_count_finished_tasks_up_to_twice_the_concurrency() -> None:
    """The slot rule itself: a task waiting for its ack frees its slot, and no more than
    2 x concurrency tasks are held in all (the bound when acks are slow to be saved)."""
    with Client("http://127.0.0.1:9") as c:  # never called
        w = Worker(c, "wk#rule", lambda t: None, concurrency=2)
    fut: Any = None

    def free(running: int, acking: int) -> int:
        w._running = {i: (None, fut) for i in range(running)}
        w._acking = set(range(acking))
        return w._free()

    assert [free(0, 0), free(1, 0), free(2, 0), free(2, 1), free(2, 2)] == [2, 1, 0, 1, 2]
    assert [free(3, 2), free(3, 3), free(4, 3), free(4, 4), free(5, 5)] == [1, 1, 0, 0, -1]


async def test_a_finished_task_whose_ack_waits_on_a_lease_is_not_renewed(
        app: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Its dequeue is applied when the long poll carrying it parks; renewing it then would
    find it gone and report a lease lost. The worker's clock moves past the renewal time
    instead of the test sleeping; a running task is renewed, the finished one is not."""
    flaky = Flaky(app)
    now = [1000.0]
    async with AsyncClient("http://127.0.0.1", transport=flaky) as c:
        done: list[str] = []
        release = asyncio.Event()

        async def handler(task: sc.AsyncLeasedTask) -> None:
            if task.pid == "slow":
                await release.wait()
            done.append(task.pid)

        w = Worker(c, "wk#short", handler, concurrency=4, lease_secs=0.6, wait_s=1.5,
                   clock=lambda: now[0])
        run = asyncio.create_task(w.arun(install_signals=False))
        m = app.state.master
        await until(lambda: m.waiters.total >= 1, 10, what="the worker's lease parked")
        await c.put("wk#short", pid="a")
        await until(lambda: bool(done), 10, interval=0.005, what="task a ran")
        await until(lambda: m.waiters.total >= 1, 10, what="the ack's lease parked")
        now[0] += 1.0  # past lease_secs / 3 for task a
        passes = w._renew_passes
        await until(lambda: w._renew_passes >= passes + 2, 10, interval=0.01,
                    what="two looks of the renewer")
        assert flaky.renewed == 0  # the finished task was not renewed
        # the control: a task still running when the clock moves is renewed
        await c.put("wk#short", pid="slow")
        await until(lambda: "slow" in {t.pid for t, _ in w._running.values()}, 10,
                    interval=0.005, what="task slow running")
        now[0] += 1.0
        await until(lambda: flaky.renewed >= 1, 10, interval=0.01, what="slow renewed")
        release.set()
        await until(lambda: len(done) == 2, 10, interval=0.005, what="task slow ran")
        w.stop()
        stats = await asyncio.wait_for(run, 30)
        assert (stats.done, stats.lost) == (2, 0)
        assert "lease lost" not in caplog.text


class SyncOnly(httpx.BaseTransport):
    """A custom sync transport (no async face) that counts what goes through it."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.n = 0
        self.lock = threading.Lock()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.n += 1
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def test_worker_keeps_a_sync_clients_transport(master_proc: MasterProcess) -> None:
    t = SyncOnly()
    with Client(master_proc.url, transport=t) as c:
        c.put_many("wk#t", [NewTask(pid=f"{i}") for i in range(20)])
        before = t.n
        stats = Worker(c, "wk#t", lambda task: None, burst=True).run()
        assert stats.done == 20 and t.n > before  # the worker's calls went through it
        wait_for(lambda: c.stats("wk#t").total == 0, 5)


def test_a_worker_that_owns_its_loop_runs_on_uvloop(master_proc: MasterProcess) -> None:
    """Worker.run() makes its own event loop: uvloop's (5-25 % less worker CPU per task in
    D than asyncio's; uvloop comes with the servers' dependencies)."""
    uvloop = pytest.importorskip("uvloop")
    loops: list[type] = []

    async def handler(task: sc.AsyncLeasedTask) -> None:
        loops.append(type(asyncio.get_running_loop()))

    with Client(master_proc.url) as c:
        c.put_many("wk#uv", [NewTask(pid=f"{i}") for i in range(3)])
        stats = Worker(c, "wk#uv", handler, burst=True).run()
    assert stats.done == 3 and loops == [uvloop.Loop] * 3
