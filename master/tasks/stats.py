"""Soft-state queue statistics: event rates and mean lease duration, O(1) per event.

Rates are continuous-time exponentially weighted moving averages of events per second
(the 1- and 5-minute "load average" of enqueues, leases and dequeues): on an event at time
t, ``r = r * exp(-(t - t0) / tau) + n / tau``; reading decays to now. Nothing ticks, so
100,000 idle queues cost nothing. These live in memory only and restart from zero.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

TAUS = (60.0, 300.0)
KINDS = ("enqueue", "lease", "dequeue")  # with rates
COUNTED = (*KINDS, "release", "expire", "dead_letter", "cancel")  # process-wide counters
LEASE_SAMPLE = 32


@dataclass(slots=True)
class Ewma:
    tau: float
    rate: float = 0.0
    t0: float = 0.0

    def add(self, n: int, now: float) -> None:
        self.rate = self.at(now) + n / self.tau
        self.t0 = now

    def at(self, now: float) -> float:
        return self.rate * math.exp(-max(0.0, now - self.t0) / self.tau)


@dataclass(slots=True)
class QueueMeter:
    rates: dict[str, tuple[Ewma, Ewma]] = field(
        default_factory=lambda: {k: (Ewma(TAUS[0]), Ewma(TAUS[1])) for k in KINDS})
    lease_secs_sum: float = 0.0
    lease_count: int = 0
    recent_leases: deque[str] = field(default_factory=lambda: deque(maxlen=LEASE_SAMPLE))

    def add(self, kind: str, n: int, now: float) -> None:
        for e in self.rates[kind]:
            e.add(n, now)

    def snapshot(self, now: float) -> dict[str, float]:
        return {f"{k}_{w}": round(e.at(now), 3)
                for k, pair in self.rates.items() for w, e in zip(("1m", "5m"), pair,
                                                                    strict=True)}

    @property
    def mean_lease_secs(self) -> float | None:
        return self.lease_secs_sum / self.lease_count if self.lease_count else None


class Meters:
    """Per-queue meters, their total, and process-wide event counters (``counts``: every
    event kind, e.g. enqueue, lease, dequeue, release, dead_letter, cancel). The counters
    only grow: deleting a queue forgets its meter, never its part of the counts."""

    def __init__(self) -> None:
        self.queues: dict[tuple[str, str], QueueMeter] = {}
        self.total = QueueMeter()
        self.counts: dict[str, int] = dict.fromkeys(COUNTED, 0)

    def get(self, key: tuple[str, str]) -> QueueMeter:
        m = self.queues.get(key)
        if m is None:
            m = self.queues[key] = QueueMeter()
        return m

    def record(self, key: tuple[str, str], kind: str, n: int, now: float) -> None:
        if n:
            self.counts[kind] = self.counts.get(kind, 0) + n
            if kind in KINDS:
                self.get(key).add(kind, n, now)
                self.total.add(kind, n, now)

    def count(self, kind: str, n: int = 1) -> None:
        """An event counted without a rate (e.g. expired leases, found by the sweeper)."""
        self.counts[kind] = self.counts.get(kind, 0) + n

    def lease_done(self, key: tuple[str, str], secs: float, n: int = 1) -> None:
        """`n` leases ended by a dequeue, held `secs` seconds in all."""
        m = self.get(key)
        m.lease_secs_sum += secs
        m.lease_count += n

    def forget(self, key: tuple[str, str]) -> None:
        self.queues.pop(key, None)
