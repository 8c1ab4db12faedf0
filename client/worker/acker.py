"""The Worker's acknowledgements: the dequeues of finished tasks and their handlers'
follow-up tasks, coalesced into one atomic update per group for everything that finished
within ``linger_s`` of each other or while the previous update was in flight.

Riding the next lease: while the Worker's lease loop is between leases (``rides()``), the
acker leaves what finished to it (``nudge()`` wakes it) for ``linger_s``: the loop takes
those items (:meth:`Acker.take`) into its next lease, one update that dequeues them, enqueues
their follow-ups and leases the next tasks (waiting for them when idle; the dequeues are
durable before the wait begins, and count once the answer arrives). If that update fails, the
items come back here (:meth:`Acker.put_back`) and are saved as below.

A task counts as done only when its update is durable (the master answered). An update
the master refused (a lease lost) is split until the culprit is alone, so one lost lease
never blocks the others. An update that could not reach the master, or that it refused
for now (503 / 429: restarting, overloaded), is sent again as it is, with backoff, while
every lease in it lasts; a resend of a dequeue that had been applied answers NotFound,
which counts as done. When the leases run out first, the results are dropped (``lost``):
the tasks run again elsewhere, and nothing is released with an error.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from squall.client._tasks import NewTask, TaskBase, TxBuilder
from squall.common.errors import (
    LeaseError,
    NotFound,
    Overloaded,
    SquallError,
    StatusError,
    TransportError,
    Unavailable,
)

if TYPE_CHECKING:
    from squall.client._async import AsyncClient

log = logging.getLogger("squall.worker")
ACK_BATCH_MAX = 500  # dequeues + follow-ups per update
ACK_MARGIN_S = 1.0  # stop retrying a dequeue this long before its lease ends
Item = tuple[TaskBase, list[NewTask], "asyncio.Future[bool]"]


class Acker:
    def __init__(self, client: AsyncClient, linger_s: float, running: Callable[[], int],
                 rides: Callable[[], bool] = lambda: False, nudge: Callable[[], None] = (
                     lambda: None)) -> None:
        self._client, self.linger_s, self.running = client, linger_s, running
        self.rides, self.nudge = rides, nudge
        self._queue: list[Item] = []
        self._wake = asyncio.Event()

    @property
    def pending(self) -> int:
        return len(self._queue)

    async def submit(self, task: TaskBase, follow: list[NewTask]) -> bool:
        """Dequeue `task` with its follow-ups; True once durable, False if the result was
        dropped (lease lost or ended)."""
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._queue.append((task, follow, fut))
        self._wake.set()
        return await fut

    def take(self, group: str) -> tuple[TxBuilder | None, list[Item]]:
        """What waits to be saved for `group` (up to one update's worth), as a transaction
        for the lease loop's next lease; None when nothing waits."""
        taken, kept, n = [], [], 0
        for item in self._queue:
            if item[0].group == group and n + 1 + len(item[1]) <= ACK_BATCH_MAX:
                taken.append(item)
                n += 1 + len(item[1])
            else:
                kept.append(item)
        if not taken:
            return None, []
        self._queue = kept
        return _transaction(group, taken), taken

    def settled(self, items: list[Item]) -> None:
        """The lease that took `items` was answered: they are durable."""
        for _, _, fut in items:
            if not fut.done():
                fut.set_result(True)

    def put_back(self, items: list[Item]) -> None:
        """The lease that took `items` failed: save them the usual way."""
        self._queue[:0] = items
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            if self.linger_s > 0 and self.rides():
                self.nudge()  # the lease loop takes them with its next lease
                await asyncio.sleep(self.linger_s)
            elif self.linger_s > 0 and len(self._queue) < self.running():
                await asyncio.sleep(self.linger_s)  # let near-simultaneous ones join
            self._wake.clear()
            while self._queue:
                batch, n = [], 0
                while self._queue and n < ACK_BATCH_MAX:
                    batch.append(self._queue.pop(0))
                    n += 1 + len(batch[-1][1])
                await self._ack(batch)

    async def _ack(self, batch: list[Item]) -> None:
        groups: dict[str, list[Item]] = {}
        for item in batch:
            groups.setdefault(item[0].group, []).append(item)
        for group, items in groups.items():
            tx = _transaction(group, items)
            try:
                await self._commit_while_leased(tx, [t for t, _, _ in items])
                outcome = [True] * len(items)
            except SquallError as e:
                if len(items) > 1 and isinstance(e, StatusError) and not isinstance(
                        e, Unavailable | Overloaded):  # find the culprit: one at a time
                    await self._ack(items[:len(items) // 2])
                    await self._ack(items[len(items) // 2:])
                    continue
                outcome = [self._ack_failed(t, e) for t, _, _ in items]
            for (_, _, fut), ok in zip(items, outcome, strict=True):
                if not fut.done():
                    fut.set_result(ok)

    async def _commit_while_leased(self, tx: TxBuilder, tasks: list[TaskBase]) -> None:
        """Commit `tx`; while the master cannot be reached or is restarting, try again
        (with backoff) as long as every lease in it lasts. A resend of a dequeue that was
        applied answers NotFound: the caller takes that as done."""
        ends = min(t.expires_at for t in tasks) - ACK_MARGIN_S
        pause = 0.05
        while True:
            try:
                await self._client._run(self._client._core.commit(tx))
                return
            except (TransportError, Unavailable, Overloaded) as e:
                if time.time() + pause >= ends:
                    raise
                log.info("saving %d result(s) failed (%s); retrying while the leases last",
                         len(tasks), e)
            await asyncio.sleep(pause)
            pause = min(2.0, pause * 2)

    @staticmethod
    def _ack_failed(task: TaskBase, e: SquallError) -> bool:
        if isinstance(e, NotFound):
            return True  # already gone: our earlier, ambiguous attempt (or another worker)
        if isinstance(e, LeaseError):
            log.warning("task %s %r: lease lost before its result was saved (%s); another "
                        "worker will run it again", task.queue, task.pid, e)
        else:
            log.warning("task %s %r: its result could not be saved before its lease ended "
                        "(%s); it will run again", task.queue, task.pid, e)
        return False


def _transaction(group: str, items: list[Item]) -> TxBuilder:
    """Dequeue the items' tasks and enqueue their follow-ups, in one update."""
    tx = TxBuilder(group)
    for task, fus, _ in items:
        tx.dequeue(task)
        for f in fus:
            tx.put(f.queue or "", f.payload, pid=f.pid, not_before=f.not_before, delay=f.delay)
    return tx
