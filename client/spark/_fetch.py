"""Many small payloads at once: one ``POST {node}/v1/blobs:batch-get`` per data node for a
batch of tasks, instead of one ``GET`` per task.

The client library reads one payload per call (``LeasedTask.payload()``); a stage leasing
hundreds of small tasks per batch would spend its time on those round trips. Here the
payloads up to ``BATCH_BLOB_BYTES`` are grouped by their first live replica (and long
read token: a lease answer's) and fetched with ``squall.common.wire.payload.get_batch`` (the
lease answer's one read token, sent once); each frame is checked against the size and
CRC32C the master recorded. Anything that does not come back whole (a node down, a blob
missing or corrupt there, a large blob) falls back to ``fallback(i)``: the client's own
read, with failover across replicas.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

import httpx

from squall.common.errors import SquallError
from squall.common.wire.models import PayloadRef
from squall.common.wire.payload import OK, batch_groups, get_batch

log = logging.getLogger("squall.spark")
BATCH_BLOB_BYTES = 256 << 10
BATCH_BODY_BYTES = 16 << 20
BATCH_IDS_MAX = 1000


def _groups(refs: Sequence[PayloadRef | None]) -> list[tuple[str, list[int]]]:
    """(node, indexes) of the small payloads, each group within the batch-get limits."""
    return batch_groups(((i, r.replicas[0], r.token, r.size) for i, r in enumerate(refs)
                         if r is not None and r.size <= BATCH_BLOB_BYTES and r.replicas
                         and r.token), BATCH_IDS_MAX, BATCH_BODY_BYTES)


def _fetch_group(http: httpx.Client, node: str, idx: list[int],
                 refs: Sequence[PayloadRef | None]) -> dict[int, bytes]:
    got: dict[int, bytes] = {}
    live = [r for r in (refs[i] for i in idx) if r is not None]
    try:
        frames = get_batch(http, node, [r.blob_id for r in live],
                           [r.token or "" for r in live])
    except (SquallError, httpx.HTTPError) as e:
        log.info("batch read from %s failed (%s); reading one by one", node, e)
        return got
    for i in idx:
        ref = refs[i]
        f = frames.get(ref.blob_id) if ref is not None else None
        if (ref is not None and f is not None and f.status == OK
                and len(f.data) == ref.size and f.crc32c == ref.crc32c):
            got[i] = f.data
    return got


def _guarded(fallback: Callable[[int], bytes], i: int) -> bytes | SquallError:
    try:
        return fallback(i)
    except SquallError as e:
        return e


def fetch_many(http: httpx.Client, refs: Sequence[PayloadRef | None],
               fallback: Callable[[int], bytes], pool: Executor | None = None
               ) -> list[bytes | SquallError | None]:
    """The payload of every ref, in order: None where a task has none, the error where no
    replica could deliver it (the caller decides: fail the task, or the whole read)."""
    out: list[bytes | SquallError | None] = [None] * len(refs)
    groups = _groups(refs)
    if pool is not None and len(groups) > 1:
        parts = list(pool.map(lambda g: _fetch_group(http, g[0], g[1], refs), groups))
    else:
        parts = [_fetch_group(http, node, idx, refs) for node, idx in groups]
    for part in parts:
        for i, data in part.items():
            out[i] = data
    missing = [i for i, r in enumerate(refs) if r is not None and out[i] is None]
    if pool is not None and len(missing) > 1:
        for i, d in zip(missing, pool.map(lambda j: _guarded(fallback, j), missing),
                        strict=True):
            out[i] = d
    else:
        for i in missing:
            out[i] = _guarded(fallback, i)
    return out
