"""Background scrubbing: re-read every blob at a bounded rate and verify its checksums.

A pass walks the ``blobs`` table in key order, a page of ids at a time (no long read
transaction), and reads each blob through :meth:`BlobStore.stream`, which checks every
chunk's CRC32C and the blob's own. A corrupt replica is dropped there and lands in the
journal's ``corrupt`` list, which the next heartbeat reports so the master re-replicates
from a good copy. Reading is paced to ``scrub_bytes_per_s`` (a token bucket of one second)
so foreground traffic keeps the disk; passes are ``scrub_interval_s`` apart. Between
passes it also retries cleanups that failed earlier (e.g. while the disk was full).
"""

from __future__ import annotations

import asyncio
import logging
import time

from squall.common.errors import DataCorrupt, NotFound
from squall.datanode.service import DataNode

log = logging.getLogger("squall.datanode.store.scrubber")
PAGE_IDS = 256


class Scrubber:
    def __init__(self, node: DataNode) -> None:
        self.node = node
        self.rate = float(node.settings.scrub_bytes_per_s)
        self.interval_s = node.settings.scrub_interval_s
        self.passes = 0
        self.bytes_checked = 0
        self.blobs_checked = 0
        self.corrupt_found = 0
        self._allowance = 0.0
        self._last = time.monotonic()

    async def run(self) -> None:
        while True:
            try:
                await self.scrub_pass()
                await self.node.store.run(self.node.store.retry_leaked)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("scrub pass failed; next one in %.1fs", self.interval_s)
            await asyncio.sleep(self.interval_s)

    async def _pace(self, nbytes: int) -> None:
        """Token bucket: at most `rate` bytes per second, bursts of one second."""
        if self.rate <= 0:
            return
        now = time.monotonic()
        self._allowance = min(self.rate, self._allowance + (now - self._last) * self.rate)
        self._last = now
        self._allowance -= nbytes
        if self._allowance < 0:
            await asyncio.sleep(-self._allowance / self.rate)

    async def scrub_pass(self) -> int:
        """Verify every blob once; returns how many corrupt replicas were dropped."""
        store = self.node.store
        after: str | None = None
        found = 0
        while True:
            ids = await store.run(store.ids_after, after, PAGE_IDS)
            if not ids:
                break
            for blob_id in ids:
                found += await self.scrub_blob(blob_id)
            after = ids[-1]
        self.passes += 1
        self.corrupt_found += found
        if found:
            log.warning("scrub pass %d dropped %d corrupt replicas", self.passes, found)
        return found

    async def scrub_blob(self, blob_id: str) -> int:
        store = self.node.store
        try:
            meta = await store.run(store.stat, blob_id)
            if meta is None:
                return 0
            async for part in store.stream(meta):
                self.bytes_checked += len(part)
                await self._pace(len(part))
            self.blobs_checked += 1
        except NotFound:  # deleted while we read it
            return 0
        except DataCorrupt as e:  # already dropped and journalled by the store
            log.warning("scrubber: %s", e)
            return 1
        return 0
