"""Enqueue idempotency keys (master/tasks/dedup.py): at most once per (group, key) within the
retention window, even after the task was dequeued; other groups, expired keys and
keyless enqueues are not deduplicated; the window survives a restart; expired records
are swept; a refused enqueue records no key; op K replays idempotently."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import msgpack

from squall.client import AsyncClient, NewTask
from squall.common.clock import ManualClock
from squall.common.errors import Unavailable
from squall.common.wire.models import TaskSpec
from squall.master.http.app import create_master_app
from squall.master.service import Master, MasterSettings
from squall.master.storage.ops import replay
from squall.master.storage.walfile import read_records
from tests.crashkit import dump_index, kill9


@asynccontextmanager
async def master(data_dir: Path, clock: ManualClock
                 ) -> AsyncIterator[tuple[AsyncClient, Master]]:
    app = create_master_app(MasterSettings(data_dir=str(data_dir), dedup_retention_s=300),
                            clock=clock, background=False)
    async with app.router.lifespan_context(app), \
            AsyncClient("http://127.0.0.1", transport=httpx.ASGITransport(app=app)) as c:
        yield c, app.state.master


async def test_idempotency_keys(tmp_path: Path) -> None:
    clock = ManualClock()
    async with master(tmp_path / "m", clock) as (c, m):
        first = await c.put("d#q", idempotency_key="order-1")
        assert not first.collapsed
        [t] = await c.lease("d#q", 10)
        await t.done()  # consumed: pid collapse alone would enqueue a resend again
        again = await c.put("d#q", idempotency_key="order-1")  # a new client-made pid
        assert again.collapsed and again.pid == first.pid
        assert (await c.stats("d#q")).total == 0
        # whatever the resend's queue: the first enqueue's answer
        other_q = await c.put("d#other", pid="zzz", idempotency_key="order-1")
        assert (other_q.queue, other_q.pid, other_q.collapsed) == ("d#q", first.pid, True)
        # another group, or no key: not deduplicated
        assert not (await c.put("e#q", idempotency_key="order-1")).collapsed
        assert not (await c.put("d#q")).collapsed
        # one request using a key twice: the second collapses into the first
        n = await c.put_many("d#many", [NewTask(pid="a", idempotency_key="k"),
                                        NewTask(pid="b", idempotency_key="k")])
        assert n == 1 and [x.pid for x in await c.tasks("d#many")] == ["a"]
    async with master(tmp_path / "m", clock) as (c, m):  # the window survives a restart
        assert (await c.put("d#q", idempotency_key="order-1")).collapsed
        clock.advance(301)  # past the window: applied again, as new
        assert not (await c.put("d#q", idempotency_key="order-1")).collapsed
        clock.advance(301)
        await m.tick()  # the paced sweep drops expired records
        with m.index.env.begin() as txn:
            assert txn.stat(m.engine.dedup.db)["entries"] == 0  # type: ignore[union-attr]


def _full_disk(fd: int, data: Any) -> int:
    raise OSError(errno.ENOSPC, "No space left on device")


async def test_a_refused_enqueue_records_no_key_and_keys_replay_idempotently(
        tmp_path: Path) -> None:
    clock = ManualClock()
    settings = MasterSettings(data_dir=str(tmp_path / "m"), require_receipts=False)
    m = Master(settings, clock)
    try:
        before = dump_index(m)
        m.wal._os_write = _full_disk  # type: ignore[method-assign]
        refused = await asyncio.gather(
            m.enqueue("d", "q", [TaskSpec(pid="a", idempotency_key="k")]),
            m.enqueue("d", "q", [TaskSpec(pid="b", idempotency_key="k")]),
            return_exceptions=True)
        assert all(isinstance(a, Unavailable) for a in refused), refused
        assert dump_index(m) == before  # no task, no key: a resend is applied as new
        m.wal._os_write = os.write  # type: ignore[method-assign]
        await m.tick()
        assert m.ready() is None
        # two enqueues with one key in one group commit: the second sees the first's key
        first, second = await asyncio.gather(
            m.enqueue("d", "q", [TaskSpec(pid="a", idempotency_key="k")]),
            m.enqueue("d", "q", [TaskSpec(pid="b", idempotency_key="k")]))
        assert first["enqueued"][0]["collapsed"] is False
        assert second["enqueued"][0] == {"queue": "q", "pid": "a", "collapsed": True}
        after = dump_index(m)
        assert len(after["dedup"]) == 1
    finally:
        kill9(m)
    # the index lost: the whole WAL replays onto an empty one, then once more on top
    shutil.rmtree(tmp_path / "m" / "index")
    m2 = Master(settings, clock)
    try:
        assert m2.replayed > 0 and dump_index(m2)["dedup"] == after["dedup"]
        records, _ = read_records(m2.wal_dir, after=0)
        m2.commit.run_sync(lambda txn: replay(
            m2.index, txn, [(t, msgpack.unpackb(body)) for t, body in records]))
        assert dump_index(m2)["dedup"] == after["dedup"]
        q = m2.queue("d", "q")
        assert q is not None and q.available == 1
    finally:
        m2.close()
