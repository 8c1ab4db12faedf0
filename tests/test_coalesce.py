"""Front-door forwards that share one replicate request per peer
(datanode/replication/coalesce.py): beyond the requests in flight, waiting forwards go
together with one batch receipt each; a shared request's failure fails each of them; one
forward alone goes as before."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from squall.common.checksum import crc32c
from squall.common.security.tokens import sign, sign_batch_receipt
from squall.common.wire.cluster import PeerError
from squall.common.wire.payload import decode_frames, encode_frame
from squall.datanode.replication import coalesce
from squall.datanode.replication.coalesce import Coalescer
from squall.datanode.store.layout import BlobMeta
from tests.helpers import until

KEY = b"test-coalesce-cluster-key-0123456789"  # any key: one in-process node signs and checks


class Peer:
    """Stands in for ``Peers.post``: holds each request until released; answers as the
    batch route does (one batch receipt, or one per cut), or fails."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.gates: list[asyncio.Event] = []
        self.fail = False

    async def post(self, url: str, content: bytes, headers: dict[str, str]) -> Any:
        self.urls.append(url)
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        if self.fail:
            err = {"error": {"code": "insufficient_storage", "message": "disk full"}}
            return SimpleNamespace(status_code=507, content=json.dumps(err).encode(),
                                   text=json.dumps(err), json=lambda: err)
        frames = list(decode_frames(content, verify=False))
        triples = [(f.blob_id, len(f.data), crc32c(bytes(f.data))) for f in frames]
        if "cuts=" in url:
            cuts = [int(c) for c in url.split("cuts=")[1].split(",")]
            receipts, at = [], 0
            for k in cuts:
                receipts.append(sign_batch_receipt(KEY, "peer",
                                                   triples[at:at + k], 1e9))
                at += k
            ans: dict[str, Any] = {"node_id": "peer", "batch_receipts": receipts}
        else:
            ans = {"node_id": "peer",
                   "batch_receipt": sign_batch_receipt(KEY, "peer", triples, 1e9)}
        return SimpleNamespace(status_code=200, content=json.dumps(ans).encode(),
                               json=lambda: ans)


def _batch(tag: str, n: int) -> tuple[bytes, list[BlobMeta]]:
    datas = {f"{tag}-{i}": f"{tag}{i}".encode() * 10 for i in range(n)}
    body = b"".join(encode_frame(b, d) for b, d in datas.items())
    return body, [BlobMeta(b, 0, len(d), crc32c(d), 0, 0, 0) for b, d in datas.items()]


def _node(peer: Peer) -> Any:
    return SimpleNamespace(key=KEY, peers=peer, forwarded=0,
                           node_token=lambda op, ids: sign(KEY, op, ids, 2e9))


async def _requests(peer: Peer, n: int) -> None:
    await until(lambda: len(peer.urls) >= n, 10, what=f"{n} requests to the peer")


async def test_waiting_forwards_share_one_request_with_a_receipt_each() -> None:
    peer = Peer()
    c = Coalescer(_node(peer))
    batches = {t: _batch(t, n) for t, n in (("a", 1), ("b", 2), ("c", 3), ("d", 1))}
    tasks = {t: asyncio.create_task(c.forward(body, metas, ["http://p"]))
             for t, (body, metas) in batches.items()}
    await _requests(peer, coalesce.IN_FLIGHT)  # a and b at once; c and d wait
    assert "cuts" not in peer.urls[0] and "cuts" not in peer.urls[1]
    peer.gates[0].set()
    await _requests(peer, 3)  # a's slot freed: c and d together
    assert peer.urls[2].endswith("?receipt=batch&cuts=3,1")
    for g in peer.gates[1:]:
        g.set()
    for t, (_, metas) in batches.items():
        [entries] = await tasks[t]
        assert not isinstance(entries, PeerError)
        assert set(entries) == {m.blob_id for m in metas}
        assert len({e["receipt"] for e in entries.values()}) == 1  # one per request
    assert (c.requests, c.shared) == (3, 1)


async def test_a_shared_request_that_fails_fails_each_forward() -> None:
    peer = Peer()
    c = Coalescer(_node(peer))
    tasks = [asyncio.create_task(c.forward(*_batch(t, 2), ["http://p"])) for t in "abcd"]
    await _requests(peer, coalesce.IN_FLIGHT)
    peer.fail = True
    peer.gates[0].set()
    await _requests(peer, 3)
    for g in peer.gates[1:]:
        g.set()
    for t in tasks:
        [err] = await t
        assert isinstance(err, PeerError) and err.status == 507
