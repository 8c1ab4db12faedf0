"""Payload bytes on the wire between clients and data nodes: the routes' shapes, the batch
frame format, and how batch-gets are grouped.

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
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from squall.common.checksum import crc32c
from squall.common.errors import BadRequest, DataCorrupt
from squall.common.wire.cluster import TOKEN_ITEM_CHARS

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


def batch_get_headers(tokens: list[str]) -> dict[str, str]:
    """The headers of a ``:batch-get``: one of its read tokens (the shortest) as the bearer,
    which the data node checks (signature, expiry) before reading the body."""
    return {"Authorization": "Bearer " + min((t for t in tokens if t), key=len, default="")}


def fewest_nodes(replicas: list[list[str]]) -> list[str]:
    """For each blob (the replicas to read it from, best first) the node to read it from:
    greedily the node that holds most of the blobs not placed yet (ties: the one ranked
    best), so a batch of blobs is read from as few nodes as possible."""
    out = [""] * len(replicas)
    left = [i for i, r in enumerate(replicas) if r]
    while left:
        count: dict[str, int] = {}
        rank: dict[str, int] = {}
        for i in left:
            for k, u in enumerate(replicas[i]):
                count[u] = count.get(u, 0) + 1
                rank[u] = min(rank.get(u, k), k)
        best = max(count, key=lambda u: (count[u], -rank[u]))
        rest = []
        for i in left:
            if best in replicas[i]:
                out[i] = best
            else:
                rest.append(i)
        left = rest
    return out


def batch_get_body(blob_ids: list[str], tokens: list[str]) -> dict[str, Any]:
    """The body of a ``:batch-get`` of `blob_ids` with one read token per id: the token once
    when they are all the same (a lease answer's ``read_token``), else the list."""
    first = tokens[0] if tokens else ""
    if all(t == first for t in tokens):
        return {"blob_ids": blob_ids, "token": first}
    return {"blob_ids": blob_ids, "tokens": tokens}


# A lease answered by a data node with its payloads (``POST {node}/v1/groups/{g}/queues/
# {q}/lease``, ``datanode/leasing.py``): ``u32 n | n bytes of the master's JSON answer |
# frames`` (big-endian; the frames as above, status 0, one per payload attached).
_ANSWER_LEN = struct.Struct(">I")
LEASE_ANSWER_TYPE = "application/vnd.squall.lease"


def encode_lease_answer(answer: bytes, payloads: Iterable[tuple[str, bytes, int]]) -> bytes:
    """The answer's body from the master's answer and (blob id, data, CRC32C) payloads."""
    return b"".join([_ANSWER_LEN.pack(len(answer)), answer,
                     *(encode_frame(b, d, OK, c) for b, d, c in payloads)])


def decode_lease_answer(body: bytes) -> tuple[bytes, list[Frame]]:
    """(the master's JSON answer, the payload frames, unverified); BadRequest when the
    body is truncated."""
    if len(body) < _ANSWER_LEN.size:
        raise BadRequest("truncated lease answer")
    (n,) = _ANSWER_LEN.unpack_from(body)
    end = _ANSWER_LEN.size + n
    if end > len(body):
        raise BadRequest("truncated lease answer")
    return body[_ANSWER_LEN.size:end], list(decode_frames(body[end:], verify=False))
