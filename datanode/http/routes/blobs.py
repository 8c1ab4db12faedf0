"""``/v1/blobs/{blob_id}``: streaming PUT (with replication), GET with Range, HEAD, DELETE.

Every request carries ``Authorization: Bearer <token>`` for the operation (write, read,
delete) and blob. Downloads send ``X-Squall-Crc32c`` (CRC32C of the whole blob) so a
client can verify a full read; every chunk is verified on the node before it is sent, and
a corruption found mid-stream aborts the connection rather than send a wrong byte.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Header, Query, Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from squall.common.checksum import CRC_HEADER, parse_crc
from squall.common.errors import BadRequest, NotFound, StatusError
from squall.common.security.tokens import check_replicas
from squall.common.server.http import JSON
from squall.datanode.http.deps import AuthH, BlobIdP, NodeDep
from squall.datanode.replication.pipeline import store_and_forward
from squall.datanode.service import DataNode
from squall.datanode.store.blobstore import BlobMeta

log = logging.getLogger("squall.datanode.blobs")


class StreamAborted(Exception):
    """Raised mid-download (a corrupt chunk, a blob deleted meanwhile): the server closes
    the connection, so the client sees a truncated body, never wrong bytes."""
MAX_REPLICAS = 16

ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"description": "Bad input (blob id, checksum mismatch, replica list)"},
    401: {"description": "Missing, malformed, forged or expired token"},
    403: {"description": "Token valid but not for this operation, blob or replica"},
    404: {"description": "No such blob on this node"},
    409: {"description": "The blob exists with other content"},
    500: {"description": "data_corrupt: this replica failed its checksum; it is dropped"},
    503: {"description": "Write quorum not met (details name each failed peer), or storage "
                         "error"},
    507: {"description": "The node is out of space"},
}
RAW_BODY = {"requestBody": {"required": True, "content": {
    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}}
RAW_ANSWER = {"content": {"application/octet-stream": {"schema": {"type": "string",
                                                                  "format": "binary"}}}}

CrcH = Annotated[str | None, Header(alias=CRC_HEADER, description="CRC32C of the whole body "
                                    "(decimal); checked before the write is acknowledged")]
LengthH = Annotated[int | None, Header(alias="Content-Length", ge=0)]
ReplicasQ = Annotated[str, Query(max_length=8192, description="comma-separated base URLs of "
                                 "the other replicas; the write token must name them")]
QuorumQ = Annotated[int | None, Query(ge=1, le=MAX_REPLICAS, description="replicas that must "
                                      "hold the blob durably before the answer (default all)")]


def peers_of(node: DataNode, claims: Any, replicas: str, quorum: int | None
             ) -> tuple[list[str], int]:
    """The peers to forward to (checked against the token) and the write quorum."""
    urls = [u for u in (x.strip() for x in replicas.split(",")) if u]
    peers: list[str] = []
    for u in check_replicas(claims, urls):
        if u != node.address and u not in peers:
            peers.append(u)
    if len(peers) >= MAX_REPLICAS:
        raise BadRequest(f"at most {MAX_REPLICAS} replicas")
    q = 1 + len(peers) if quorum is None else quorum
    if q > 1 + len(peers):
        raise BadRequest(f"quorum {q} is larger than the replica set ({1 + len(peers)})")
    return peers, q


async def put_blob(blob_id: BlobIdP, request: Request, node: NodeDep,
                   authorization: AuthH = None, replicas: ReplicasQ = "",
                   quorum: QuorumQ = None, crc: CrcH = None,
                   content_length: LengthH = None) -> JSON:
    """Store a blob (raw body, streamed) here and on `replicas`; answers once the write
    quorum holds it durably, with one receipt per node."""
    claims = node.authorize(authorization, "write", blob_id)
    peers, q = peers_of(node, claims, replicas, quorum)
    declared = parse_crc(crc)
    if content_length is not None:
        await node.store.run(node.store.check_space, content_length)
    res = await store_and_forward(node, blob_id, request.stream(), peers, q, declared,
                                  content_length)
    return JSON(res.model_dump())


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``bytes=A-B`` / ``bytes=A-`` / ``bytes=-N`` → [start, end). None: serve the whole blob
    (no header, several ranges or one that does not parse: RFC 9110 lets a server ignore
    those). ValueError: the range is not satisfiable (416)."""
    if not header:
        return None
    unit, _, spec = header.partition("=")
    spec = spec.strip()
    first, dash, last = spec.partition("-")
    if (unit.strip().lower() != "bytes" or "," in spec or not dash
            or not (first.isdigit() or not first) or not (last.isdigit() or not last)
            or not (first or last)):
        return None
    if not first:  # the last N bytes
        n = int(last)
        if n == 0 or size == 0:
            raise ValueError("empty suffix range")
        return max(0, size - n), size
    start = int(first)
    if last and int(last) < start:
        return None
    if start >= size:
        raise ValueError("range starts past the end")
    return start, size if not last else min(size, int(last) + 1)


