"""Batch forms for many small blobs: ``POST /v1/blobs:batch-put`` and ``:batch-get``.

Bodies use the frame format of :mod:`squall.common.wire.payload`. A batch-put is all or nothing
on each node (one transaction, one sync) and is forwarded as a whole to the other replicas'
``POST /v1/replicate:batch-put``; the answer has, per blob, every node's receipt. The
batch body is bounded by ``max_body_bytes`` (413 above it).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from squall.common.errors import BadRequest, DataCorrupt, Forbidden, StatusError, Unavailable
from squall.common.server.http import JSON
from squall.common.wire.cluster import (
    BatchGetRequest,
    PeerError,
    check_blob_id,
)
from squall.common.wire.models import MAX_BATCH
from squall.common.wire.payload import (
    CORRUPT,
    MISSING,
    OK,
    TOO_LARGE,
    Frame,
    decode_frames,
    encode_frame,
)
from squall.datanode.http.deps import AuthH, NodeDep
from squall.datanode.http.routes.blobs import (
    QuorumQ,
    ReplicasQ,
    StreamAborted,
    peers_of,
)
from squall.datanode.replication.pipeline import forward_batch, quorum_message
from squall.datanode.service import DataNode
from squall.datanode.store.blobstore import BlobMeta
from squall.datanode.store.reads import Small

log = logging.getLogger("squall.datanode.blobs")
BATCH_READ_BYTES = 8 << 20  # a batch-get reads (and holds) about this much at a time


def parse_batch(body: bytes) -> list[Frame]:
    """The frames of an upload batch: valid, distinct blob ids, at most MAX_BATCH."""
    frames = list(decode_frames(body, verify=False))
    if not frames:
        raise BadRequest("empty batch")
    if len(frames) > MAX_BATCH:
        raise BadRequest(f"{len(frames)} blobs in one batch; the limit is {MAX_BATCH}")
    seen: set[str] = set()
    for f in frames:
        check_blob_id(f.blob_id)
        if f.blob_id in seen:
            raise BadRequest(f"blob {f.blob_id} appears twice in the batch")
        seen.add(f.blob_id)
    return frames


def check_scope(claims_covers: object, frames: list[Frame]) -> None:
    for f in frames:
        if not claims_covers(f.blob_id):  # type: ignore[operator]
            raise Forbidden(f"token does not cover blob {f.blob_id!r}")


async def store_batch(node: DataNode, frames: list[Frame], background: bool = False
                      ) -> list[BlobMeta]:
    res = await node.store.put_batch([(f.blob_id, f.data, f.crc32c) for f in frames],
                                     background)
    node.puts += len(frames)
    return [m for m, _ in res]


async def batch_put(request: Request, node: NodeDep, authorization: AuthH = None,
                    replicas: ReplicasQ = "", quorum: QuorumQ = None) -> JSON:
    """Store many small blobs (a body of frames) here and on `replicas`, all or nothing
    per node; answers once the write quorum holds every one of them."""
    claims = node.authorize(authorization, "write", [])  # signature, expiry and op first
    peers, q = peers_of(node, claims, replicas, quorum)
    body = await request.body()
    frames = parse_batch(body)
    check_scope(claims.covers, frames)
    # the peers check sizes and checksums themselves; start them at once
    pending = [(f.blob_id, len(f.data), f.crc32c) for f in frames]
    metas_like = [BlobMeta(b, 0, size, crc, 0, 0, 0) for b, size, crc in pending]
    local, remote = await asyncio.gather(store_batch(node, frames),
                                         forward_batch(node, body, metas_like, peers),
                                         return_exceptions=True)
    if isinstance(local, BaseException):
        raise local
    if isinstance(remote, BaseException):
        raise remote
    errors = [r for r in remote if isinstance(r, PeerError)]
    node.peer_errors += len(errors)
    good = [r for r in remote if not isinstance(r, PeerError)]
    res = {"blobs": answers(node, local, good, [e.model_dump() for e in errors])}
    if 1 + len(good) < q:
        raise Unavailable(quorum_message(f"a batch of {len(frames)} blobs", 1 + len(good),
                                         1 + len(peers), q, errors),
                          details=res, retry_after=1)
    return JSON(res)


def answers(node: DataNode, metas: list[BlobMeta], peers: list[dict[str, dict[str, str]]],
            errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``PutResult`` of each blob as plain JSON (a batch answers for many blobs): this
    node's receipt, then each peer's."""
    me = {"node_id": node.node_id, "address": node.address}
    return [{"blob_id": m.blob_id, "size": m.size, "crc32c": m.crc32c,
             "stored": [{**me, "receipt": node.receipt(m)}, *(p[m.blob_id] for p in peers)],
             "errors": errors} for m in metas]


