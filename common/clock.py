"""Clocks. Lease, delay and heartbeat logic takes a clock: tests move time instead of sleeping."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (wall time: leases and delays are absolute times on the wire)."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that only moves when told to. Thread-safe."""

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._t = start
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._t

    def advance(self, secs: float) -> float:
        with self._lock:
            self._t += secs
            return self._t

    def set(self, t: float) -> None:
        with self._lock:
            self._t = t
