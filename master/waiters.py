"""Waiting leases (SQS's long polling): a lease with ``wait_secs`` that finds nothing waits
until a task of its queue may have become available, then tries again; it answers as soon
as it leased something, or empty at its deadline.

A parked request holds no LMDB transaction and no lock: it waits on an ``asyncio.Event``
that the master sets after a commit that may have made a task of that queue available
(an enqueue, a release, a reset, a redrive, a schedule firing) or after the sweeper moved
timers of that queue (a lease expired, a delay ended). A wake-up is a hint, never a
promise: the woken request simply leases again, so a spurious wake costs one empty lease.

Missed wake-ups: a notification that lands while a request is between its empty lease
and parking would be lost, so every notification also bumps a counter; a request that
sees it moved since it started its lease tries again at once instead of parking.

Bounds: at most ``per_queue_max`` parked requests per queue (429 beyond) and
``total_max`` in all (503 beyond), each with ``Retry-After``; a wait is capped at
``cap_s`` (20 s by default, like SQS). :meth:`Waiters.close` (shutdown) answers every
parked request at once with what it has (empty) and stops new ones from parking, so a
master that is being stopped never holds a client until its wait ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from squall.common.errors import Overloaded, Unavailable

Key = tuple[str, str]  # (group, queue)


class Waiters:
    def __init__(self, cap_s: float = 20.0, per_queue_max: int = 100,
                 total_max: int = 1000) -> None:
        self.cap_s, self.per_queue_max, self.total_max = cap_s, per_queue_max, total_max
        self._parked: dict[Key, set[asyncio.Event]] = {}
        self.total = 0
        self.seq = 0  # bumped by every notification
        self.closed = False
        self.refused = 0  # requests refused by a bound (429 / 503)
        self._loop: asyncio.AbstractEventLoop | None = None

    def notify(self, keys: Iterable[Key]) -> None:
        """Tasks of these queues may be available now: wake whoever waits on them."""
        self.seq += 1
        if not self.total:
            return
        for k in keys:
            for ev in self._parked.get(k, ()):
                ev.set()

    def close(self) -> None:
        """Wake every parked request (it answers with what it has) and park no more."""
        self.closed = True
        for evs in self._parked.values():
            for ev in evs:
                ev.set()

    def close_threadsafe(self) -> None:
        """:meth:`close` from a signal handler or another thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.close)
        else:
            self.closed = True

    async def wait(self, key: Key, wait_secs: float, attempt: Callable[[], Awaitable[
            dict[str, Any]]]) -> dict[str, Any]:
        """Run `attempt` (a lease) until it leases something or `wait_secs` (capped) pass."""
        self._loop = asyncio.get_running_loop()
        deadline = time.monotonic() + min(wait_secs, self.cap_s)
        while True:
            seen = self.seq
            res = await attempt()
            left = deadline - time.monotonic()
            if res["tasks"] or self.closed or left <= 0:
                return res
            if self.seq != seen:
                continue  # something was committed meanwhile: look again before parking
            ev = self._park(key)
            try:
                await asyncio.wait_for(ev.wait(), left)
            except TimeoutError:
                return res
            finally:
                self._unpark(key, ev)
            if self.closed:  # shutting down: answer with what we have, touch nothing more
                return res

    def _park(self, key: Key) -> asyncio.Event:
        evs = self._parked.get(key)
        if evs is not None and len(evs) >= self.per_queue_max:
            self.refused += 1
            raise Overloaded(f"{len(evs)} leases already wait on queue {key[0]}#{key[1]}, "
                             f"the limit per queue; lease without wait_secs, or retry",
                             retry_after=1)
        if self.total >= self.total_max:
            self.refused += 1
            raise Unavailable(f"{self.total} leases are waiting on this master, its limit; "
                              "retry shortly", retry_after=1)
        ev = asyncio.Event()
        self._parked.setdefault(key, set()).add(ev)
        self.total += 1
        return ev

    def _unpark(self, key: Key, ev: asyncio.Event) -> None:
        evs = self._parked.get(key)
        if evs is not None and ev in evs:
            evs.discard(ev)
            self.total -= 1
            if not evs:
                del self._parked[key]
