"""The master service: recovery, the commit path, checkpoints and the sweeper.

Commit path of every mutating request (all on the event loop thread, so requests are
serialised without locks)::

    one LMDB write txn: plan (read + validate) -> apply ops, meta/applied = ticket -> commit
    WAL.append(ticket, ops)        # queued for the writer thread
    await WAL.durable(ticket)      # group commit: one fdatasync for everyone waiting
    answer

A request that changed nothing (all pids collapsed, an empty lease) still waits for the
WAL's current tail, so it never reports state that could vanish in a crash.

Recovery: open LMDB (its ``applied`` ticket says how far it got), replay WAL records after
it in large transactions, and resume appending after the larger of the two tickets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import lmdb
import msgpack

from squall.common.clock import Clock, SystemClock
from squall.common.errors import StatusError, Unavailable
from squall.common.models import LeaseRequest, TaskSpec, UpdateRequest
from squall.common.names import check_name
from squall.master.engine import Engine, Plan
from squall.master.index import Index, QueueRec, apply
from squall.master.wal import WAL, Tail, read_records

log = logging.getLogger("squall.master")
REPLAY_TXN_RECORDS = 5000


@dataclass
class MasterSettings:
    data_dir: str
    fsync: bool = True
    segment_bytes: int = 64 << 20
    checkpoint_interval_s: float = 30.0
    checkpoint_wal_bytes: int = 256 << 20
    sweep_interval_s: float = 0.1
    sweep_batch: int = 2000
    map_size: int = 1 << 38
    max_body_bytes: int = 16 << 20


class Master:
    def __init__(self, settings: MasterSettings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        os.makedirs(settings.data_dir, exist_ok=True)
        self.wal_dir = os.path.join(settings.data_dir, "wal")
        os.makedirs(self.wal_dir, exist_ok=True)
        t0 = time.monotonic()
        self.index = Index(os.path.join(settings.data_dir, "index"), settings.map_size)
        self.engine = Engine(self.index, self.clock)
        records, tail = read_records(self.wal_dir, after=self.index.applied)
        self.replayed = self._replay(records)
        self.wal = WAL(self.wal_dir, Tail(max(tail.last_ticket, self.index.applied),
                                          tail.path, tail.offset),
                       segment_bytes=settings.segment_bytes, fsync=settings.fsync)
        self.recovery_secs = time.monotonic() - t0
        self.last_checkpoint = time.monotonic()
        self.wal_bytes_since_checkpoint = 0
        self.checkpoints = 0
        self._tasks: list[asyncio.Task[None]] = []
        log.info("recovered: %d WAL records replayed in %.2fs, at ticket %d",
                 self.replayed, self.recovery_secs, self.wal.last_ticket)

    def _replay(self, records: list[tuple[int, bytes]]) -> int:
        for i in range(0, len(records), REPLAY_TXN_RECORDS):
            with self.index.env.begin(write=True) as txn:
                for ticket, body in records[i : i + REPLAY_TXN_RECORDS]:
                    apply(self.index, txn, msgpack.unpackb(body), ticket)
        return len(records)

    # -- commit path ---------------------------------------------------------------------
    async def _execute(self, build: Callable[[lmdb.Transaction], Plan]) -> dict[str, Any]:
        ticket = self.wal.next_ticket()
        try:
            with self.index.env.begin(write=True) as txn:
                plan = build(txn)
                if plan.ops:
                    self.engine.apply(txn, plan.ops, ticket)
        except StatusError:
            raise
        except lmdb.Error as e:
            self.index.reload()
            raise Unavailable(f"index write failed ({e}); retry later") from e
        except BaseException:
            self.index.reload()
            raise
        if plan.ops:
            body = msgpack.packb(plan.ops)
            self.wal.append(ticket, body)
            self.wal_bytes_since_checkpoint += len(body)
            await self.wal.durable(ticket)
        else:
            await self.wal.durable(self.wal.last_ticket)
            ticket = 0
        plan.result["ticket"] = ticket
        return plan.result

    async def update(self, group: str, req: UpdateRequest) -> dict[str, Any]:
        return await self._execute(lambda txn: self.engine.plan_update(txn, group, req))

    async def enqueue(self, group: str, queue: str, tasks: list[TaskSpec]) -> dict[str, Any]:
        return await self._execute(lambda txn: self.engine.plan_enqueue(txn, group, queue, tasks))

    async def lease(self, group: str, queue: str, req: LeaseRequest, addr: str) -> dict[str, Any]:
        def build(txn: lmdb.Transaction) -> Plan:
            self.engine.sweep(txn, self.settings.sweep_batch)
            return self.engine.plan_lease(txn, group, queue, req, addr)

        return await self._execute(build)

    # -- reads ---------------------------------------------------------------------------
    def task_info(self, group: str, queue: str, pid: str) -> dict[str, Any]:
        with self.index.env.begin() as txn:
            return self.engine.task_info(txn, group, queue, pid)

    def queue(self, group: str, queue: str) -> QueueRec | None:
        return self.index.queues.get((check_name("group", group), check_name("queue", queue)))

    # -- background ----------------------------------------------------------------------
    def sweep_once(self) -> int:
        with self.index.env.begin(write=True) as txn:
            return self.engine.sweep(txn, self.settings.sweep_batch)

    def checkpoint(self) -> int:
        """Sync LMDB, then drop WAL segments it covers. Safe to crash at any point.

        Call from the event loop thread (between requests every applied ticket is committed).
        """
        self.wal.request_roll()
        return self._checkpoint_through(self.index.applied)

    async def checkpoint_async(self) -> int:
        upto = self.index.applied  # read on the loop thread: all txns up to it are committed
        self.wal.request_roll()
        return await asyncio.to_thread(self._checkpoint_through, upto)

    def _checkpoint_through(self, upto: int) -> int:
        self.index.sync()
        dropped = self.wal.drop_through(upto)
        self.last_checkpoint = time.monotonic()
        self.wal_bytes_since_checkpoint = 0
        self.checkpoints += 1
        return dropped

    async def _sweep_loop(self) -> None:
        while True:
            try:
                n = self.sweep_once()
            except Exception:
                log.exception("sweep failed")
                n = 0
            # a full batch means more is due: go again right away, but let requests in first
            await asyncio.sleep(0 if n >= self.settings.sweep_batch else
                                self.settings.sweep_interval_s)

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
        self._tasks = [asyncio.create_task(self._sweep_loop(), name="sweep"),
                       asyncio.create_task(self._checkpoint_loop(), name="checkpoint")]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    def close(self) -> None:
        self.wal.flush()
        self.wal.close()
        self.index.sync()
        self.index.close()
