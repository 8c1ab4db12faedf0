"""The pace of the re-replication copies a data node sends (repair runs at disk speed, yet
client requests keep their latency while it runs).

- **Idle**: no client request reached this node in the last ``BUSY_S``: copies go at
  ``idle_bytes_per_s`` (``--repair-bytes-per-s``; 0, the default, is unpaced: a blob under
  its replication factor is at risk, repair comes first).
- **Busy**: clients are using the node (their reads and writes, a peer's forward of a
  client write; repair copies themselves do not count): copies go at ``busy_bytes_per_s``
  (``--repair-busy-bytes-per-s``, default 64 MB/s; 0: unpaced). Copies use the CPU, the
  disk and its syncs that clients wait for; measured on the project's 2-core machine,
  unpaced repair made foreground puts 8-17x slower at p99 (docs/decisions/0009).
- A copied blob costs its size plus ``BLOB_CHARGE`` bytes: copying 1 KiB blobs is bound by
  the per-blob work (framing, checksums, LMDB records, the master's bookkeeping of each
  report), not by their bytes.

Pacing is a debt: bytes may go once the bytes taken before them are paid off at the rate in
force (a token bucket without burst).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable

BLOB_CHARGE = 32 << 10  # bytes a copied blob costs besides its own
BUSY_S = 1.0  # a client request within this long makes the node busy
DEFAULT_BUSY_BYTES_PER_S = 64e6


class RepairPace:
    def __init__(self, idle_bytes_per_s: float = 0.0,
                 busy_bytes_per_s: float = DEFAULT_BUSY_BYTES_PER_S,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[object]] = asyncio.sleep) -> None:
        self.idle_rate, self.busy_rate = idle_bytes_per_s, busy_bytes_per_s
        self._clock, self._sleep = clock, sleep
        self.client_at = float("-inf")
        self._free_at = float("-inf")  # when everything taken so far is paid off
        self.waited_s = 0.0  # time copies spent waiting for the pace (a metric)

    def client_seen(self) -> None:
        self.client_at = self._clock()

    def busy(self) -> bool:
        return self._clock() - self.client_at < BUSY_S

    def rate(self) -> float:
        """Bytes per second in force now (0: unpaced)."""
        return self.busy_rate if self.busy() else self.idle_rate

    async def take(self, nbytes: int, blobs: int = 0) -> None:
        """Wait until `nbytes` of `blobs` copies may go."""
        cost = nbytes + blobs * BLOB_CHARGE
        rate = self.rate()
        if rate <= 0 or cost <= 0:
            return
        now = self._clock()
        start = max(now, self._free_at)
        self._free_at = start + cost / rate
        if start > now:
            self.waited_s += start - now
            await self._sleep(start - now)

    async def paced(self, parts: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
        """One blob's parts, each sent when the pace allows (the blob's charge first)."""
        await self.take(0, 1)
        async for part in parts:
            await self.take(len(part))
            yield part
