"""Batch forms for many small blobs: ``POST /v1/blobs:batch-put`` and ``:batch-get``.

Bodies use the frame format of :mod:`squall.common.payload`. A batch-put is all or nothing
on each node (one transaction, one sync) and is forwarded as a whole to the other replicas'
``POST /v1/replicate:batch-put``; the answer has, per blob, every node's receipt. The
batch body is bounded by ``max_body_bytes`` (413 above it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from starlette.responses import StreamingResponse

from squall.common.cluster import (
    BatchGetRequest,
    BatchPutResult,
    PeerError,
    PutResult,
    StoredReplica,
    check_blob_id,
)
from squall.common.errors import BadRequest, DataCorrupt, Forbidden, NotFound, Unavailable
from squall.common.http import JSON
from squall.common.models import MAX_BATCH
from squall.common.payload import (
    CORRUPT,
    MISSING,
    OK,
    TOO_LARGE,
    Frame,
    decode_frames,
    encode_frame,
)
from squall.datanode.deps import AuthH, NodeDep
from squall.datanode.replication import forward_batch, quorum_message
from squall.datanode.routes.blobs import ERRORS, RAW_ANSWER, RAW_BODY, QuorumQ, ReplicasQ, peers_of
from squall.datanode.service import DataNode
from squall.datanode.store import BlobMeta

router = APIRouter(tags=["blobs"])


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


async def store_batch(node: DataNode, frames: list[Frame]) -> list[BlobMeta]:
    res = await node.store.put_batch([(f.blob_id, f.data, f.crc32c) for f in frames])
    node.puts += len(frames)
    return [m for m, _ in res]


@router.post("/v1/blobs:batch-put", response_model=BatchPutResult, responses=ERRORS,
             openapi_extra=RAW_BODY)
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
    out = []
    for m in local:
        stored = [StoredReplica(node_id=node.node_id, address=node.address,
                                receipt=node.receipt(m))]
        stored += [g[m.blob_id] for g in good]
        out.append(PutResult(blob_id=m.blob_id, size=m.size, crc32c=m.crc32c, stored=stored,
                             errors=errors))
    res = BatchPutResult(blobs=out)
    if 1 + len(good) < q:
        raise Unavailable(quorum_message(f"a batch of {len(frames)} blobs", 1 + len(good),
                                         1 + len(peers), q, errors),
                          details=res.model_dump(), retry_after=1)
    return JSON(res.model_dump())


@router.post("/v1/blobs:batch-get", responses={200: RAW_ANSWER, **ERRORS})
async def batch_get(req: BatchGetRequest, node: NodeDep,
                    authorization: AuthH = None) -> StreamingResponse:
    """Fetch many small blobs in one answer: a body of frames in request order; a missing,
    corrupt or too-large blob is a frame with that status and no data."""
    node.authorize(authorization, "read", req.blob_ids)
    limit = node.settings.batch_blob_bytes_max

    async def one(blob_id: str) -> bytes:
        try:
            meta = await node.store.run(node.store.stat, blob_id)
            if meta is None:
                return encode_frame(blob_id, b"", MISSING, 0)
            if meta.size > limit:
                return encode_frame(blob_id, b"", TOO_LARGE, meta.crc32c)
            data = b"".join([p async for p in node.store.stream(meta)])
        except DataCorrupt:
            return encode_frame(blob_id, b"", CORRUPT, 0)
        except NotFound:
            return encode_frame(blob_id, b"", MISSING, 0)
        node.gets += 1
        return encode_frame(blob_id, data, OK, meta.crc32c)

    async def body() -> AsyncIterator[bytes]:
        for blob_id in req.blob_ids:
            yield await one(blob_id)

    return StreamingResponse(body(), media_type="application/octet-stream")
