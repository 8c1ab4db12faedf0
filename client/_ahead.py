"""The read-ahead batch loop behind ``Client.batches`` and ``AsyncClient.batches``.

A serial loop of ``lease(n, payloads=True, done=previous)`` leaves every process idle but
one: the master leases while the data node and the client wait, then the data node reads
while the master waits. Here the next batch is leased (and its payloads read) in the
background while the caller works on the current one, so the master's work overlaps the
data node's and the caller's. The acknowledgement of a batch rides, as before, on a
lease: the one started when the caller takes the batch after it::

    take 1:  lease(n)                        -> batch 1;  start lease(n)            (ahead)
    take 2:  join                            -> batch 2;  start lease(n, done=1)
    take k:  join (batch k-2 now durable)    -> batch k;  start lease(n, done=k-1)

``finish`` ends the loop: it waits for the leases in flight, gives back the batches read
ahead (never handed out), and acknowledges the batch in hand (or gives it back after an
exception).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any, Generic, TypeVar

from squall.client._effects import Join, Proto, Spawn
from squall.client._tasks import TaskBase
from squall.common.errors import BadRequest, SquallError
from squall.common.wire.models import MAX_BATCH
from squall.common.wire.models import LeasedTask as WireTask
from squall.common.wire.names import split_queue

T = TypeVar("T", bound=TaskBase)


MAX_AHEAD = 4  # leases in flight at once


class ReadAhead(Generic[T]):
    """One loop's state: the batch the caller holds and the leases in flight."""

    def __init__(self, core: Any, queue: str, size: int, lease_secs: float | None,
                 payloads: bool, wait_secs: float | None,
                 make: Callable[[WireTask, str], T], ahead: int = 2) -> None:
        if not 1 <= size <= MAX_BATCH:
            raise BadRequest(f"size must be 1..{MAX_BATCH}")
        if not 1 <= ahead <= MAX_AHEAD:
            raise BadRequest(f"ahead must be 1..{MAX_AHEAD}")
        self.group = split_queue(queue)[0]
        self.ahead = ahead
        self._lease: Callable[[list[T]], Proto[list[T]]] = lambda done: core.lease(
            queue, size, lease_secs, None, make, payloads, wait_secs, done)
        self._done, self._release = core.done, core.release
        self.pending: deque[Any] = deque()  # handles of the leases in flight, oldest first
        self.held: list[T] = []  # handed out, not acknowledged yet
        self.started = False
        self.dry = False  # a lease found nothing: start no more
        self.ended = False

    def take(self) -> Proto[list[T]]:
        """The next batch, [] at the end (a lease found nothing, after waiting up to
        `wait_secs`, and the leases still in flight were taken). The batch taken before
        is acknowledged by the lease started now; a failed acknowledgement is raised by a
        later take."""
        if not self.started:
            self.started = True
            for _ in range(self.ahead):
                self.pending.append((yield Spawn(self._lease([]))))
        while self.pending:
            batch: list[T] = yield Join(self.pending.popleft())
            if not batch:
                self.dry = True
                continue
            if self.dry:  # a late batch: acknowledge the one in hand on its own
                held, self.held = self.held, []
                yield from self._done(held)
            else:
                self.pending.append((yield Spawn(self._lease(self.held))))
            self.held = batch
            return batch
        if not self.ended:
            self.ended = True
            held, self.held = self.held, []
            yield from self._done(held)
        return []

    def finish(self, ok: bool) -> Proto[None]:
        """End the loop. The batches read ahead are released (available again at once,
        their leases not counted as attempts), then the batch in hand is acknowledged
        when `ok`, else released (two updates: a lost lease in hand does not keep the
        others). A failed acknowledgement of an earlier batch is raised when `ok`."""
        self.started = self.dry = self.ended = True
        ahead: list[T] = []
        failed: SquallError | None = None
        while self.pending:
            try:
                ahead += yield Join(self.pending.popleft())
            except SquallError as e:
                failed = failed or e
        try:
            yield from self._release(ahead, None, None, unseen=True)
        except SquallError as e:  # those leases run out instead
            failed = failed or e
        held, self.held = self.held, []
        yield from (self._done(held) if ok else self._release(held, None, None))
        if failed is not None and ok:
            raise failed


class Batches(Generic[T]):
    """``with client.batches(queue, 100) as batches: for batch in batches: ...`` (see
    ``Client.batches``): each batch is acknowledged once you take the next; the block's
    end acknowledges the last, an exception gives it back."""

    def __init__(self, run: Callable[[Proto[Any]], Any], ahead: ReadAhead[T]) -> None:
        self._run = run
        self._ahead = ahead

    def __iter__(self) -> Batches[T]:
        return self

    def __next__(self) -> list[T]:
        batch: list[T] = self._run(self._ahead.take())
        if not batch:
            raise StopIteration
        return batch

    def close(self, ok: bool = True) -> None:
        """Stop: acknowledge the batch in hand (`ok`) or give it back; give back the
        batches read ahead."""
        self._run(self._ahead.finish(ok))

    def __enter__(self) -> Batches[T]:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close(et is None)


class AsyncBatches(Generic[T]):
    """``async with client.batches(queue, 100) as batches: async for batch in batches:``
    (the twin of ``Batches``)."""

    def __init__(self, run: Callable[[Proto[Any]], Awaitable[Any]], ahead: ReadAhead[T]
                 ) -> None:
        self._run = run
        self._ahead = ahead

    def __aiter__(self) -> AsyncBatches[T]:
        return self

    async def __anext__(self) -> list[T]:
        batch: list[T] = await self._run(self._ahead.take())
        if not batch:
            raise StopAsyncIteration
        return batch

    async def close(self, ok: bool = True) -> None:
        """Stop: acknowledge the batch in hand (`ok`) or give it back; give back the
        batches read ahead."""
        await self._run(self._ahead.finish(ok))

    async def __aenter__(self) -> AsyncBatches[T]:
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close(et is None)
