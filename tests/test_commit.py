"""The master's group commit (master/storage/commit.py): what a batch commits, and when it may skip
the commit altogether. (Refusals and disk faults: test_refused.py; the log: test_wal.py.)"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from squall.common.clock import ManualClock
from squall.common.wire.models import LeaseRequest, TaskSpec
from squall.master.service import Master, MasterSettings
from squall.master.storage.records import LEASED, task_key
from tests.crashkit import kill9, restore_index, snapshot_index
from tests.helpers import asgi_master, wait_for

G = "g"


@pytest.fixture
def master(tmp_path: Path) -> Iterator[Master]:
    m = Master(MasterSettings(data_dir=str(tmp_path / "m"), require_receipts=False),
               ManualClock(1_000_000.0))
    yield m
    m.close()


def _committed_state(m: Master, queue: str, pid: str) -> int:
    """The task's state as a reader sees it: committed index pages only."""
    q = m.queue(G, queue)
    assert q is not None
    with m.index.env.begin() as txn:
        return next(t.state for t in m.index.iter_tasks(txn, q, limit=10) if t.pid == pid)


async def test_a_lease_that_changes_nothing_commits_nothing_and_a_sweep_that_does_commits(
        master: Master) -> None:
    m = master
    await m.enqueue(G, "a", [TaskSpec(pid="x")])
    batches, syncs = m.commit.batches, m.wal.syncs
    for _ in range(3):  # empty leases: no WAL record, no index commit, no thread hop
        res = await m.lease(G, "none", LeaseRequest(max_tasks=5), "w")
        assert res["tasks"] == [] and res["ticket"] == 0
    assert (m.commit.batches, m.wal.syncs) == (batches, syncs)
    assert m.commit._spare is not None  # the clean transaction begins the next batch

    res = await m.lease(G, "a", LeaseRequest(max_tasks=1, lease_secs=10), "w")
    assert [t["pid"] for t in res["tasks"]] == ["x"]
    assert m.commit.batches == batches + 1 and _committed_state(m, "a", "x") == LEASED

    # the lease ends; an otherwise empty lease on another queue sweeps it back: an unlogged
    # change, which must be committed (a reader sees it) although nothing was logged
    m.clock.advance(20)  # type: ignore[attr-defined]
    res = await m.lease(G, "none", LeaseRequest(max_tasks=1), "w")
    assert res["tasks"] == []
    assert m.commit.batches == batches + 2
    assert _committed_state(m, "a", "x") != LEASED
    assert (await m.lease(G, "a", LeaseRequest(max_tasks=1), "w"))["tasks"][0]["pid"] == "x"


async def test_closing_while_a_flush_is_on_the_commit_thread_leaves_no_transaction(
        tmp_path: Path) -> None:
    """close() while a batch's flush is still on the commit thread, before its WAL write:
    the flush ends first (durable, answered) and begins the next batch's transaction, which
    close() then aborts on that thread; a transaction left open would keep the index from
    closing (close hangs), and a WAL closed under the flush would refuse it."""
    m = Master(MasterSettings(data_dir=str(tmp_path / "m"), require_receipts=False),
               ManualClock(1_000_000.0))
    entered, go = threading.Event(), threading.Event()
    write_group = m.wal.write_group

    def held(records: list[tuple[int, bytes]]) -> None:
        entered.set()
        go.wait(10)
        write_group(records)

    m.wal.write_group = held  # type: ignore[method-assign]
    put = asyncio.ensure_future(m.enqueue(G, "a", [TaskSpec(pid="x")]))
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, entered.wait, 10)
    closer = threading.Thread(target=m.close, daemon=True)  # waits for the commit thread
    closer.start()

    def release() -> None:
        # once close() has gone as far as it can (its drop of the spare queued on the
        # commit thread, behind the flush: run ahead of it, it would drop the spare before
        # the flush begins one), let the flush go
        try:
            wait_for(lambda: m.commit._closed and m.commit._thread._work_queue.qsize() > 0,
                     10, interval=0.001, what="close() waiting behind the flush")
        finally:
            go.set()

    helper = threading.Thread(target=release, daemon=True)
    helper.start()
    await loop.run_in_executor(None, closer.join, 20)
    helper.join(10)
    assert not closer.is_alive(), "close() hung: a transaction was left open"
    assert m.commit._spare is None
    res = await asyncio.wait_for(put, 10)  # the flush in flight was durable, and answered
    assert res["enqueued"][0]["pid"] == "x"
    assert m.wal.durable_ticket >= 1


