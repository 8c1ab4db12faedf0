"""Moving payload bytes to and from data nodes: the batch frame format, and small sync httpx
helpers (the client library builds on these).

Single blobs (see ``datanode/http/routes/blobs.py``)::

    PUT  {node}/v1/blobs/{blob_id}?replicas=URL,URL[&quorum=N]
         Authorization: Bearer <write token>   X-Squall-Crc32c: <crc, optional>
         body: the raw bytes (streamed)         -> 200 PutResult JSON (receipts)
    GET  {node}/v1/blobs/{blob_id}   [Range: bytes=A-B]  -> 200 / 206 raw bytes, 416
    HEAD, DELETE likewise (read / delete tokens).

Batch frame format (``POST /v1/blobs:batch-put`` bodies and ``POST /v1/blobs:batch-get``
answers are a plain concatenation of frames)::

    u16 id_len | id (ASCII) | u8 status | u32 crc32c | u64 size | size bytes of data

all big-endian. ``status`` is 0 (ok) in uploads; in batch-get answers 1 = not found,
2 = corrupt replica (dropped; read another), 3 = too large for a batch (GET it alone), with
no data. A blob's ``crc32c`` is checked by the receiver.

Blob reads and writes take an ``httpx.Client``; with the engine's transport
(``common/transport/adapters.SyncTransport``, the client's default) a blob's body comes up
in one piece of its size.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson

from squall.common.checksum import CRC_HEADER, Crc32c, crc32c
from squall.common.errors import BadRequest, DataCorrupt, TransportError, from_response
from squall.common.wire.cluster import TOKEN_ITEM_CHARS, BatchPutResult, PutResult

OK, MISSING, CORRUPT, TOO_LARGE = 0, 1, 2, 3
_HEAD = struct.Struct(">BIQ")


@dataclass(frozen=True, slots=True)
class Frame:
    blob_id: str
    data: bytes
    crc32c: int
    status: int = OK


def encode_frame(blob_id: str, data: bytes, status: int = OK, crc: int | None = None) -> bytes:
    raw = blob_id.encode("ascii")
    crc = crc32c(data) if crc is None else crc
    return struct.pack(">H", len(raw)) + raw + _HEAD.pack(status, crc, len(data)) + data


def encode_frames(items: Iterable[tuple[str, bytes]]) -> bytes:
    return b"".join(encode_frame(b, d) for b, d in items)


def decode_frames(body: bytes, verify: bool = True) -> Iterator[Frame]:
    """Frames of a batch body; BadRequest on a truncated or malformed one, DataCorrupt on a
    checksum mismatch when `verify`."""
    view, pos, n = memoryview(body), 0, len(body)
    while pos < n:
        if pos + 2 > n:
            raise BadRequest(f"truncated batch frame at byte {pos}")
        (id_len,) = struct.unpack_from(">H", view, pos)
        pos += 2
        if id_len == 0 or pos + id_len + _HEAD.size > n:
            raise BadRequest(f"truncated or empty blob id in batch frame at byte {pos}")
        try:
            blob_id = bytes(view[pos:pos + id_len]).decode("ascii")
        except UnicodeDecodeError:
            raise BadRequest(f"blob id at byte {pos} is not ASCII") from None
        pos += id_len
        status, crc, size = _HEAD.unpack_from(view, pos)
        pos += _HEAD.size
        if pos + size > n:
            raise BadRequest(f"batch frame of blob {blob_id!r} is truncated")
        data = bytes(view[pos:pos + size])
        pos += size
        if verify and status == OK and crc32c(data) != crc:
            raise DataCorrupt(f"blob {blob_id}: CRC32C mismatch in batch frame")
        yield Frame(blob_id, data, crc, status)


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _raise_for(r: httpx.Response) -> None:
    if r.status_code >= 400:
        try:
            body: Any = r.json()
        except ValueError:
            body = r.text
        ra = r.headers.get("retry-after")
        raise from_response(r.status_code, body, float(ra) if ra and ra.isdigit() else None)


def put_blob(client: httpx.Client, node: str, blob_id: str, data: bytes | Iterable[bytes],
             token: str, replicas: Iterable[str] = (), crc: int | None = None,
             size: int | None = None, quorum: int | None = None) -> PutResult:
    """Store a blob on `node` (which forwards to `replicas`); returns where it is durable.
    `data` may be bytes or an iterable of parts (streamed; pass `size` to send a length)."""
    headers = _auth(token)
    if isinstance(data, bytes | bytearray | memoryview):
        crc = crc32c(data) if crc is None else crc
        size = len(data)
    if crc is not None:
        headers[CRC_HEADER] = str(crc)
    if size is not None:
        headers["Content-Length"] = str(size)
    params: dict[str, str] = {}
    reps = list(replicas)
    if reps:
        params["replicas"] = ",".join(reps)
    if quorum is not None:
        params["quorum"] = str(quorum)
    try:
        r = client.put(f"{node.rstrip('/')}/v1/blobs/{blob_id}", content=data, headers=headers,
                       params=params)
    except httpx.TransportError as e:
        raise TransportError(f"{node}: {e!r}") from e
    _raise_for(r)
    return PutResult.model_validate_json(r.content)


def get_blob(client: httpx.Client, node: str, blob_id: str, token: str,
             start: int | None = None, end: int | None = None) -> bytes:
    """The blob's bytes (or bytes [start, end) of it); the full blob is checked against the
    node's CRC32C header. Use :func:`iter_blob` for large blobs."""
    return b"".join(iter_blob(client, node, blob_id, token, start, end))


