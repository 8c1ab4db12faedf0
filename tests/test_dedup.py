"""Enqueue idempotency keys (master/dedup.py): at most once per (group, key) within the
retention window, even after the task was dequeued; other groups, expired keys and
keyless enqueues are not deduplicated; the window survives a restart; expired records
are swept."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from squall.client import AsyncClient, NewTask
from squall.common.clock import ManualClock
from squall.master.app import create_master_app
from squall.master.service import Master, MasterSettings


@asynccontextmanager
async def master(data_dir: Path, clock: ManualClock
                 ) -> AsyncIterator[tuple[AsyncClient, Master]]:
    app = create_master_app(MasterSettings(data_dir=str(data_dir), dedup_retention_s=300),
                            clock=clock, background=False)
    async with app.router.lifespan_context(app), \
            AsyncClient("http://m", transport=httpx.ASGITransport(app=app)) as c:
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
