"""The worker runtime against an in-process master (background sweeper on): burst mode with
async and sync handlers, retries and dead letters, follow-up tasks, lease renewal, graceful
stop, queue selection."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import squall.client as sc
from squall.client import AsyncClient, NewTask, Worker
from squall.client.worker.handlers import describe_error
from squall.master.http.app import create_master_app
from squall.master.service import MasterSettings
from tests.helpers import until

FAST_RETRY = {"max_attempts": 3, "backoff": {"base_secs": 0.01, "cap_secs": 0.02}}


@pytest.fixture
async def client(tmp_path) -> AsyncIterator[AsyncClient]:  # type: ignore[no-untyped-def]
    settings = MasterSettings(data_dir=str(tmp_path / "m"), sweep_interval_s=0.02)
    app = create_master_app(settings)
    async with app.router.lifespan_context(app), \
            AsyncClient("http://127.0.0.1", transport=httpx.ASGITransport(app=app)) as c:
        yield c


async def run(w: Worker, timeout: float = 60.0) -> sc.client.worker.runtime.WorkerStats:  # type: ignore[name-defined]
    return await asyncio.wait_for(w.arun(install_signals=False), timeout)


async def test_burst_async_handler(client: AsyncClient) -> None:
    await client.put_many("w#a", [NewTask(pid=f"{i:03d}") for i in range(200)])
    seen: list[str] = []
    active = peak = 0

    async def handler(task: sc.AsyncLeasedTask) -> None:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        assert await task.payload() == b""
        await asyncio.sleep(0)
        seen.append(task.pid)
        active -= 1

    stats = await run(Worker(client, ["w#a"], handler, concurrency=8, burst=True))
    assert stats.done == 200 and stats.failed == stats.lost == 0
    assert sorted(seen) == [f"{i:03d}" for i in range(200)] and 1 < peak <= 8
    assert (await client.stats("w#a")).total == 0


async def test_burst_sync_handler_in_threads(client: AsyncClient) -> None:
    await client.put_many("w#s", [NewTask(pid=f"{i:03d}") for i in range(50)])
    threads: set[str] = set()
    lock = threading.Lock()

    def handler(task: sc.LeasedTask) -> None:
        assert isinstance(task, sc.LeasedTask)
        assert task.payload() == b""  # the blocking verbs go through the worker's loop
        task.renew(30)
        with lock:
            threads.add(threading.current_thread().name)

    stats = await run(Worker(client, "w#s", handler, concurrency=4, burst=True))
    assert stats.done == 50
    assert threads and all(n.startswith("squall-worker") for n in threads)


async def test_failures_retry_then_dead_letter(client: AsyncClient) -> None:
    await client.set_policy("w#f", **FAST_RETRY)
    await client.put_many("w#f", [NewTask(pid=p) for p in ("bad", "flaky", "good")])
    attempts: dict[str, list[int]] = {}

    async def handler(task: sc.AsyncLeasedTask) -> None:
        attempts.setdefault(task.pid, []).append(task.attempts)
        if task.pid == "bad" or (task.pid == "flaky" and task.attempts == 1):
            raise RuntimeError(f"cannot do {task.pid}")

    stats = await run(Worker(client, ["w#f"], handler, burst=True))
    assert attempts == {"bad": [1, 2, 3], "flaky": [1, 2], "good": [1]}
    assert stats.done == 2 and stats.failed == 4
    [dead] = await client.dead_letters("w#f")
    assert dead.pid == "bad" and dead.attempts == 3
    # the reason leads with `Type: message` (what one-line views show); the traceback below
    assert (dead.error or "").splitlines()[0] == "RuntimeError: cannot do bad"
    assert "Traceback" in (dead.error or "")


def test_a_reason_leads_with_type_and_message_and_stays_bounded() -> None:
    class Custom(Exception):
        pass

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        raise Custom("first line\nsecond line")

    try:
        deep(200)
    except Custom as e:
        text = describe_error(e, limit=500)
    head, _, rest = text.partition("\n")
    assert head.endswith("Custom: first line") and len(text) <= 500
    assert rest.startswith("…") and rest.rstrip().endswith("second line")
    assert describe_error(ValueError()).splitlines()[0] == "ValueError"


async def test_follow_ups_are_atomic_with_the_dequeue(client: AsyncClient) -> None:
    await client.put_many("pipe#one", [NewTask(pid=f"{i}") for i in range(20)])
    await client.set_policy("pipe#one", max_attempts=1)

    async def stage(task: sc.AsyncLeasedTask) -> Any:
        if task.pid == "13":
            return ("elsewhere#two", None)  # another group: cannot be atomic
        return [NewTask(pid=task.pid + "!", queue="two"), ("pipe#log", None)]

    stats = await run(Worker(client, ["pipe#one"], stage, burst=True))
    assert stats.done == 19 and stats.failed == 1
    two = await client.tasks("pipe#two", limit=100)
    assert sorted(t.pid for t in two) == sorted(f"{i}!" for i in range(20) if i != 13)
    assert (await client.stats("pipe#log")).total == 19
    [dead] = await client.dead_letters("pipe#one")
    assert dead.pid == "13" and "not in group" in (dead.error or "")


async def test_long_task_keeps_its_lease(client: AsyncClient) -> None:
    await client.put("w#long", pid="slow")
    renewals: list[float] = []

    async def handler(task: sc.AsyncLeasedTask) -> None:
        first = task.expires_at

        def renewed_three_times() -> bool:
            if task.expires_at != (renewals[-1] if renewals else first):
                renewals.append(task.expires_at)
            return len(renewals) >= 3

        await until(renewed_three_times, 30, interval=0.01, what="three lease renewals")

    stats = await run(Worker(client, ["w#long"], handler, lease_secs=1.5, burst=True))
    assert stats.done == 1 and stats.lost == 0 and stats.leased == 1
    assert len(renewals) == 3


async def test_graceful_stop_gives_running_tasks_back(client: AsyncClient) -> None:
    await client.put_many("w#stop", [NewTask(pid="a"), NewTask(pid="b")])
    started = asyncio.Event()
    release = asyncio.Event()

    async def handler(task: sc.AsyncLeasedTask) -> None:
        if task.pid == "a":
            return
        started.set()
        await release.wait()  # never set: stuck until cancelled

    w = Worker(client, ["w#stop"], handler, grace_s=0.05)
    runner = asyncio.create_task(w.arun(install_signals=False))
    await asyncio.wait_for(started.wait(), 30)
    w.stop()
    stats = await asyncio.wait_for(runner, 30)
    assert stats.done == 1 and stats.released == 1
    info = await client.task("w#stop", "b")
    assert info.state == "available" and info.attempts == 1


async def test_queue_selection_priority_list_and_regex(client: AsyncClient) -> None:
    await client.put_many("sel#lo", [NewTask(pid=f"l{i}") for i in range(5)])
    await client.put_many("sel#hi", [NewTask(pid=f"h{i}") for i in range(5)])
    await client.put("other#x", pid="x")
    order: list[str] = []

    async def handler(task: sc.AsyncLeasedTask) -> None:
        order.append(task.pid)

    await run(Worker(client, ["sel#hi", "sel#lo"], handler, concurrency=1, burst=True))
    assert order == [f"h{i}" for i in range(5)] + [f"l{i}" for i in range(5)]
    await client.put_many("sel#lo", [NewTask(pid="again")])
    await client.put_many("sel#lo.dead", [NewTask(pid="dead")])
    order.clear()
    await run(Worker(client, re.compile(r"^sel#"), handler, burst=True))
    assert order == ["again"]  # not other#x, and not a dead-letter queue
    assert (await client.stats("other#x")).total == 1