def _hold_index_commits(m: Master) -> threading.Event:
    """Make the master's index commits wait until the returned event is set."""
    gate = threading.Event()
    real = m.commit._commit_txn

    def held(txn: Any) -> None:
        assert gate.wait(30), "the test never let the index commit run"
        real(txn)

    m.commit._commit_txn = held  # type: ignore[method-assign]
    return gate


def _in_index(m: Master, queue: str, pid: str) -> bool:
    """Whether the committed index pages hold the task (what a new reader sees)."""
    q = m.queue(G, queue)
    assert q is not None
    with m.index.env.begin() as txn:
        return txn.get(task_key(q.qid, q.gen, pid.encode()), db=m.index.tasks) is not None


async def test_an_http_write_is_answered_once_durable_and_reads_wait_for_its_index_commit(
        master_settings: MasterSettings, clock: ManualClock, fast_dispatch: bool) -> None:
    """Over HTTP (both dispatch paths: the route's handler asks for it) a write is answered
    as soon as its WAL record is durable, while its index commit runs; a read that comes
    after the answer waits for that commit, so it sees the write. Without the early answer
    the put below waits for the gate."""
    async with asgi_master(master_settings, clock, fast_dispatch) as (c, m):
        await _answered_once_durable(c, m)


async def _answered_once_durable(c: httpx.AsyncClient, m: Master) -> None:
    gate = _hold_index_commits(m)
    try:
        syncs = m.wal.syncs
        r = await asyncio.wait_for(
            c.post(f"/v1/groups/{G}/queues/q/tasks", json={"tasks": [{"pid": "a"}]}), 20)
        assert r.status_code == 200 and r.json()["ticket"] > 0
        assert m.wal.syncs == syncs + 1  # durable in the WAL ...
        assert not _in_index(m, "q", "a")  # ... and answered before its index commit
        reads = [asyncio.ensure_future(c.get(f"/v1/groups/{G}/queues/q/tasks/a")),
                 asyncio.ensure_future(c.get(f"/v1/groups/{G}/queues/q/tasks")),
                 asyncio.ensure_future(c.get(f"/v1/groups/{G}/queues/q"))]
        done, _ = await asyncio.wait(reads, timeout=0.2)
        assert not done, "a read did not wait for the index commit of an answered write"
    finally:
        gate.set()
    info, listing, stats = [await asyncio.wait_for(x, 20) for x in reads]
    assert info.status_code == 200 and info.json()["state"] == "available"
    assert [t["pid"] for t in listing.json()["tasks"]] == ["a"]
    assert stats.json()["available"] == 1 and _in_index(m, "q", "a")


async def test_in_process_callers_return_once_the_index_is_committed(master: Master) -> None:
    """Outside the HTTP layer (tests, tools) a write returns once its batch is committed to
    the index as well, and reads right after it need no wait."""
    m = master
    gate = _hold_index_commits(m)
    put = asyncio.ensure_future(m.enqueue(G, "q", [TaskSpec(pid="a")]))
    done, _ = await asyncio.wait([put], timeout=0.2)
    assert not done and not _in_index(m, "q", "a")
    gate.set()
    assert (await asyncio.wait_for(put, 20))["ticket"] > 0 and _in_index(m, "q", "a")
    gate.clear()  # the HTTP routes' writes answer once durable in the WAL
    res = await asyncio.wait_for(
        m.enqueue(G, "q", [TaskSpec(pid="b")], answer_when_durable=True), 20)
    assert res["ticket"] > 0 and not _in_index(m, "q", "b")
    gate.set()
    await m.commit.settled()
    assert _in_index(m, "q", "b")


async def test_a_write_answered_before_its_index_commit_survives_losing_that_commit(
        tmp_path: Path) -> None:
    """Answered once durable in the WAL, then the index commit is lost (a crash, or a power
    loss that takes the index back): the restarted master replays the record."""
    data_dir = str(tmp_path / "m")
    settings = MasterSettings(data_dir=data_dir, require_receipts=False)
    clock = ManualClock(1_000_000.0)
    m = Master(settings, clock)
    await m.enqueue(G, "q", [TaskSpec(pid="before")])
    m.index.sync()
    snap = str(tmp_path / "index.snap")
    snapshot_index(data_dir, snap)
    gate = _hold_index_commits(m)
    res = await asyncio.wait_for(
        m.enqueue(G, "q", [TaskSpec(pid="answered")], answer_when_durable=True), 20)
    assert res["ticket"] > 0 and not _in_index(m, "q", "answered")
    gate.set()
    kill9(m)
    restore_index(data_dir, snap)  # the index as it was before that commit
    m2 = Master(settings, clock)
    try:
        assert m2.replayed >= 1
        q = m2.queue(G, "q")
        assert q is not None and q.available == 2 and _in_index(m2, "q", "answered")
    finally:
        m2.close()
