"""Blob requests to data nodes as plain functions over an ``httpx.Client``: what the data
node tests and benchmarks send (the client library has its own, ``client/_blobs.py``). With
the engine's transport (``common/transport/adapters.SyncTransport``) a blob's body comes up
in one piece of its size."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import httpx
import orjson

from squall.common.checksum import CRC_HEADER, Crc32c, crc32c
from squall.common.errors import DataCorrupt, TransportError, from_response
from squall.common.wire.cluster import BatchPutResult, PutResult
from squall.common.wire.payload import (
    Frame,
    batch_get_body,
    batch_get_headers,
    decode_frames,
    encode_frames,
)


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


def _forwarding(replicas: Iterable[str], quorum: int | None) -> dict[str, str]:
    """The query of a put: the replicas the node forwards to, and the quorum."""
    params: dict[str, str] = {}
    reps = list(replicas)
    if reps:
        params["replicas"] = ",".join(reps)
    if quorum is not None:
        params["quorum"] = str(quorum)
    return params


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
    params = _forwarding(replicas, quorum)
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
    params = _forwarding(replicas, quorum)
    try:
        r = client.post(f"{node.rstrip('/')}/v1/blobs:batch-put", content=encode_frames(items),
                        headers={**_auth(token), "Content-Type": "application/octet-stream"},
                        params=params)
    except httpx.TransportError as e:
        raise TransportError(f"{node}: {e!r}") from e
    _raise_for(r)
    return BatchPutResult.model_validate_json(r.content)


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
        headers.update(batch_get_headers(token))
    try:
        r = client.post(f"{node.rstrip('/')}/v1/blobs:batch-get", content=orjson.dumps(body),
                        headers=headers)
    except httpx.TransportError as e:
        raise TransportError(f"{node}: {e!r}") from e
    _raise_for(r)
    return {f.blob_id: f for f in decode_frames(r.content)}