def _range(start: int | None, end: int | None) -> dict[str, str]:
    if start is None and end is None:
        return {}
    return {"Range": f"bytes={start or 0}-{'' if end is None else end - 1}"}


def iter_blob(client: httpx.Client, node: str, blob_id: str, token: str,
              start: int | None = None, end: int | None = None,
              chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """Stream a blob; a full read is verified against its CRC32C at the end (DataCorrupt),
    a connection the node aborts (corruption found mid-stream) raises TransportError."""
    headers = {**_auth(token), **_range(start, end)}
    try:
        with client.stream("GET", f"{node.rstrip('/')}/v1/blobs/{blob_id}",
                           headers=headers) as r:
            if r.status_code >= 400:
                r.read()
                _raise_for(r)
            want = r.headers.get(CRC_HEADER)
            c = Crc32c()
            for part in r.iter_bytes(chunk_bytes):
                c.update(part)
                yield part
    except httpx.TransportError as e:
        raise TransportError(f"{node}: reading blob {blob_id} failed: {e!r}") from e
    if r.status_code == 200 and want is not None and int(want) != c.value:
        raise DataCorrupt(f"blob {blob_id} from {node}: CRC32C {c.value} != {want}")


def delete_blob(client: httpx.Client, node: str, blob_id: str, token: str) -> bool:
    try:
        r = client.delete(f"{node.rstrip('/')}/v1/blobs/{blob_id}", headers=_auth(token))
    except httpx.TransportError as e:
        raise TransportError(f"{node}: {e!r}") from e
    _raise_for(r)
    return bool(r.json().get("deleted"))


def put_batch(client: httpx.Client, node: str, items: Iterable[tuple[str, bytes]], token: str,
              replicas: Iterable[str] = (), quorum: int | None = None) -> BatchPutResult:
    """Store many small blobs in one request, all or nothing on each node."""
    params: dict[str, str] = {}
    reps = list(replicas)
    if reps:
        params["replicas"] = ",".join(reps)
    if quorum is not None:
        params["quorum"] = str(quorum)
    try:
        r = client.post(f"{node.rstrip('/')}/v1/blobs:batch-put", content=encode_frames(items),
                        headers={**_auth(token), "Content-Type": "application/octet-stream"},
                        params=params)
    except httpx.TransportError as e:
        raise TransportError(f"{node}: {e!r}") from e
    _raise_for(r)
    return BatchPutResult.model_validate_json(r.content)


def batch_groups(reads: Iterable[tuple[int, str, str, int]], max_ids: int, max_bytes: int
                 ) -> list[tuple[str, list[int]]]:
    """Batch-gets for `reads` of (index, node, read token, size): (node, indexes) groups of
    at most `max_ids` ids and `max_bytes` bytes. A token short enough for a ``tokens`` list
    joins any group of its node; a longer one (a lease answer's, covering many ids) only a
    group with the same token, which then sends it once (:func:`batch_get_body`)."""
    out: list[tuple[str, list[int]]] = []
    open_: dict[tuple[str, str], tuple[list[int], int]] = {}
    for i, node, token, size in reads:
        key = (node, token if len(token) > TOKEN_ITEM_CHARS else "")
        idx, total = open_.get(key, ([], 0))
        if idx and (len(idx) >= max_ids or total + size > max_bytes):
            out.append((node, idx))
            idx, total = [], 0
        idx.append(i)
        open_[key] = (idx, total + size)
    return out + [(key[0], idx) for key, (idx, _) in open_.items()]


def batch_get_body(blob_ids: list[str], tokens: list[str]) -> dict[str, Any]:
    """The body of a ``:batch-get`` of `blob_ids` with one read token per id: the token once
    when they are all the same (a lease answer's ``read_token``), else the list."""
    first = tokens[0] if tokens else ""
    if all(t == first for t in tokens):
        return {"blob_ids": blob_ids, "token": first}
    return {"blob_ids": blob_ids, "tokens": tokens}


def get_batch(client: httpx.Client, node: str, blob_ids: list[str], token: str | list[str]
              ) -> dict[str, Frame]:
    """Fetch many small blobs; every frame's checksum is verified. Frames with a non-zero
    status (missing, corrupt, too large) are returned as they are, without data. `token`
    covers every id, or is a list of one token per id (see :func:`batch_get_body`)."""
    body: dict[str, Any] = {"blob_ids": blob_ids}
    headers = {"Content-Type": "application/json"}
    if isinstance(token, str):
        headers.update(_auth(token))
    else:
        body = batch_get_body(blob_ids, token)
    try:
        r = client.post(f"{node.rstrip('/')}/v1/blobs:batch-get", content=orjson.dumps(body),
                        headers=headers)
    except httpx.TransportError as e:
        raise TransportError(f"{node}: {e!r}") from e
    _raise_for(r)
    return {f.blob_id: f for f in decode_frames(r.content)}
