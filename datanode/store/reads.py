"""The read path of the blob store: verified chunks out of LMDB (see ``blobstore.py``).

- :func:`read_chunks`: a group of a blob's chunks in one read transaction, each copied once
  out of the map and checked against its CRC32C and expected length.
- :func:`stream`: a blob's bytes [start, end) as verified chunks, reading one group ahead
  (the first group is one chunk, so the first bytes leave early; the next ones are
  ``read_bytes`` each, so a 4 MiB blob is two thread hops, not three); a full read also
  checks the blob's CRC32C before its last chunk leaves. That whole-blob CRC is combined
  from the chunks' own CRCs (``layout.running_crc``), so each byte is checksummed once: only
  a short last chunk is passed over twice.
- :func:`read_small`: many small blobs in one read transaction and one thread hop (batch
  reads), each fully verified; :func:`read_small_now` the same on the event loop, for a
  byte count bounded before the read (no thread hand-off).

A mismatch drops the replica (the caller's :meth:`BlobStore.quarantine`) and raises or
reports :class:`DataCorrupt`, so a read never returns wrong bytes.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import lmdb

from squall.common.checksum import crc32c
from squall.common.errors import DataCorrupt, NotFound, StatusError
from squall.datanode.store.layout import HEADER, U32, BlobMeta, chunk_key, running_crc

if TYPE_CHECKING:
    from squall.datanode.store.blobstore import BlobStore


def _missing(store: BlobStore, txn: lmdb.Transaction, meta: BlobMeta, index: int
             ) -> StatusError:
    cur = txn.get(meta.blob_id.encode(), db=store.db[b"blobs"])
    if cur is None or BlobMeta.unpack(meta.blob_id, cur).upload != meta.upload:
        return NotFound(f"blob {meta.blob_id} was deleted while being read")
    return DataCorrupt(f"blob {meta.blob_id}: chunk {index} is missing")


def _corrupt_chunk(meta: BlobMeta, index: int) -> DataCorrupt:
    return DataCorrupt(f"blob {meta.blob_id}: chunk {index} fails its CRC32C check; this "
                       "replica is dropped, read another")


def read_chunks(store: BlobStore, meta: BlobMeta, first: int, count: int
                ) -> tuple[list[bytes], StatusError | None]:
    """Chunks first.. of the blob, verified, in one read transaction; stops at the first
    bad one: (the good chunks before it, DataCorrupt / NotFound (deleted meanwhile))."""
    out, err, _ = _read_group(store, meta, first, count, None)
    return out, err


Group = tuple[list[bytes], StatusError | None, list[int]]  # chunks, error, running CRC32Cs


def stat_and_head(store: BlobStore, blob_id: str) -> tuple[BlobMeta | None, Group | None]:
    """On a read thread: a blob's metadata and, when it has bytes, its first chunk as a
    whole-blob :func:`stream` reads it first (its ``head``): a small blob's read in one
    thread hop instead of two."""
    meta = store.stat(blob_id)
    if meta is None or meta.size == 0:
        return meta, None
    return meta, _read_group(store, meta, 0, 1, 0)


def _read_group(store: BlobStore, meta: BlobMeta, first: int, count: int, crc: int | None
                ) -> Group:
    """read_chunks, and when `crc` is not None the running whole-blob CRC32C after each
    good chunk (computed here, in the reader thread, while the data is in cache)."""
    out: list[bytes] = []
    crcs: list[int] = []
    chunks = store.db[b"chunks"]
    with store.env.read(buffers=True) as txn:
        for i in range(first, first + count):
            raw = txn.get(chunk_key(meta.upload, i), db=chunks)
            if raw is None:
                return out, _missing(store, txn, meta, i), crcs
            data = bytes(raw[HEADER:])  # the one copy out of the map
            own = crc32c(data)
            if len(data) != meta.chunk_len(i) or own != U32.unpack_from(raw)[0]:
                return out, _corrupt_chunk(meta, i), crcs
            out.append(data)
            if crc is not None:
                crc = running_crc(crc, own, data, i, meta.chunk_bytes)
                crcs.append(crc)
    store.bytes_read += sum(len(d) for d in out)
    return out, None, crcs


async def stream(store: BlobStore, meta: BlobMeta, start: int = 0, end: int | None = None,
                 head: Group | None = None) -> AsyncIterator[bytes]:
    """The verified bytes [start, end) of a blob, chunk by chunk (one group read ahead).
    On corruption the replica is dropped and DataCorrupt raised, before any wrong byte.
    `head`: the first group of a whole-blob read, read already (:func:`stat_and_head`)."""
    end = meta.size if end is None else end
    if start >= end:
        return
    cb = meta.chunk_bytes
    first, last = start // cb, (end - 1) // cb
    whole = start == 0 and end == meta.size
    group_max = max(1, store.read_bytes // cb)
    i = first
    loop = asyncio.get_running_loop()
    nxt: asyncio.Future[Group]
    if head is not None and whole:
        nxt = loop.create_future()
        nxt.set_result(head)
    else:
        nxt = loop.run_in_executor(store.pool, _read_group, store, meta, first, 1,
                                   0 if whole else None)
    try:
        while i <= last:
            chunks, err, crcs = await nxt
            after = i + len(chunks)
            if err is None and after <= last:  # read the next group while this one goes
                nxt = loop.run_in_executor(store.pool, _read_group, store, meta, after,
                                           min(group_max, last + 1 - after),
                                           crcs[-1] if whole else None)
            for j, data in enumerate(chunks, i):
                if whole and j == last and crcs[-1] != meta.crc32c:
                    raise DataCorrupt(f"blob {meta.blob_id} fails its CRC32C check; "
                                      "this replica is dropped, read another")
                lo = start - j * cb if j == first else 0
                hi = end - j * cb if j == last else len(data)
                yield data if (lo, hi) == (0, len(data)) else data[lo:hi]
            if err is not None:
                raise err
            i = after
    except DataCorrupt:
        await store.quarantine(meta)
        raise
    finally:
        if not nxt.done():
            nxt.cancel()


@dataclass(frozen=True, slots=True)
class Small:
    """One blob of a batch read: its data when ``error`` is None; ``too_large`` blobs are
    not read (over the batch limit); ``meta`` is None when the blob is not here."""

    blob_id: str
    meta: BlobMeta | None
    data: bytes = b""
    error: StatusError | None = None
    too_large: bool = False


def read_small(store: BlobStore, blob_ids: list[str], limit: int, budget: int = 16 << 20
               ) -> list[Small]:
    """Blobs of `blob_ids` in one read transaction, each verified (chunks and whole
    CRC32C), up to about `budget` bytes of data (at least one blob): the caller asks again
    for the ids after those answered. Blobs found corrupt are quarantined (their Small has a
    DataCorrupt error)."""
    with store.env.read(buffers=True) as txn:
        return _read_small(store, txn, blob_ids, limit, budget, False)


# Small reads on the event loop (no thread hand-off). The bytes such a read may copy are
# bounded before it starts: blobs of at most LOOP_BLOB_BYTES, LOOP_BYTES in all (the last
# blob may pass it by one blob): at most 128 KiB copied and checksummed, ~30 us when the
# pages are in memory. A page that is not (a cold blob) makes the loop wait for the disk:
# the read's major page faults (the kernel's count of faults that had to read from disk,
# `getrusage(RUSAGE_THREAD)`, ~1 us to ask) say whether it touched the disk, and after
# one that did, reads go back to the threads for LOOP_BACKOFF_S (a cold store stays on
# threads; a hot one, the common case of a queue whose tasks are read soon after they
# were written, stays on the loop). Wall time would not do: on a busy machine a read is
# often preempted without touching the disk.
LOOP_BLOB_BYTES = 64 << 10
LOOP_BYTES = 64 << 10
LOOP_BACKOFF_S = 10.0


def _major_faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_majflt


@dataclass
class LoopReads:
    """A store's reads on the event loop: counters, and until when they are off."""

    reads: int = 0
    cold: int = 0  # reads that touched the disk (major page faults)
    off_until: float = 0.0


