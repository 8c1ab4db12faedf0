"""The master's group commit (master/commit.py): what a batch commits, and when it may skip
the commit altogether. (Refusals and disk faults: test_refused.py; the log: test_wal.py.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from squall.common.clock import ManualClock
from squall.common.models import LeaseRequest, TaskSpec
from squall.master.records import LEASED
from squall.master.service import Master, MasterSettings

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
        # once close() has begun, give it the chance to run ahead of the flush (it must
        # not: it would drop the spare before the flush begins one), then let the flush go
        deadline = time.monotonic() + 10
        while not m.commit._closed and time.monotonic() < deadline:
            time.sleep(0.001)
        closer.join(0.2)
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
