"""The master's background work and checkpoints, mixed into :class:`Master`.

Background work (:meth:`tick`, every ``sweep_interval_s``), each step in bounded batches so
requests are never starved: the sweeper (expired leases, ended delays), settling pending
tasks past their deadline (master/tasks/pending.py), due schedules,
reaping deleted queue generations, dropping expired idempotency keys, the cluster's repair
slices, and retrying a failed WAL. Checkpoints sync the index, then drop the WAL segments
it covers.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import lmdb

from squall.common.errors import Unavailable
from squall.master.tasks import admin, pending

if TYPE_CHECKING:
    from squall.common.clock import Clock
    from squall.master.cluster.state import Cluster
    from squall.master.service import MasterSettings
    from squall.master.storage.commit import GroupCommit
    from squall.master.storage.index import Index
    from squall.master.storage.wal import WAL
    from squall.master.tasks.dedup import Dedup
    from squall.master.tasks.engine import Engine
    from squall.master.tasks.stats import Meters
    from squall.master.tasks.view import Plan
    from squall.master.tasks.waiters import Waiters

log = logging.getLogger("squall.master")
FREED_PER_TICK = 50_000


class Housekeeping:
    settings: MasterSettings
    clock: Clock
    index: Index
    engine: Engine
    dedup: Dedup
    commit: GroupCommit
    wal: WAL
    cluster: Cluster
    meters: Meters
    waiters: Waiters
    reaped: int
    last_checkpoint: float
    wal_bytes_since_checkpoint: int
    checkpoints: int
    _tasks: list[asyncio.Task[None]]

    if TYPE_CHECKING:  # the master's commit path
        async def _execute(self, build: Callable[[lmdb.Transaction], Plan],
                           sweep_first: bool = False) -> dict[str, Any]: ...

        def _woke(self, group: str, queues: Iterable[str]) -> None: ...

        def _after_settle(self, group: str, queues: dict[str, int]) -> None: ...

        def _plan_settle(self, group: str, items: list[pending.Settle],
                         txn: lmdb.Transaction) -> Plan: ...

    async def settle_pending(self, limit: int = 1000) -> int:
        """Housekeeping: decide the pending tasks past their deadline (pending.decide);
        those that cannot be decided yet come back after ``pending.RECHECK_MS``."""
        un = self.engine.unsettled
        if not un:
            return 0
        now = self.clock.now()
        by_group: dict[str, list[pending.Settle]] = {}
        for key in list(un)[:limit]:
            (group, queue, pid), (payload, enqueued_ms) = key, un.pop(key)
            if not payload.get("blob_id"):
                continue
            d = pending.decide(self.cluster, payload, enqueued_ms, now)
            if d is not False:
                by_group.setdefault(group, []).append(
                    pending.Settle(queue, pid, payload["blob_id"], d))
        n = 0
        for group, items in by_group.items():
            res = await self._execute(functools.partial(self._plan_settle, group, items))
            self._after_settle(group, res.pop("queues"))
            n += res["confirmed"] + res["removed"]
            if res["removed"]:
                log.info("removed %d pending task(s) of group %r whose payloads never "
                         "reached their write quorum", res["removed"], group)
        return n

    def sweep_once(self) -> int:
        """One sweep in its own transaction (tests; no request may be in flight)."""
        swept: list[tuple[str, str]] = []
        n = self.commit.run_sync(self._sweeper(swept))
        if swept:
            self.waiters.notify(swept)
        return n

    def _sweeper(self, swept: list[tuple[str, str]]) -> Callable[[lmdb.Transaction], int]:
        """A sweep that adds the queues it made tasks due in to `swept`: wake their parked
        leases once the sweep's batch is committed (visible), never before."""
        def sweep(txn: lmdb.Transaction) -> int:
            n = self.engine.sweep(txn, self.settings.sweep_batch)
            # expired leases, for metrics (a batch refused afterwards is counted all the same)
            self.meters.count("expire", self.engine.swept_expired)
            if n:
                swept.extend(self.engine.swept)
            return n
        return sweep

    async def _sweep_derived(self) -> int:
        """A background sweep in the current batch; wakes parked leases once committed."""
        swept: list[tuple[str, str]] = []
        n = await self._derived(self._sweeper(swept))
        if swept:
            self.waiters.notify(swept)
        return n

    def reap_once(self) -> int:
        """Reap one batch of a deleted queue generation (tests; no request in flight).
        Returns tasks reaped."""
        n = self.commit.run_sync(self._reap)
        self.reaped += n
        return n

    def _reap(self, txn: lmdb.Transaction) -> int:
        pending = self.index.pending_reap(txn)
        if pending is None:
            return 0
        return self.index.reap(txn, *pending, self.settings.reap_batch)

    def _reap_and_expire(self, txn: lmdb.Transaction) -> int:
        """Background cleanup in one derived step: reap a batch of a deleted queue
        generation, and drop a paced batch of expired idempotency keys."""
        n = self._reap(txn)
        self.dedup.sweep(txn, self.engine.now_ms())
        return n

    async def _derived(self, fn: Callable[[lmdb.Transaction], int]) -> int:
        """Unlogged derived work (sweeps, reaps) inside the current batch."""
        def work(txn: lmdb.Transaction, _ticket: int) -> tuple[None, int]:
            return None, fn(txn)

        _, n = await self.commit.run(work)
        return n

    async def fire_schedules(self) -> int:
        fired = 0
        for group, name in admin.due_schedules(self.engine):
            def fire(txn: lmdb.Transaction, g: str = group, n: str = name) -> Plan:
                return admin.plan_fire(self.engine, txn, g, n)

            res = await self._execute(fire)
            fired += sum(1 for e in res.get("enqueued", ()) if not e["collapsed"])
            self._woke(group, {e["queue"] for e in res.get("enqueued", ())})
        return fired

    async def tick(self) -> dict[str, int]:
        """One round of background work (tests call it after moving the clock)."""
        if self.wal.failure() is not None:
            await asyncio.to_thread(self.wal.retry)  # resumes by itself once the disk allows
        await self.commit.catch_up()
        if self.ready() is not None:
            if getattr(self, "ha", None) is not None:  # a set member that may be deposed:
                return {"swept": 0, "fired": 0, "reaped": 0}  # no repair or GC on old state
            return {"swept": 0, "fired": 0, "reaped": 0, **self.cluster.tick([])}
        try:
            swept = await self._sweep_derived()
            await self.settle_pending()  # pending tasks the sweep found past their deadline
            fired = await self.fire_schedules()
            reaped = await self._derived(self._reap_and_expire)
        except Unavailable:  # a refused batch (the disk failed meanwhile): next tick
            return {"swept": 0, "fired": 0, "reaped": 0, **self.cluster.tick([])}
        self.reaped += reaped
        for q in self.engine.flow.due(self.engine.now_ms()):  # rate limits: tokens came due
            self._woke(q.group, (q.name,))
        freed = self.index.freed[:FREED_PER_TICK]
        del self.index.freed[:FREED_PER_TICK]
        repair = self.cluster.tick(freed)
        return {"swept": swept, "fired": fired, "reaped": reaped, **repair}

    async def _background_loop(self) -> None:
        s = self.settings
        while True:
            t0 = time.monotonic()
            try:
                done = await self.tick()
            except Exception:
                log.exception("background work failed")
                done = {}
            if done.get("swept", 0) >= s.sweep_batch or self.index.freed:
                pause = 0.0  # expiries and frees are due now: go again once requests ran
            elif done.get("reaped", 0) > 0:
                pause = time.monotonic() - t0  # reaping is cleanup: at most half the loop
            else:
                pause = s.sweep_interval_s
            if done.get("backlog", 0):  # repair work left: its next slices meanwhile
                pause = await self._repair_slices(time.monotonic() + pause)
            await asyncio.sleep(pause)

    async def _repair_slices(self, until: float) -> float:
        """Slices of the cluster's repair work (examining, planning) one after the other,
        requests served between them, until none is left or `until`; the time left."""
        while time.monotonic() < until:
            await asyncio.sleep(0)
            if not self.cluster.tick([])["backlog"]:
                break
        return max(0.0, until - time.monotonic())

    def checkpoint(self) -> int:
        """Sync LMDB, then drop WAL segments it covers. Safe to crash at any point.

        Call from the event loop thread (between requests every applied ticket is committed).
        """
        self.wal.request_roll()
        return self._checkpoint_through(self.commit.committed_ticket)

    async def checkpoint_async(self) -> int:
        upto = self.commit.committed_ticket  # every batch up to it is committed
        self.wal.request_roll()
        return await asyncio.to_thread(self._checkpoint_through, upto)

    def _checkpoint_through(self, upto: int) -> int:
        ha = getattr(self, "ha", None)
        if ha is not None:  # a master set: keep what a lagging member still needs
            upto = min(upto, ha.droppable())
        self.index.sync()
        dropped = self.wal.drop_through(upto)
        self.last_checkpoint = time.monotonic()
        self.wal_bytes_since_checkpoint = 0
        self.checkpoints += 1
        return dropped

    async def _checkpoint_loop(self) -> None:
        s = self.settings
        while True:
            await asyncio.sleep(min(1.0, s.checkpoint_interval_s))
            due = time.monotonic() - self.last_checkpoint >= s.checkpoint_interval_s
            if due or self.wal_bytes_since_checkpoint >= s.checkpoint_wal_bytes:
                try:
                    await self.checkpoint_async()
                except Exception:
                    log.exception("checkpoint failed")

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._background_loop(), name="background"),
                       asyncio.create_task(self._checkpoint_loop(), name="checkpoint")]

    async def stop(self) -> None:
        self.waiters.close()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    def ready(self) -> str | None:
        """Why this master cannot accept writes right now, or None."""
        return self.commit.stalled or self.commit.wal.failure()