def read_small_now(store: BlobStore, blob_ids: list[str], limit: int) -> list[Small] | None:
    """On the event loop: the blobs of a prefix of `blob_ids` as :func:`read_small` reads
    them, stopping before the first one over ``min(limit, LOOP_BLOB_BYTES)`` bytes and
    after LOOP_BYTES; None when reads must go to a thread now (a map resize under way, a
    recent read that touched the disk). The caller reads the ids after the prefix on a
    thread."""
    lr = store.loop_reads
    if lr.off_until and time.monotonic() < lr.off_until:
        return None
    faults = _major_faults()
    with store.env.read_now(buffers=True) as txn:
        if txn is None:
            return None
        out = _read_small(store, txn, blob_ids, min(limit, LOOP_BLOB_BYTES), LOOP_BYTES,
                          True)
    lr.reads += 1
    if _major_faults() != faults:
        lr.cold += 1
        lr.off_until = time.monotonic() + LOOP_BACKOFF_S
    return out


def _read_small(store: BlobStore, txn: lmdb.Transaction, blob_ids: list[str], limit: int,
                budget: int, stop_over: bool) -> list[Small]:
    """read_small's work in `txn`. `stop_over`: a blob over `limit` ends the read (it is
    not answered) instead of being answered as too large."""
    out: list[Small] = []
    blobs, chunks = store.db[b"blobs"], store.db[b"chunks"]
    bad: list[BlobMeta] = []
    nbytes = 0
    for blob_id in blob_ids:
        if out and nbytes >= budget:
            break
        raw = txn.get(blob_id.encode(), db=blobs)
        try:
            meta = None if raw is None else BlobMeta.unpack(blob_id, raw)
        except DataCorrupt as e:
            bad.append(BlobMeta(blob_id, 0, 0, 0, 0, 0, 0))
            out.append(Small(blob_id, None, error=e))
            continue
        if meta is not None and meta.size > limit and stop_over:
            break
        if meta is None or meta.size > limit:
            out.append(Small(blob_id, meta, too_large=meta is not None))
            continue
        parts: list[bytes] = []
        err: StatusError | None = None
        whole = 0
        for i in range(meta.nchunks):
            rec = txn.get(chunk_key(meta.upload, i), db=chunks)
            if rec is None:
                err = _missing(store, txn, meta, i)
                break
            data = bytes(rec[HEADER:])
            own = crc32c(data)
            if len(data) != meta.chunk_len(i) or own != U32.unpack_from(rec)[0]:
                err = _corrupt_chunk(meta, i)
                break
            parts.append(data)
            whole = running_crc(whole, own, data, i, meta.chunk_bytes)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        if err is None and whole != meta.crc32c:
            err = DataCorrupt(f"blob {blob_id} fails its CRC32C check")
        if isinstance(err, DataCorrupt):
            bad.append(meta)
        out.append(Small(blob_id, meta, data if err is None else b"", err))
        nbytes += len(data)
    store.bytes_read += sum(len(s.data) for s in out)
    for meta in bad:  # dropped and reported, as a streamed read would
        store.quarantine_submit(meta)
    return out
