"""The worker runtime: lease tasks, run a handler on each with bounded concurrency, keep the
leases alive, and dequeue or release them.

One implementation, on asyncio: async handlers run on the loop, sync handlers in a thread
pool of ``concurrency`` threads (their task objects talk to the same client through the
loop, see :class:`Bridge`). The pieces, each a small coroutine:

- lease loop: up to the free slots in one lease, from the queues in priority order (a
  list) or from every queue matching a regex (rediscovered every ``discover_interval_s``),
  small payloads read with the lease (one batch read per data node); with one queue it
  waits on the master (``wait_s``, long polling) instead of polling, otherwise it backs
  off exponentially while idle;
- one coroutine per task: run the handler, then hand the outcome to the acker;
- acker: dequeues finished tasks together with the follow-up tasks their handlers
  returned, one atomic update per group for everything that finished within
  ``ack_linger_s`` or while the previous update was in flight, or in the next lease's
  update (a finished task frees its slot while its ack is on its way, so the lease that
  fills the slot carries the ack; at most 2 x ``concurrency`` tasks are held in all); a
  task is counted done only once its update is durable. An update the master refused is
  retried task by task, so one lost lease never blocks the others; one that could not
  reach the master (restart) is retried as it is while the leases last (then the results
  are dropped: ``lost``);
- renewer: renews every lease in flight when a third of ``lease_secs`` has passed since
  its last renewal, so a long task never loses its lease while its worker lives (on
  ``clock``, ``time.monotonic`` unless a test gives its own);
- failures: the task is released with the error; the master applies the queue's retry
  backoff and moves it to the dead-letter queue after ``max_attempts`` (see policies).

Stopping (SIGTERM / SIGINT, :meth:`Worker.stop`, or a drained queue in ``burst`` mode):
no new leases; handlers get ``grace_s`` to finish; tasks still running then are released
(available again at once); a second signal stops at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import re
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from squall.client import _trace
from squall.client._tasks import TaskBase
from squall.client.worker.acker import Acker
from squall.client.worker.handlers import Handler, describe_error, followups, is_async
from squall.client.worker.threads import Bridge, DaemonPool, async_twin, loop_factory
from squall.common.errors import Conflict, NotFound, SquallError
from squall.common.wire.models import MAX_BATCH
from squall.common.wire.models import LeasedTask as WireTask
from squall.common.wire.names import split_queue

if TYPE_CHECKING:
    from squall.client._async import AsyncClient
    from squall.client._sync import Client

log = logging.getLogger("squall.worker")


@dataclass
class WorkerStats:
    """What happened to the tasks a worker leased.

    - ``done``: the handler returned and the dequeue (with its follow-ups) is durable.
    - ``failed``: the handler raised; the task was released with the error (it counts
      toward the queue's ``max_attempts``). Only the handler's own failures count here: a
      dequeue that the master could not take (restarting, unreachable) is retried while
      the lease lasts and is never reported as a failure.
    - ``lost``: the result was dropped because the lease was lost (expired and leased
      again, reset) or ran out while the master was unreachable; the task runs again.
    - ``released``: given back unfinished at shutdown.
    """

    leased: int = 0
    done: int = 0
    failed: int = 0
    lost: int = 0
    released: int = 0


async def renew(client: AsyncClient, tasks: list[TaskBase], lease_secs: float, now: float,
                lost: set[int]) -> None:
    """Renew the leases of `tasks` in one update; when it is refused, one task at a time,
    so one lost lease (added to `lost` by id) does not keep the others from being renewed.
    Other failures (the master away) are logged: the next pass tries again."""
    try:
        await client._run(client._core.renew(tasks, lease_secs))
    except SquallError as e:
        if len(tasks) > 1:
            for t in tasks:
                await renew(client, [t], lease_secs, now, lost)
            return
        t = tasks[0]
        if isinstance(e, NotFound | Conflict):
            if not t.finished:
                log.warning("task %s %r: lease lost (%s)", t.queue, t.pid, e)
                lost.add(id(t))
        else:
            log.warning("renewing %s %r failed, will retry: %s", t.queue, t.pid, e)
        return
    for t in tasks:
        t.leased_at = now


async def queues_empty(client: AsyncClient, names: Callable[[], Awaitable[list[str]]],
                       pattern: bool) -> bool:
    """Burst mode's end: none of the queues holds a task (available, leased or delayed);
    with a pattern, none matches any more."""
    try:
        found = await names()
        if pattern:
            return not found
        for q in found:
            try:
                if (await client.stats(q)).total:
                    return False
            except NotFound:
                continue
    except SquallError as e:
        log.warning("checking for remaining tasks failed: %s", e)
        return False
    return True
RIDE_WAIT_S = 0.005  # a drained queue: wait this long for acks to ride on the next lease


class Worker:
    """``Worker(client, ["g#high", "g#low"] or re.compile("g#.*"), handler).run()``."""

    def __init__(self, client: Client | AsyncClient, queues: Sequence[str] | re.Pattern[str],
                 handler: Handler, *, concurrency: int = 10, lease_secs: float = 60.0,
                 burst: bool = False, grace_s: float = 30.0, poll_max_s: float = 1.0,
                 discover_interval_s: float = 5.0, include_dead: bool = False,
                 wait_s: float = 5.0, ack_linger_s: float = 0.002,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(queues, str):
            queues = [queues]
        if not isinstance(queues, re.Pattern):
            for q in queues:
                split_queue(q)
        self.queues = queues
        self.handler = handler
        self.concurrency = max(1, concurrency)
        self.lease_secs = lease_secs
        self.burst = burst
        self.grace_s = grace_s
        self.poll_max_s = poll_max_s
        self.discover_interval_s = discover_interval_s
        self.include_dead = include_dead
        self.wait_s = wait_s  # long poll of an idle single-queue worker (0: poll)
        self.ack_linger_s = ack_linger_s
        self.clock = clock  # when leases were taken and are due for renewal (tests move it)
        self._renew_passes = 0  # the renewer's looks at the running tasks
        self.stats = WorkerStats()
        self._given = client
        self._client: AsyncClient | None = None
        self._owns_client = False
        self._async_handler = is_async(handler)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_requested = threading.Event()
        self._wake: asyncio.Event | None = None
        self._running: dict[int, tuple[TaskBase, asyncio.Task[None]]] = {}
        self._acker: Acker | None = None
        self._leasing = False  # a lease request is in flight
        self._lost: set[int] = set()
        self._acking: set[int] = set()  # finished, handed to the acker
        self._discovered: tuple[float, list[str]] = (-1e18, [])
        self._pool: DaemonPool | None = None

    # -- public --------------------------------------------------------------------------
    def run(self) -> WorkerStats:
        """Run until stopped (SIGTERM / SIGINT / :meth:`stop`), or drained in burst mode.
        On its own event loop: uvloop's where it is installed (with the servers), else
        asyncio's."""
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(self.arun())

    def stop(self) -> None:
        """Ask the worker to stop gracefully (thread-safe; a second call stops at once)."""
        first = not self._stop_requested.is_set()
        self._stop_requested.set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._on_stop, first)

    async def arun(self, install_signals: bool = True) -> WorkerStats:
        from squall.client._async import AsyncClient

        self._loop = asyncio.get_running_loop()
        self._stop_requested.clear()  # a worker can run again after a stop
        self._wake = asyncio.Event()
        if isinstance(self._given, AsyncClient):
            self._client = self._given
        else:
            self._client, self._owns_client = async_twin(self._given), True
        if not self._async_handler:
            self._pool = DaemonPool(self.concurrency)
        signals = self._install_signals() if install_signals else []
        self._acker = Acker(self._client, self.ack_linger_s, lambda: len(self._running),
                            self._rides, self._wake.set)
        helpers = [asyncio.create_task(self._acker.run(), name="squall-acker"),
                   asyncio.create_task(self._renew_loop(), name="squall-renewer")]
        try:
            await self._lease_loop()
            await self._drain()
        finally:
            for h in helpers:
                h.cancel()
            for h in helpers:
                with contextlib.suppress(asyncio.CancelledError):
                    await h
            for s in signals:
                self._loop.remove_signal_handler(s)
            if self._pool is not None:
                self._pool.shutdown(wait=False)
            if self._owns_client:
                await self._client.close()
        return self.stats

    # -- setup ---------------------------------------------------------------------------
    def _install_signals(self) -> list[int]:
        if threading.current_thread() is not threading.main_thread():
            return []
        assert self._loop is not None
        out: list[int] = []
        for s in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                self._loop.add_signal_handler(s, self.stop)
                out.append(s)
        return out

    def _on_stop(self, first: bool) -> None:
        assert self._wake is not None
        self._wake.set()
        if not first:
            log.warning("second stop request: cancelling %d running task(s)", len(self._running))
            self.grace_s = 0
            for _, fut in self._running.values():
                fut.cancel()

    def _make(self, wire: WireTask, group: str) -> TaskBase:
        from squall.client._async import AsyncLeasedTask
        from squall.client._sync import LeasedTask

        assert self._client is not None and self._loop is not None
        if self._async_handler:
            return AsyncLeasedTask(self._client, wire, group)
        return LeasedTask(Bridge(self._client, self._loop), wire, group)

    # -- leasing -------------------------------------------------------------------------
    async def _queue_names(self, refresh: bool = False) -> list[str]:
        if not isinstance(self.queues, re.Pattern):
            return list(self.queues)
        at, names = self._discovered
        if refresh or self.clock() - at >= self.discover_interval_s:
            assert self._client is not None
            found = await self._client.queues(self.queues.pattern, limit=10_000)
            names = [f"{q.group}#{q.queue}" for q in found
                     if self.include_dead or not q.queue.endswith(".dead")]
            self._discovered = (self.clock(), names)
        return names

    async def _lease_round(self, wait: bool = False) -> tuple[int, bool]:
        """Lease up to the free slots; (tasks leased, whether a queue gave fewer than
        asked: it ran dry)."""
        assert self._client is not None
        got, short = 0, False
        for q in await self._queue_names():
            free = self._free()
            if free <= 0 or self._stop_requested.is_set():
                break
            assert self._acker is not None
            tx, riding = self._acker.take(split_queue(q)[0])  # acks ride on this lease
            self._leasing = True
            try:
                tasks = await self._client._run(self._client._core.lease(
                    q, min(free, MAX_BATCH), self.lease_secs, None, self._make, True,
                    self.wait_s if wait else None, tx=tx))
            except BaseException:
                self._acker.put_back(riding)
                raise
            finally:
                self._leasing = False
            self._acker.settled(riding)
            if self._stop_requested.is_set():  # stopped while the lease waited: give back
                self.stats.leased += len(tasks)
                for t in tasks:
                    await self._give_back(t)
                break
            now = self.clock()
            for t in tasks:
                t.leased_at = now
                fut = asyncio.create_task(self._handle(t), name=f"squall-task-{t.pid}")
                self._running[id(t)] = (t, fut)
            got += len(tasks)
            short = short or len(tasks) < min(free, MAX_BATCH)
        self.stats.leased += got
        return got, short

    def _free(self) -> int:
        """Slots for new tasks. A finished task frees its slot while its ack is on its way
        (the ack rides on the lease that fills the slot); at most 2 x ``concurrency`` tasks
        are held in all, counting those."""
        held = len(self._running)
        return min(self.concurrency - (held - len(self._acking)), 2 * self.concurrency - held)

    def _rides(self) -> bool:
        """Whether the next lease comes soon and can carry acks (between leases, free slots)."""
        return not self._leasing and not self._stop_requested.is_set() and self._free() > 0

    async def _lease_loop(self) -> None:
        assert self._wake is not None
        idle = 0
        while not self._stop_requested.is_set():
            self._wake.clear()
            if self._free() > 0:
                try:
                    got, short = await self._lease_round(self._may_wait(idle))
                except SquallError as e:
                    log.warning("leasing failed: %s", e)
                    got, short = 0, True
                    idle = max(idle, 3)
                if got and short and self._may_wait(1):
                    # the queue ran dry: the next lease waits for tasks, and the acks of
                    # what finishes meanwhile ride on it
                    idle = 1
                    await self._ride_wait()
                    continue
                if got:
                    idle = 0
                    continue
                if self.burst and not self._running and self._client is not None \
                        and await queues_empty(self._client,
                                               lambda: self._queue_names(refresh=True),
                                               isinstance(self.queues, re.Pattern)):
                    return
                idle += 1
            delay = min(self.poll_max_s, 0.005 * 2 ** min(idle, 20))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def _ride_wait(self) -> None:
        """Wait up to ``RIDE_WAIT_S`` for an ack to ride on the next lease (the acker wakes
        this loop), while a handler still runs. Other wake-ups (an earlier task's ack
        settled by the last answer, a freed slot) do not end the wait: the lease they would
        send now would go without the acks of the tasks just leased."""
        assert self._wake is not None and self._acker is not None
        loop = asyncio.get_running_loop()
        end = loop.time() + RIDE_WAIT_S
        while (not self._acker.pending and not self._stop_requested.is_set()
               and len(self._acking) < len(self._running)):
            self._wake.clear()
            left = end - loop.time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), left)

    def _may_wait(self, idle: int) -> bool:
        """Long-poll when idle with a single queue (several queues are polled in priority
        order: waiting on one would starve the others) and not in burst mode."""
        return (idle > 0 and self.wait_s > 0 and not self.burst
                and not isinstance(self.queues, re.Pattern) and len(self.queues) == 1)

    # -- one task ------------------------------------------------------------------------
    async def _handle(self, task: TaskBase) -> None:
        assert self._loop is not None
        try:
            with _trace.consumer_span(task.queue, task.pid, task.attempts, task.traceparent,
                                      task.tracestate):
                if self._async_handler:
                    result = await self.handler(task)
                else:  # the span is current in the handler's thread too
                    ctx = contextvars.copy_context()
                    result = await self._loop.run_in_executor(self._pool, ctx.run,
                                                              self.handler, task)
            if task.finished or id(task) in self._lost:
                return  # the handler dequeued or released it itself, or the lease is gone
            assert self._acker is not None
            self._acking.add(id(task))  # not renewed any more: its dequeue may be applied
            if await self._acker.submit(task, followups(task, result)):
                self.stats.done += 1
            else:
                self.stats.lost += 1
        except asyncio.CancelledError:
            await self._give_back(task)
        except Exception as e:
            self.stats.failed += 1
            log.info("task %s %r failed: %s: %s", task.queue, task.pid, type(e).__name__, e)
            if not task.finished and id(task) not in self._lost:
                try:
                    await self._client_release(task, error=describe_error(e))
                except SquallError as err:
                    log.warning("releasing %s %r failed: %s", task.queue, task.pid, err)
        finally:
            self._running.pop(id(task), None)
            self._lost.discard(id(task))
            self._acking.discard(id(task))
            assert self._wake is not None
            self._wake.set()

    async def _client_release(self, task: TaskBase, error: str | None = None) -> None:
        assert self._client is not None
        await self._client._run(self._client._core.release([task], None, error))

    async def _give_back(self, task: TaskBase) -> None:
        if task.finished or id(task) in self._lost:
            return
        try:
            await self._client_release(task)
            self.stats.released += 1
        except SquallError as e:
            log.warning("giving back %s %r failed (its lease will expire): %s", task.queue,
                        task.pid, e)

    # -- renewer -------------------------------------------------------------------------
    async def _renew_loop(self) -> None:
        period = max(0.05, self.lease_secs / 6)
        while True:
            await asyncio.sleep(period)
            now = self.clock()
            due = [t for t, _ in self._running.values()
                   if not t.finished and id(t) not in self._lost and id(t) not in self._acking
                   and now - t.leased_at >= self.lease_secs / 3]
            if due:
                assert self._client is not None
                await renew(self._client, due, self.lease_secs, now, self._lost)
            self._renew_passes += 1

    # -- shutdown ------------------------------------------------------------------------
    async def _drain(self) -> None:
        """Let running handlers finish for `grace_s`, then give their tasks back."""
        if self._running:
            log.info("stopping: waiting up to %.0fs for %d running task(s)", self.grace_s,
                     len(self._running))
            futs = [f for _, f in self._running.values()]
            _, pending = await asyncio.wait(futs, timeout=self.grace_s)
            for task, fut in list(self._running.values()):
                if fut in pending:
                    if self._async_handler:
                        fut.cancel()
                    else:
                        await self._give_back(task)
                        self._lost.add(id(task))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*(f for f in pending if self._async_handler),
                                     return_exceptions=True)
        for _ in range(3000):  # bounded: the acker drains what finished meanwhile
            if self._acker is None or not self._acker.pending:
                break
            await asyncio.sleep(0.01)
