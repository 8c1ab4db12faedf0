"""The data node: its store, identity, key, peer client and background loops."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from squall.common.clock import Clock, SystemClock
from squall.common.masters import Masters
from squall.common.security.tokens import (
    TokenClaims,
    bearer,
    sign,
    sign_batch_receipt,
    sign_receipt,
    verify,
)
from squall.datanode.config import DataNodeSettings
from squall.datanode.replication.peers import Peers
from squall.datanode.replication.repairpace import RepairPace
from squall.datanode.store.blobstore import BlobMeta, BlobStore

if TYPE_CHECKING:
    from squall.datanode.frontdoor import FrontDoor
    from squall.datanode.heartbeat import Heartbeat
    from squall.datanode.store.scrubber import Scrubber

log = logging.getLogger("squall.datanode")


class DataNode:
    def __init__(self, settings: DataNodeSettings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.revoked: frozenset[str] = frozenset()  # credential ids, from heartbeat answers
        self.node_id = settings.resolve_node_id()
        self.address = settings.advertise_url.rstrip("/")
        self.key = settings.cluster_key
        self.started_at = time.time()
        self.store = BlobStore(os.path.join(settings.data_dir, "blobs"),
                               chunk_bytes=settings.chunk_bytes, txn_bytes=settings.txn_bytes,
                               map_size=settings.map_size, map_size_max=settings.map_size_max)
        self.store.name = f"{self.node_id} ({self.address})"
        self.http_stats: Any = None  # the app's HttpStats (request metrics)
        self.metrics_registry: Any = None  # built on the first scrape
        self.peers: Peers | None = None
        # the master (or the members of a master set) its heartbeats and commits go to
        self.masters = Masters(settings.master_url) if settings.master_url else None
        self.repair_pacer = RepairPace(settings.repair_bytes_per_s,
                                       settings.repair_busy_bytes_per_s)
        self.puts = self.gets = self.forwarded = self.peer_errors = 0
        self._tasks: list[asyncio.Task[None]] = []
        # set by start(): the heartbeat and scrubber (imported late: they import this module)
        self.heartbeat: Heartbeat | None = None
        self.scrubber: Scrubber | None = None
        self.frontdoor: FrontDoor | None = None
        log.info("data node %s at %s: store %s", self.node_id, self.address,
                 self.store.env.path)

    # -- tokens and receipts ---------------------------------------------------------------
    def authorize(self, authorization: str | None, op: str,
                  blob_ids: str | Iterable[str]) -> TokenClaims:
        """Raise Unauthorized / Forbidden unless the bearer token allows `op` on the blobs."""
        return verify(self.key, bearer(authorization), op, blob_ids, self.clock.now())

    def receipt(self, meta: BlobMeta) -> str:
        return sign_receipt(self.key, self.node_id, meta.blob_id, meta.size, meta.crc32c,
                            self.clock.now())

    def batch_receipt(self, metas: Iterable[BlobMeta]) -> str:
        """One receipt for a whole batch (see ``common/security/tokens.py``)."""
        return sign_batch_receipt(self.key, self.node_id,
                                  [(m.blob_id, m.size, m.crc32c) for m in metas],
                                  self.clock.now())

    def node_token(self, op: str, ids: Iterable[str]) -> str:
        """A token this node signs for its own requests to peers and to the master."""
        return sign(self.key, op, ids, self.clock.now() + self.settings.node_token_ttl_s)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, background: bool = True) -> None:
        from squall.datanode.heartbeat import Heartbeat
        from squall.datanode.store.scrubber import Scrubber

        s = self.settings
        ctx = s.tls.client_context()
        self.peers = Peers(connect_timeout=s.peer_connect_timeout_s, timeout=s.peer_timeout_s,
                           tls=ctx if isinstance(ctx, ssl.SSLContext) else None)
        hb = self.heartbeat = Heartbeat(self)
        if s.master_url:
            from squall.datanode.frontdoor import FrontDoor

            self.frontdoor = FrontDoor(self)
        sc = self.scrubber = Scrubber(self)
        if not background:
            return
        if s.master_url:
            self._tasks.append(asyncio.create_task(hb.run(), name="heartbeat"))
        if s.scrub_bytes_per_s > 0:
            self._tasks.append(asyncio.create_task(sc.run(), name="scrubber"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        if self.heartbeat is not None:
            await self.heartbeat.stop()
        if self.frontdoor is not None:
            await self.frontdoor.aclose()
        if self.peers is not None:
            await self.peers.aclose()

    def close(self) -> None:
        self.store.close()

    def ready(self) -> bool:
        return not self.store.env._closed and self.store.env._thread.is_alive()
