"""Front-door forwards that share one replicate request per peer.

Every front-door request sends its payloads to the block's peers
(``POST {peer}/v1/replicate:batch-put?receipt=batch``), one request per client request.
Requests that arrive together on a node go to the same peers, so :class:`Coalescer` lets
them share: per peer, at most ``IN_FLIGHT`` replicate requests at once; a forward that
finds them all busy waits, and the next request carries every forward waiting then, up to
``MAX_BYTES`` of frames and ``MAX_FRAMES`` blobs (the batch route's bound). The peer
stores the lot in one transaction and signs one batch receipt per client request
(``&cuts=n1,n2,...``: the frame count of each, in order), because the master checks a
batch receipt against exactly one request's blobs (decision 0003). One forward alone goes
as before, without ``cuts``.

A peer's failure fails every forward of the shared request (a batch is all or nothing on
the peer), each of which then counts it against its own write quorum, as before.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from squall.common.errors import Unauthorized
from squall.common.security.tokens import verify_batch_receipt
from squall.common.wire.cluster import PeerError
from squall.common.wire.models import MAX_BATCH
from squall.datanode.replication.pipeline import _describe_http, _post_batch, _transport
from squall.datanode.store.layout import BlobMeta

if TYPE_CHECKING:
    from squall.datanode.service import DataNode

IN_FLIGHT = 2  # replicate requests per peer at once before forwards wait and share one
MAX_BYTES = 8 << 20  # frames per shared request
MAX_FRAMES = MAX_BATCH  # blobs per shared request (the batch route's bound)
MAX_CUTS = 64  # client requests per shared request
Entry = dict[str, dict[str, str]]  # blob id -> {node_id, address, receipt}


@dataclass
class _Forward:
    body: bytes
    metas: list[BlobMeta]
    fut: asyncio.Future[Entry | PeerError] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


class _Peer:
    def __init__(self) -> None:
        self.waiting: deque[_Forward] = deque()
        self.in_flight = 0


class Coalescer:
    def __init__(self, node: DataNode) -> None:
        self.node = node
        self._peers: dict[str, _Peer] = {}
        self.requests = self.shared = 0  # replicate requests sent; of them, shared ones

    async def forward(self, body: bytes, metas: list[BlobMeta], peers: list[str]
                      ) -> list[Entry | PeerError]:
        """``forward_batch(..., batch_receipt=True)``, sharing requests per peer."""
        futs = [self._submit(p, _Forward(body, metas)) for p in peers]
        out = list(await asyncio.gather(*futs))
        self.node.forwarded += len(peers)
        return out

    def _submit(self, peer: str, f: _Forward) -> asyncio.Future[Entry | PeerError]:
        p = self._peers.get(peer)
        if p is None:
            p = self._peers[peer] = _Peer()
        p.waiting.append(f)
        self._pump(peer, p)
        return f.fut

    def _pump(self, peer: str, p: _Peer) -> None:
        while p.waiting and p.in_flight < IN_FLIGHT:
            batch = [p.waiting.popleft()]
            nbytes, nframes = len(batch[0].body), len(batch[0].metas)
            while p.waiting and len(batch) < MAX_CUTS:
                nxt = p.waiting[0]
                if (nbytes + len(nxt.body) > MAX_BYTES
                        or nframes + len(nxt.metas) > MAX_FRAMES):
                    break
                batch.append(p.waiting.popleft())
                nbytes += len(nxt.body)
                nframes += len(nxt.metas)
            p.in_flight += 1
            t = asyncio.get_running_loop().create_task(self._send(peer, batch))
            t.add_done_callback(functools.partial(self._sent, peer, p))

    def _sent(self, peer: str, p: _Peer, _t: asyncio.Task[None]) -> None:
        p.in_flight -= 1
        if p.waiting:
            self._pump(peer, p)
        elif not p.in_flight:
            self._peers.pop(peer, None)

    async def _send(self, peer: str, batch: list[_Forward]) -> None:
        node = self.node
        self.requests += 1
        try:
            ids = [m.blob_id for f in batch for m in f.metas]
            headers = {"Authorization": "Bearer " + node.node_token("replicate", ids),
                       "Content-Type": "application/octet-stream"}
            if len(batch) == 1:
                f = batch[0]
                _settle(f, await _post_batch(node, peer, f.body, headers, f.metas, True))
                return
            self.shared += 1
            res = await self._post_shared(peer, batch, headers)
            for f, r in zip(batch, res, strict=True):
                _settle(f, r)
        except BaseException as e:  # nobody waits forever (cancelled: the node stops)
            for f in batch:
                _settle(f, _transport(peer, e))
            if not isinstance(e, Exception):
                raise

    async def _post_shared(self, peer: str, batch: list[_Forward], headers: dict[str, str]
                           ) -> list[Entry | PeerError]:
        node = self.node
        assert node.peers is not None
        cuts = ",".join(str(len(f.metas)) for f in batch)
        try:
            r = await node.peers.post(f"{peer}/v1/replicate:batch-put?receipt=batch"
                                      f"&cuts={cuts}", content=b"".join(f.body for f in batch),
                                      headers=headers)
        except Exception as e:
            err = _transport(peer, e)
            return [err] * len(batch)
        if r.status_code != 200:
            err = _describe_http(peer, r)
            return [err] * len(batch)
        out: list[Entry | PeerError] = []
        try:
            ans = r.json()
            node_id, receipts = str(ans["node_id"]), ans["batch_receipts"]
            if not isinstance(receipts, list) or len(receipts) != len(batch):
                raise ValueError(f"{len(receipts)} receipts for {len(batch)} requests")
            for f, receipt in zip(batch, receipts, strict=True):
                verify_batch_receipt(node.key, str(receipt),
                                     [(m.blob_id, m.size, m.crc32c) for m in f.metas],
                                     node_id)
                entry = {"node_id": node_id, "address": peer, "receipt": str(receipt)}
                out.append({m.blob_id: entry for m in f.metas})
        except (ValueError, KeyError, TypeError, Unauthorized) as e:
            err = PeerError(address=peer, status=200, code="bad_receipt",
                            message=f"shared batch answer without valid receipts: {e}")
            return [err] * len(batch)
        return out


def _settle(f: _Forward, r: Entry | PeerError) -> None:
    if not f.fut.done():
        f.fut.set_result(r)
