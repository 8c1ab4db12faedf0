"""The data node's blob store: payloads as CRC32C-checked chunks in LMDB.

Layout (named databases of one environment, see ``lmdbenv.py``; integers big-endian so
keys sort numerically)::

    meta     b"next_upload" -> u64   highest upload id used so far
             b"count"       -> u64   committed blobs
             b"bytes"       -> u64   payload bytes of committed blobs
    blobs    blob id (ASCII) -> msgpack [upload, size, crc32c, nchunks, chunk_bytes,
                                         committed_ms] + u32 crc32c of that msgpack
    chunks   upload u64 | index u32 -> u32 crc32c(data) | data   (chunk_bytes of data;
                                                                 the last one shorter)
    pending  upload u64 -> msgpack [blob id, started_ms]         uploads not committed yet

A blob's chunks are keyed by an **upload id**, not by the blob id: an upload writes under a
fresh id, so a failed or concurrent upload of the same blob never touches committed
chunks, and committing is one small record. States: *uploading* (a ``pending`` record and
some chunks) → *committed* (a ``blobs`` record, ``pending`` gone) → deleted (all gone).

Write path (``upload.py``): each byte of the body is copied once, into its chunk record,
which goes to LMDB as it is. A payload up to ``txn_bytes`` is one write op (chunks +
``blobs`` record) that the writer thread group-commits with its neighbours. A larger one is
streamed in: every ``txn_bytes`` of chunks are committed under a ``pending`` record (bounded
memory; the next part streams in meanwhile), and the last op writes the remaining chunks and
the ``blobs`` record; only after that op is synced is the blob acknowledged. Upload ids are
handed out in memory from ``next_upload`` (each op that uses one raises the stored value to
it), so a streamed upload never waits for the writer to learn its id. An upload that fails
or is cut off deletes its chunks; uploads left pending by a crash are deleted when the store
opens. Writing a blob id that already exists is a no-op success when size and checksum
match, else :class:`Conflict`.

Read path: chunks are read in groups (one read transaction and one thread hop for up to
``read_bytes``; the first group is one chunk, so the first bytes leave early), copied once
out of the map, and each is checked against its CRC32C (and its expected length); a full
read also checks the blob's CRC32C, combined from the chunks' CRCs, before its last chunk
leaves. A mismatch raises :class:`DataCorrupt` and drops the replica (it is reported in
the next heartbeat), so a read never returns wrong bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import lmdb
import msgpack

from squall.common.errors import (
    BadRequest,
    Conflict,
    DataCorrupt,
    InsufficientStorage,
    StatusError,
)
from squall.datanode.store import reads
from squall.datanode.store.journal import Journal
from squall.datanode.store.layout import HEADER, U32, U64, BlobMeta, chunk_key, running_crc
from squall.datanode.store.lmdbenv import RECORD_COST_BYTES, Env
from squall.datanode.store.upload import Upload, records_of

__all__ = ["BlobMeta", "BlobStore", "Space", "Upload"]

T = TypeVar("T")
_U32, _U64 = U32, U64
DBS = (b"meta", b"blobs", b"chunks", b"pending")


@dataclass(frozen=True, slots=True)
class Space:
    capacity_bytes: int
    used_bytes: int
    free_bytes: int
    blob_count: int


class BlobStore:
    def __init__(self, path: str, chunk_bytes: int = 1 << 20, txn_bytes: int = 8 << 20,
                 map_size: int = 1 << 30, map_size_max: int = 1 << 40,
                 read_threads: int = 8, read_bytes: int = 4 << 20) -> None:
        if chunk_bytes < 4096 or txn_bytes < chunk_bytes:
            raise ValueError("need chunk_bytes >= 4096 and txn_bytes >= chunk_bytes")
        self.chunk_bytes, self.txn_bytes, self.read_bytes = chunk_bytes, txn_bytes, read_bytes
        self.env = Env(path, DBS, map_size, map_size_max)
        self.db = self.env.dbs
        self.journal = Journal()
        self.pool = ThreadPoolExecutor(read_threads, thread_name_prefix="blob-read")
        self.bytes_written = self.bytes_read = self.corrupt_found = 0
        self.uploads_open = 0  # Upload objects neither committed nor aborted
        self.loop_reads = reads.LoopReads()  # small reads served on the event loop
        self.name = "this data node"  # the owner sets its id and address (error messages)
        self._leaked: set[int] = set()
        with self.env.read() as txn:
            stale = [_U64.unpack(k)[0] for k, _ in txn.cursor(db=self.db[b"pending"])]
            last = _get_u64(txn, self.db[b"meta"], b"next_upload")
        self._upload_ids = itertools.count(last + 1)
        for upload in stale:
            self.env.submit(functools.partial(self._op_abort, upload), durable=False).result()

    def new_upload_id(self) -> int:
        return next(self._upload_ids)

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        self.env.close()

    # -- reads (blocking: call from threads, or through `run`) ------------------------------
    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    def stat(self, blob_id: str) -> BlobMeta | None:
        """The blob's metadata; a damaged record drops the replica and raises DataCorrupt."""
        with self.env.read() as txn:
            raw = txn.get(blob_id.encode(), db=self.db[b"blobs"])
        try:
            return None if raw is None else BlobMeta.unpack(blob_id, raw)
        except DataCorrupt:
            self.quarantine_submit(BlobMeta(blob_id, 0, 0, 0, 0, 0, 0)).result()
            raise

    def read_chunks(self, meta: BlobMeta, first: int, count: int
                    ) -> tuple[list[bytes], StatusError | None]:
        return reads.read_chunks(self, meta, first, count)

    def stream(self, meta: BlobMeta, start: int = 0, end: int | None = None,
               head: reads.Group | None = None) -> AsyncIterator[bytes]:
        return reads.stream(self, meta, start, end, head)

    async def stat_and_head(self, blob_id: str) -> tuple[BlobMeta | None, reads.Group | None]:
        """The blob's metadata and its first chunk, in one thread hop (see reads.py)."""
        return await self.run(reads.stat_and_head, self, blob_id)

    def read_small(self, blob_ids: list[str], limit: int, budget: int = 16 << 20
                   ) -> list[reads.Small]:
        return reads.read_small(self, blob_ids, limit, budget)

    def read_small_now(self, blob_ids: list[str], limit: int) -> list[reads.Small] | None:
        return reads.read_small_now(self, blob_ids, limit)

    def ids_after(self, after: str | None, limit: int) -> list[str]:
        out: list[str] = []
        with self.env.read() as txn:
            cur = txn.cursor(db=self.db[b"blobs"])
            ok = cur.set_range(after.encode() + b"\0") if after is not None else cur.first()
            while ok and len(out) < limit:
                out.append(cur.key().decode())
                ok = cur.next()
        return out

    def all_ids(self) -> list[str]:
        with self.env.read() as txn:
            return [k.decode() for k in txn.cursor(db=self.db[b"blobs"]).iternext(values=False)]

    def inventory(self) -> tuple[list[str], list[int]]:
        """Every blob id and its size (a full block report). A damaged record's size is
        reported as 0 (the read that finds it drops and reports the replica)."""
        ids: list[str] = []
        sizes: list[int] = []
        with self.env.read(buffers=True) as txn:
            for k, v in txn.cursor(db=self.db[b"blobs"]):
                ids.append(bytes(k).decode())
                try:
                    sizes.append(int(msgpack.unpackb(bytes(v[:-4]))[1]))
                except Exception:
                    sizes.append(0)
        return ids, sizes

    def space(self) -> Space:
        with self.env.read() as txn:
            count = _get_u64(txn, self.db[b"meta"], b"count")
            used = _get_u64(txn, self.db[b"meta"], b"bytes")
        reusable = self.env.free_pages_bytes()
        file_bytes = self.env.file_bytes()
        room = min(self.env.map_size_max - file_bytes,
                   self.env.disk_free() + self.env.prealloc_tail())
        free = max(0, room + reusable)
        return Space(used + free, used, free, count)

    def check_space(self, nbytes: int) -> None:
        """InsufficientStorage now, rather than after streaming `nbytes` that cannot fit."""
        reserve = nbytes // 64 + 2 * self.chunk_bytes
        free = self.space().free_bytes
        if nbytes + reserve > free:
            raise InsufficientStorage(
                f"data node {self.name} is full: {free} bytes free, and a {nbytes}-byte blob "
                f"does not fit with its {reserve}-byte reserve (1/64 of the blob for LMDB "
                f"pages plus two {self.chunk_bytes}-byte chunks); free disk space there or add "
                "data nodes")

    # -- writes ------------------------------------------------------------------------------
    async def _submit(self, fn: Callable[[lmdb.Transaction], T], durable: bool,
                      nbytes: int = 0, background: bool = False) -> T:
        fut: Future[T] = self.env.submit(fn, durable, nbytes, background)
        return await asyncio.wrap_future(fut)

    def upload(self, blob_id: str, declared_crc: int | None = None,
               background: bool = False) -> Upload:
        """`background`: a repair copy, written behind client writes (``lmdbenv.py``)."""
        return Upload(self, blob_id, declared_crc, background)

    async def put(self, blob_id: str, data: bytes, declared_crc: int | None = None
                  ) -> tuple[BlobMeta, bool]:
        """Store a payload held in memory; (meta, created)."""
        up = self.upload(blob_id, declared_crc)
        await up.write(data)
        return await up.commit()

    async def put_batch(self, items: list[tuple[str, bytes, int | None]],
                        background: bool = False) -> list[tuple[BlobMeta, bool]]:
        """Store small payloads all or nothing, in one transaction and one sync
        (`background`: repair copies, behind client writes)."""
        prepared = []
        cb = self.chunk_bytes
        for blob_id, data, declared in items:
            records = records_of(data, cb)
            crc = 0  # the blob's, from its chunks' (each byte checksummed once)
            for i, rec in enumerate(records):
                crc = running_crc(crc, _U32.unpack_from(rec)[0], memoryview(rec)[HEADER:], i,
                                  cb)
            if declared is not None and declared != crc:
                raise BadRequest(f"blob {blob_id}: CRC32C of the bytes received is {crc}, "
                                 f"the declared one {declared}; nothing was stored")
            prepared.append((blob_id, self.new_upload_id(), records, len(data), crc))

        def op(txn: lmdb.Transaction) -> list[tuple[BlobMeta, bool]]:
            return [self._op_commit(b, up, False, 0, recs, size, crc, txn)
                    for b, up, recs, size, crc in prepared]

        nbytes = sum(len(d) for _, d, _ in items)
        if background:  # repair copies: bound the Python work of each commit, not only bytes
            nbytes += RECORD_COST_BYTES * len(items)
        out = await self._submit(op, True, nbytes, background)
        self._note_written(out)
        return out

    async def delete(self, blob_ids: list[str]) -> list[str]:
        gone = await self._submit(functools.partial(self._op_delete, blob_ids, None), True)
        self.journal.deleted(gone)
        return gone

    async def quarantine(self, meta: BlobMeta) -> None:
        await asyncio.wrap_future(self.quarantine_submit(meta))

    def quarantine_submit(self, meta: BlobMeta) -> Future[list[str]]:
        """Drop a replica found corrupt (if it is still that upload) and report it."""
        fut: Future[list[str]] = self.env.submit(
            functools.partial(self._op_delete, [meta.blob_id], meta.upload), True)

        def done(f: Future[list[str]]) -> None:
            if not f.exception() and f.result():
                self.corrupt_found += 1
                self.journal.deleted(f.result(), corrupt=True)

        fut.add_done_callback(done)
        return fut

    def retry_leaked(self) -> None:
        """Delete chunks of failed uploads whose cleanup failed (e.g. on a full disk)."""
        for upload in list(self._leaked):
            with contextlib.suppress(Exception):
                self.env.submit(functools.partial(self._op_abort, upload), False).result()
                self._leaked.discard(upload)

    def _note_written(self, results: list[tuple[BlobMeta, bool]]) -> None:
        created = [m for m, c in results if c]
        self.bytes_written += sum(m.size for m in created)
        self.journal.added([m.blob_id for m in created], [m.size for m in created])

    # -- write ops: run by the writer thread inside a (nested) write transaction -------------
    def _put_chunks(self, txn: lmdb.Transaction, upload: int, start: int,
                    records: list[bytes | bytearray] | list[bytearray]) -> None:
        db = self.db[b"chunks"]
        for i, rec in enumerate(records, start):
            txn.put(chunk_key(upload, i), rec, db=db)

    def _note_upload(self, txn: lmdb.Transaction, upload: int) -> None:
        """Ids handed out in memory are recorded as used with the op that uses them."""
        if upload > _get_u64(txn, self.db[b"meta"], b"next_upload"):
            txn.put(b"next_upload", _U64.pack(upload), db=self.db[b"meta"])

    def _op_flush(self, upload: int, blob_id: str, start: int, records: list[bytearray],
                  first: bool, txn: lmdb.Transaction) -> None:
        if first:
            self._note_upload(txn, upload)
            txn.put(_U64.pack(upload), msgpack.packb([blob_id, int(time.time() * 1000)]),
                    db=self.db[b"pending"])
        self._put_chunks(txn, upload, start, records)

    def _op_commit(self, blob_id: str, upload: int, flushed: bool, start: int,
                   records: list[bytes | bytearray] | list[bytearray], size: int, crc: int,
                   txn: lmdb.Transaction) -> tuple[BlobMeta, bool]:
        key = blob_id.encode()
        old = txn.get(key, db=self.db[b"blobs"])
        if old is not None:
            m = BlobMeta.unpack(blob_id, old)
            if (m.size, m.crc32c) != (size, crc):
                raise Conflict(f"blob {blob_id} already exists with other content "
                               f"({m.size} bytes, crc32c {m.crc32c})")
            if flushed:
                self._op_abort(upload, txn)
            return m, False
        if flushed:
            if not txn.delete(_U64.pack(upload), db=self.db[b"pending"]):
                raise Conflict(f"upload of blob {blob_id} was cleaned up before its commit")
        else:
            self._note_upload(txn, upload)
        self._put_chunks(txn, upload, start, records)
        nchunks = -(-size // self.chunk_bytes)
        meta = BlobMeta(blob_id, upload, size, crc, nchunks, self.chunk_bytes,
                        int(time.time() * 1000))
        txn.put(key, meta.pack(), db=self.db[b"blobs"])
        self._count(txn, 1, size)
        return meta, True

    def _op_abort(self, upload: int, txn: lmdb.Transaction) -> None:
        # only while pending: the chunks of a committed upload belong to its blob
        if txn.delete(_U64.pack(upload), db=self.db[b"pending"]):
            self._delete_chunks(txn, upload)

    def _op_delete(self, blob_ids: list[str], only_upload: int | None,
                   txn: lmdb.Transaction) -> list[str]:
        gone = []
        for blob_id in blob_ids:
            raw = txn.get(blob_id.encode(), db=self.db[b"blobs"])
            if raw is None:
                continue
            try:
                m = BlobMeta.unpack(blob_id, raw)
                upload, size = m.upload, m.size
            except DataCorrupt:
                upload, size = 0, 0
            if only_upload is not None and upload != only_upload:
                continue
            if upload:
                self._delete_chunks(txn, upload)
            txn.delete(blob_id.encode(), db=self.db[b"blobs"])
            self._count(txn, -1, -size)
            gone.append(blob_id)
        return gone

    def _delete_chunks(self, txn: lmdb.Transaction, upload: int) -> None:
        prefix = _U64.pack(upload)
        cur = txn.cursor(db=self.db[b"chunks"])
        ok = cur.set_range(prefix)
        while ok and cur.key()[:8] == prefix:
            ok = cur.delete()

    def _count(self, txn: lmdb.Transaction, blobs: int, nbytes: int) -> None:
        db = self.db[b"meta"]
        txn.put(b"count", _U64.pack(max(0, _get_u64(txn, db, b"count") + blobs)), db=db)
        txn.put(b"bytes", _U64.pack(max(0, _get_u64(txn, db, b"bytes") + nbytes)), db=db)


def _get_u64(txn: lmdb.Transaction, db: Any, key: bytes) -> int:
    raw = txn.get(key, db=db)
    return 0 if raw is None else int(_U64.unpack(raw)[0])
