"""Waiting leases (``wait_secs``, SQS long polling): answered as soon as a task becomes
available (enqueue, release, delay end, expiry), empty at the deadline, bounded per queue
and in total, and answered at once when the master stops (graceful) or fails fast when it
dies (SIGKILL), with the client going on against the restarted master."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from squall.client import AsyncClient, Client, Overloaded, TransportError, Unavailable
from squall.common.clock import ManualClock
from squall.common.security import tokens
from squall.common.wire.models import EnqueueItem, PayloadRef, UpdateRequest
from squall.master.http.app import create_master_app
from squall.master.service import Master, MasterSettings
from squall.master.tasks.waiters import Waiters
from tests.helpers import ADMIN, MasterProcess, until, wait_for

Env = tuple[AsyncClient, Master, ManualClock]


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    clock = ManualClock()
    settings = MasterSettings(data_dir=str(tmp_path / "m"), lease_waiters_per_queue=2,
                              lease_waiters_max=3, lease_wait_max_s=10.0)
    app = create_master_app(settings, clock=clock, background=False)
    async with app.router.lifespan_context(app), \
            AsyncClient("http://127.0.0.1", transport=httpx.ASGITransport(app=app),
                        retries=0) as c:
        yield c, app.state.master, clock


async def _parked(m: Master, n: int) -> None:
    await until(lambda: m.waiters.total >= n, 10, what=f"{n} parked leases")


async def test_parked_lease_answers_on_enqueue_and_release(env: Env) -> None:
    c, m, _ = env
    t0 = time.monotonic()
    waiting = asyncio.create_task(c.lease("w#q", 5, 30, wait_secs=10))
    await _parked(m, 1)
    await c.put("w#q", pid="a")
    [task] = await asyncio.wait_for(waiting, 5)
    assert task.pid == "a" and time.monotonic() - t0 < 5
    assert m.waiters.total == 0
    waiting = asyncio.create_task(c.lease("w#q", 5, 30, wait_secs=10))
    await _parked(m, 1)
    await task.release()
    [again] = await asyncio.wait_for(waiting, 5)
    assert again.pid == "a" and again.attempts == 2


async def test_parked_lease_answers_when_a_delay_ends_or_a_lease_expires(env: Env) -> None:
    c, m, clock = env
    await c.put("w#d", pid="later", delay=60)
    waiting = asyncio.create_task(c.lease("w#d", 1, 30, wait_secs=10))
    await _parked(m, 1)
    clock.advance(61)
    await m.tick()  # the sweeper makes it due and wakes the parked lease
    [task] = await asyncio.wait_for(waiting, 5)
    assert task.pid == "later"
    waiting = asyncio.create_task(c.lease("w#d", 1, 30, wait_secs=10))
    await _parked(m, 1)
    clock.advance(31)
    await m.tick()
    [again] = await asyncio.wait_for(waiting, 5)
    assert again.pid == "later" and again.attempts == 2


async def test_empty_at_the_deadline_and_other_queues_do_not_answer(env: Env) -> None:
    c, m, _ = env
    t0 = time.monotonic()
    waiting = asyncio.create_task(c.lease("w#empty", 1, 30, wait_secs=0.4))
    await _parked(m, 1)
    await c.put("w#other", pid="x")  # another queue: a spurious wake at most
    assert await asyncio.wait_for(waiting, 5) == []
    assert time.monotonic() - t0 >= 0.39
    assert m.waiters.total == 0


async def test_bounds_per_queue_and_in_total(env: Env) -> None:
    c, m, _ = env
    parked = [asyncio.create_task(c.lease("w#b", 1, 30, wait_secs=10)) for _ in range(2)]
    await _parked(m, 2)
    with pytest.raises(Overloaded) as e:
        await c.lease("w#b", 1, 30, wait_secs=10)
    assert e.value.retry_after == 1
    parked.append(asyncio.create_task(c.lease("w#b2", 1, 30, wait_secs=10)))
    await _parked(m, 3)
    with pytest.raises(Unavailable):
        await c.lease("w#b3", 1, 30, wait_secs=10)
    assert await c.lease("w#b3", 1, 30) == []  # a lease that does not wait still works
    m.waiters.close()  # shutdown: every parked lease answers at once, empty
    assert await asyncio.wait_for(asyncio.gather(*parked), 5) == [[], [], []]
    assert m.waiters.total == 0


async def test_an_update_that_acks_and_waits_is_durable_before_it_parks(env: Env) -> None:
    """``lease(done=..., wait_secs=...)``: the dequeues are applied and durable at once, the
    lease then waits like any other; a wait the master refuses (too many parked) still
    answers the update, with nothing leased."""
    c, m, _ = env
    await c.put("w#u", pid="first")
    [first] = await c.lease("w#u", 1, 30)
    waiting = asyncio.create_task(c.lease("w#u", 5, 30, wait_secs=10, done=[first]))
    await _parked(m, 1)
    q = m.queue("w", "u")
    assert q is not None and (q.completed, q.leased, q.available) == (1, 0, 0)  # acked
    m.placement.require_receipts = False  # a payload reference without data nodes
    ref = PayloadRef(blob_id="blob-2", size=3, crc32c=7, replicas=["http://127.0.0.1:1"])
    await m.update("w", UpdateRequest(enqueue=[EnqueueItem(queue="u", pid="second",
                                                           payload=ref)]))
    [second] = await asyncio.wait_for(waiting, 5)
    assert second.pid == "second" and second.payload_ref is not None
    # the answer's one read token, as the update that waited got it, covers the payload
    assert tokens.verify(m.key, second.payload_ref.token, "read", "blob-2", m.clock.now())

    blockers = [asyncio.create_task(c.lease("w#u", 1, 30, wait_secs=10)) for _ in range(2)]
    await _parked(m, 2)  # the queue's limit of parked leases
    assert await c.lease("w#u", 1, 30, wait_secs=10, done=[second]) == []
    assert q.completed == 2 and m.waiters.total == 2
    m.waiters.close()
    assert await asyncio.wait_for(asyncio.gather(*blockers), 5) == [[], []]


@pytest.fixture
async def wide(tmp_path: Path) -> AsyncIterator[tuple[AsyncClient, Master, list[int]]]:
    """A master with room for many parked leases; counts every lease attempt."""
    settings = MasterSettings(data_dir=str(tmp_path / "m"), lease_waiters_per_queue=50,
                              lease_waiters_max=100, lease_wait_max_s=20.0)
    app = create_master_app(settings, clock=ManualClock(), background=False)
    async with app.router.lifespan_context(app), \
            AsyncClient("http://127.0.0.1", transport=httpx.ASGITransport(app=app),
                        retries=0) as c:
        m: Master = app.state.master
        tries = [0]
        real = m._lease_now

        async def counted(*a: Any) -> dict[str, Any]:
            tries[0] += 1
            return await real(*a)

        m._lease_now = counted  # type: ignore[method-assign]
        yield c, m, tries
        m.waiters.close()


async def test_a_new_task_wakes_one_parked_lease_not_all(wide) -> None:  # type: ignore[no-untyped-def]
    """20 parked leases and one new task: one lease attempt (two at most), not 20 (it was
    20, nearly all empty: with many Workers long-polling a queue, each task cost the master
    one lease per parked Worker). Three more tasks: about three more attempts; the rest
    stay parked."""
    c, m, tries = wide
    parked = [asyncio.create_task(c.lease("w#herd", 1, 30, wait_secs=15)) for _ in range(20)]
    await _parked(m, 20)
    before = tries[0]
    await c.put("w#herd", pid="t0")
    done, _ = await asyncio.wait(parked, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    await until(lambda: m.waiters.total == 19, 5, what="the other leases parked again")
    assert tries[0] - before <= 2 and m.waiters.attempts <= 2  # 1, but for batch timing
    assert [[t.pid for t in d.result()] for d in done] == [["t0"]]
    for i in range(1, 4):
        await c.put("w#herd", pid=f"t{i}")
    await until(lambda: m.waiters.total == 16, 5, what="three more answered")
    # answered on the master; their answers may still be on their way to the client
    await until(lambda: sum(p.done() for p in parked) >= 4, 5, what="four answers arrived")
    assert tries[0] - before <= 6
    got = sorted(t.pid for p in parked if p.done() for t in p.result())
    assert got == ["t0", "t1", "t2", "t3"]  # each task leased once
    m.waiters.close()
    rest = await asyncio.wait_for(asyncio.gather(*parked), 5)
    assert sum(len(r) for r in rest) == 4


async def test_a_wake_up_the_woken_lease_cannot_use_passes_on(wide) -> None:  # type: ignore[no-untyped-def]
    """The oldest parked lease excludes the new task (max_pid): it is woken first, leases
    nothing and wakes the next one, which takes the task at once (not at its deadline)."""
    c, m, _ = wide
    picky = asyncio.create_task(c.lease("w#pick", 1, 30, wait_secs=15, max_pid="b"))
    await _parked(m, 1)
    taker = asyncio.create_task(c.lease("w#pick", 1, 30, wait_secs=15))
    await _parked(m, 2)
    t0 = time.monotonic()
    await c.put("w#pick", pid="zz")
    [task] = await asyncio.wait_for(taker, 5)
    assert task.pid == "zz" and time.monotonic() - t0 < 5
    await until(lambda: m.waiters.total == 1, 5, what="the picky lease parked again")
    assert not picky.done()
    await c.put("w#pick", pid="a")  # one it takes
    assert [t.pid for t in await asyncio.wait_for(picky, 5)] == ["a"]


async def test_a_wake_up_of_a_lease_that_ends_first_passes_on() -> None:
    """Woken, then cancelled (its client went away) before it looked: the wake-up goes to
    the next parked lease, which leases the task."""
    tasks = ["t"]

    async def attempt() -> dict[str, Any]:
        return {"tasks": [tasks.pop()] if tasks else []}

    w = Waiters(available=lambda key: len(tasks))
    key = ("g", "q")
    tasks.clear()
    first = asyncio.create_task(w.wait(key, 10, attempt))
    await until(lambda: w.total == 1, 5, what="first parked")
    second = asyncio.create_task(w.wait(key, 10, attempt))
    await until(lambda: w.total == 2, 5, what="second parked")
    tasks.append("t")
    first.cancel()  # its client went away; it learns so once it runs, after this:
    w.notify([key])  # wakes the oldest only (one task): that wake-up must not be lost
    assert (await asyncio.wait_for(second, 5))["tasks"] == ["t"]
    with pytest.raises(asyncio.CancelledError):
        await first
    assert w.total == 0


def test_parked_lease_when_the_master_stops_or_dies(tmp_path: Path) -> None:
    master = MasterProcess(str(tmp_path / "m")).start()
    try:
        with Client(master.url, retries=0) as c:
            out: list[object] = []

            def lease() -> None:
                t0 = time.monotonic()
                try:
                    out.append(c.lease("w#r", 1, 30, wait_secs=20))
                except TransportError as e:
                    out.append(e)
                out.append(time.monotonic() - t0)

            def parked_then(stop: object) -> list[object]:
                out.clear()
                th = threading.Thread(target=lease)
                th.start()
                wait_for(lambda: "squall_lease_waiting 1.0" in httpx.get(
                    master.url + "/metrics", headers=ADMIN).text, 10, what="the lease to park")
                stop()  # type: ignore[operator]
                th.join(15)
                assert not th.is_alive()
                return list(out)

            # a graceful stop answers the parked lease at once, empty
            got, took = parked_then(master.stop)
            assert got == [] and took < 10
            master.fixed_port = True
            master.start()
            # SIGKILL: the connection breaks, the client gets a clean TransportError ...
            got, took = parked_then(master.kill9)
            assert isinstance(got, TransportError) and took < 10
            master.start()
            # ... and goes on against the restarted master
            c.put("w#r", pid="after")
            assert [t.pid for t in c.lease("w#r", 1, 30, wait_secs=5)] == ["after"]
    finally:
        master.stop()


async def test_a_task_committed_while_the_lease_looked_is_leased_without_parking() -> None:
    """A notification that arrives while the lease is being tried (its plan saw no task, the
    commit that adds one lands before it parks) makes it look again instead of parking:
    no notification comes later for that task, so a parked lease would sleep to its
    deadline with a task available."""
    tasks: list[str] = []
    w = Waiters()
    key = ("g", "q")
    tries = 0

    async def attempt() -> dict[str, Any]:
        nonlocal tries
        tries += 1
        found = [tasks.pop()] if tasks else []
        if tries == 1:  # planned on an empty queue; the enqueue commits meanwhile
            tasks.append("t")
            w.notify([key])
        return {"tasks": found}

    res = await asyncio.wait_for(w.wait(key, 20, attempt), 5)  # parked: waits 20 s
    assert res["tasks"] == ["t"] and tries == 2 and w.total == 0


async def test_a_lease_waits_at_most_the_masters_cap() -> None:
    """`wait_secs` is accepted up to an hour on the wire; the master holds the request at
    most its cap (`lease_wait_max_s`, 20 s by default) and answers empty then."""
    w = Waiters(cap_s=0.01)

    async def attempt() -> dict[str, Any]:
        return {"tasks": []}

    res = await asyncio.wait_for(w.wait(("g", "q"), 3600, attempt), 10)
    assert res["tasks"] == [] and w.total == 0