def _headers(meta: BlobMeta, length: int) -> dict[str, str]:
    return {"Accept-Ranges": "bytes", "ETag": f'"{meta.crc32c:08x}-{meta.size}"',
            CRC_HEADER: str(meta.crc32c), "Content-Length": str(length)}


async def _meta(node: DataNode, blob_id: str) -> BlobMeta:
    return _here(node, blob_id, await node.store.run(node.store.stat, blob_id))


def _here(node: DataNode, blob_id: str, meta: BlobMeta | None) -> BlobMeta:
    if meta is None:
        raise NotFound(f"blob {blob_id} is not on this node ({node.address})")
    return meta


async def get_blob(blob_id: BlobIdP, node: NodeDep, authorization: AuthH = None,
                   range_: Annotated[str | None, Header(alias="Range")] = None) -> Response:
    """The blob's bytes, streamed; a single ``Range: bytes=...`` gives 206 (416 if it is
    past the end)."""
    opened = await open_read(node, blob_id, authorization, range_)
    if isinstance(opened, JSON):
        return opened
    return BlobStream(blob_id, *opened)


class BlobStream(Response):
    """A blob's bytes: the headers, the part read already (so a corrupt first chunk was a
    clean error answer), then the rest of the verified stream. A storage error once the
    headers are sent cuts the connection (StreamAborted): never a wrong byte."""

    media_type = "application/octet-stream"

    def __init__(self, blob_id: str, status: int, headers: dict[str, str],
                 stream: AsyncIterator[bytes], first: bytes | None) -> None:
        self.blob_id, self.status_code, self.stream, self.first = blob_id, status, stream, first
        self.background = None
        self.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                            for k, v in headers.items()]
        self.raw_headers.append((b"content-type", b"application/octet-stream"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        part = self.first
        try:
            async for nxt in self.stream:
                await send({"type": "http.response.body", "body": part, "more_body": True})
                part = nxt
        except StatusError as e:  # headers are gone: the only honest answer is a cut
            log.error("aborting the download of %s mid-stream: %s", self.blob_id, e.message)
            raise StreamAborted(f"{self.blob_id}: {e.message}") from None
        await send({"type": "http.response.body", "body": part or b"", "more_body": False})


Opened = tuple[int, dict[str, str], AsyncIterator[bytes], bytes | None]


async def open_read(node: DataNode, blob_id: str, authorization: str | None,
                    range_: str | None) -> JSON | Opened:
    """Check the token, find the blob, resolve a Range: a 416 answer, or (status, headers,
    the byte stream, its first part — read already, so a corrupt first chunk is still a
    clean error answer)."""
    node.authorize(authorization, "read", blob_id)
    head = None
    if range_ is None:  # a whole read: the metadata and the first chunk in one thread hop
        found, head = await node.store.stat_and_head(blob_id)
        meta = _here(node, blob_id, found)
    else:
        meta = await _meta(node, blob_id)
    try:
        rng = parse_range(range_, meta.size)
    except ValueError:
        return JSON({"error": {"code": "range_not_satisfiable",
                               "message": f"range {range_!r} is outside the blob's "
                                          f"{meta.size} bytes"}},
                    status_code=416, headers={"Content-Range": f"bytes */{meta.size}"})
    start, end = rng if rng else (0, meta.size)
    headers = _headers(meta, end - start)
    if rng:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{meta.size}"
    stream = node.store.stream(meta, start, end, head)
    first = await anext(stream, None)
    node.gets += 1
    return (206 if rng else 200), headers, stream, first


async def head_blob(blob_id: BlobIdP, node: NodeDep, authorization: AuthH = None) -> Response:
    """Size and checksum of a blob (read token)."""
    node.authorize(authorization, "read", blob_id)
    meta = await _meta(node, blob_id)
    return Response(headers=_headers(meta, meta.size), media_type="application/octet-stream")


async def delete_blob(blob_id: BlobIdP, node: NodeDep, authorization: AuthH = None) -> JSON:
    """Delete a blob (delete token); idempotent: ``deleted`` says whether it was here."""
    node.authorize(authorization, "delete", blob_id)
    gone = await node.store.delete([blob_id])
    return JSON({"blob_id": blob_id, "deleted": bool(gone)})
