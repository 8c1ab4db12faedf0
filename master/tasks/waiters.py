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

Whom a notification wakes: as many parked requests as the queue has available tasks (its
in-memory count, after the commit), oldest first, counting those woken already and not
yet looking; not every parked request. Waking all of them cost one lease attempt per
parked request per task, nearly all of them empty: with 4 Workers parked, 1.7 empty
attempts per task in the client benchmark's D; with 100, about 99. Once it has looked, a
woken request wakes more if the queue still has tasks that no awake request will take
(it leased nothing because another request took the task or its ``max_pid`` excludes it;
or tasks came in its own batch after its lease was planned); one that ends before it
looks (its deadline, the client gone) passes its wake-up on. Only requests that have not
looked since the last notification are woken so: a leasable task never waits while a
request that could lease it sleeps, and no request passes a wake-up back and forth with
another (at most one attempt per parked request and notification, as before).

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


class _Parked:
    """One parked request: its event, and the notification counter when it last looked."""

    __slots__ = ("ev", "seen")

    def __init__(self, seen: int) -> None:
        self.ev = asyncio.Event()
        self.seen = seen


class Waiters:
    def __init__(self, cap_s: float = 20.0, per_queue_max: int = 100,
                 total_max: int = 1000,
                 available: Callable[[Key], int | None] = lambda key: None) -> None:
        self.cap_s, self.per_queue_max, self.total_max = cap_s, per_queue_max, total_max
        self.available = available  # a queue's available tasks now (None: unknown, wake all)
        self._parked: dict[Key, dict[_Parked, None]] = {}  # oldest first
        self._looking: dict[Key, int] = {}  # woken requests leasing now
        self.total = 0
        self.seq = 0  # bumped by every notification
        self.closed = False
        self.refused = 0  # requests refused by a bound (429 / 503)
        self.attempts = 0  # leases tried by waiting requests (a metric)
        self._loop: asyncio.AbstractEventLoop | None = None

    def notify(self, keys: Iterable[Key]) -> None:
        """Tasks of these queues may be available now: wake whoever may lease them."""
        self.seq += 1
        if not self.total:
            return
        for k in keys:
            self._wake(k)

    def _wake(self, key: Key) -> None:
        """Wake parked requests of `key` that have not looked since the last notification,
        oldest first, until as many are awake as the queue has available tasks."""
        parked = self._parked.get(key)
        if not parked:
            return
        want = self.available(key)
        awake = self._looking.get(key, 0) + sum(1 for p in parked if p.ev.is_set())
        for p in parked:
            if want is not None and awake >= want:
                return
            if not p.ev.is_set() and p.seen < self.seq:
                p.ev.set()
                awake += 1

    def close(self) -> None:
        """Wake every parked request (it answers with what it has) and park no more."""
        self.closed = True
        for parked in self._parked.values():
            for p in parked:
                p.ev.set()

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
        woken = False
        while True:
            seen = self.seq
            if woken:
                self.attempts += 1
                self._looking[key] = self._looking.get(key, 0) + 1
            try:
                res = await attempt()
            except BaseException:
                if woken:
                    self._looked(key)  # the wake-up was not used: pass it on
                raise
            if woken:  # wake more if tasks are left that no one awake will take: this one
                # leased nothing, or tasks came in its batch after its lease was planned
                self._looked(key)
            left = deadline - time.monotonic()
            if res["tasks"] or self.closed or left <= 0:
                return res
            woken = False
            if self.seq != seen:
                continue  # something was committed meanwhile: look again before parking
            p = self._park(key, seen)
            try:
                await asyncio.wait_for(p.ev.wait(), left)
            except BaseException as e:  # the deadline, or the request was cancelled
                self._unpark(key, p)
                if p.ev.is_set() and not self.closed:
                    self._wake(key)  # woken as it ended: pass the wake-up on
                if isinstance(e, TimeoutError):
                    return res
                raise
            self._unpark(key, p)
            if self.closed:  # shutting down: answer with what we have, touch nothing more
                return res
            woken = True

    def _looked(self, key: Key) -> None:
        n = self._looking.get(key, 0) - 1
        if n > 0:
            self._looking[key] = n
        else:
            self._looking.pop(key, None)
        self._wake(key)

    def _park(self, key: Key, seen: int) -> _Parked:
        parked = self._parked.get(key)
        if parked is not None and len(parked) >= self.per_queue_max:
            self.refused += 1
            raise Overloaded(f"{len(parked)} leases already wait on queue {key[0]}#{key[1]}, "
                             f"the limit per queue; lease without wait_secs, or retry",
                             retry_after=1)
        if self.total >= self.total_max:
            self.refused += 1
            raise Unavailable(f"{self.total} leases are waiting on this master, its limit; "
                              "retry shortly", retry_after=1)
        p = _Parked(seen)
        self._parked.setdefault(key, {})[p] = None
        self.total += 1
        return p

    def _unpark(self, key: Key, p: _Parked) -> None:
        parked = self._parked.get(key)
        if parked is not None and p in parked:
            del parked[p]
            self.total -= 1
            if not parked:
                del self._parked[key]