def may_read(node: DataNode, req: BatchGetRequest, authorization: str | None) -> None:
    """Every id of a batch-get is covered: by the Authorization header, by one `token` in the
    body (a lease answer's), or by its own entry of `tokens`."""
    if req.token is not None:
        if req.tokens is not None:
            raise BadRequest("send one `token` covering every blob id or `tokens`, one per "
                             "blob id, not both")
        node.authorize(f"Bearer {req.token}", "read", req.blob_ids)
    elif req.tokens is None:
        node.authorize(authorization, "read", req.blob_ids)
    else:
        if len(req.tokens) != len(req.blob_ids):
            raise BadRequest(f"{len(req.tokens)} tokens for {len(req.blob_ids)} blob ids: "
                             "send one per blob id")
        claims: dict[str, Any] = {}  # a token covering several of the ids is checked once
        for blob_id, token in zip(req.blob_ids, req.tokens, strict=True):
            c = claims.get(token) or node.authorize(f"Bearer {token}", "read", [])
            claims[token] = c
            if not c.covers(blob_id):
                raise Forbidden(f"token does not cover blob {blob_id!r}")


def read_frames(node: DataNode, ids: list[str]) -> tuple[bytes, int]:
    """On a read thread: the answer frames of the first `ids` of a batch-get (about
    ``BATCH_READ_BYTES`` of data, in one read transaction) and how many ids they answer."""
    got = node.store.read_small(ids, node.settings.batch_blob_bytes_max, BATCH_READ_BYTES)
    return frames_of(node, got), len(got)


async def read_all_frames(node: DataNode, ids: list[str]) -> tuple[bytes, int]:
    """The frames of a first part of `ids`: small blobs read on the event loop when they
    may be (``reads.read_small_now``: a byte bound known before the read), the rest of
    the first read group on a read thread; and how many ids they answer."""
    now = node.store.read_small_now(ids, node.settings.batch_blob_bytes_max)
    if now and len(now) == len(ids):
        return frames_of(node, now), len(now)
    head, k = (frames_of(node, now), len(now)) if now else (b"", 0)
    data, n = await node.store.run(read_frames, node, ids[k:])
    return head + data, k + n


def frames_of(node: DataNode, got: list[Small]) -> bytes:
    """A batch-get's answer frames for blobs read."""
    out = []
    for r in got:
        if r.too_large:
            assert r.meta is not None
            out.append(encode_frame(r.blob_id, b"", TOO_LARGE, r.meta.crc32c))
        elif r.error is None and r.meta is not None:
            out.append(encode_frame(r.blob_id, r.data, OK, r.meta.crc32c))
            node.gets += 1
        elif isinstance(r.error, DataCorrupt):
            out.append(encode_frame(r.blob_id, b"", CORRUPT, 0))
        else:  # not here, or deleted while being read
            out.append(encode_frame(r.blob_id, b"", MISSING, 0))
    return b"".join(out)


async def batch_get(req: BatchGetRequest, node: NodeDep,
                    authorization: AuthH = None) -> Response:
    """Fetch many small blobs in one answer: a body of frames in request order; a missing,
    corrupt or too-large blob is a frame with that status and no data."""
    may_read(node, req, authorization)
    data, n = await read_all_frames(node, req.blob_ids)
    return Frames(node, data, req.blob_ids[n:])


class Frames(Response):
    """A batch-get's frames: the first read group (read before the answer, so its errors
    are clean error answers) with its length when it is the whole answer, the common case;
    else streamed chunked, group by group. A storage error after the first group cuts the
    connection (StreamAborted)."""

    media_type = "application/octet-stream"

    def __init__(self, node: DataNode, first: bytes, rest: list[str]) -> None:
        self.node, self.first, self.rest = node, first, rest
        self.status_code, self.background = 200, None
        self.raw_headers = [(b"content-type", b"application/octet-stream")]
        if not rest:
            self.raw_headers.append((b"content-length", str(len(first)).encode()))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": self.raw_headers})
        data, ids = self.first, self.rest
        while ids:  # one read transaction and one thread hop per group
            await send({"type": "http.response.body", "body": data, "more_body": True})
            try:
                data, n = await self.node.store.run(read_frames, self.node, ids)
            except StatusError as e:  # headers are gone: the only honest answer is a cut
                log.error("aborting a batch-get mid-stream: %s", e.message)
                raise StreamAborted(f"batch-get: {e.message}") from None
            ids = ids[n:]
        await send({"type": "http.response.body", "body": data, "more_body": False})
