"""One streamed blob write into the store (see ``blobstore.py`` for the life of an upload).

The body arrives in parts of any size; each byte is copied once, into the chunk record it
belongs to (``u32 crc32c | data``, a preallocated ``bytearray``), which is handed as it is
to LMDB. A sealed chunk's data is also what the replication pipeline forwards, so peers get
the body in chunk-size pieces whatever the client's framing. Every ``txn_bytes`` of sealed
chunks go to the writer as a non-durable flush while the body keeps streaming in (one flush
in flight at a time: memory stays bounded by about two transactions' worth of chunks).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import struct
from typing import TYPE_CHECKING, Any

from squall.common.checksum import crc32c
from squall.common.errors import BadRequest
from squall.datanode.store.layout import running_crc

if TYPE_CHECKING:
    from concurrent.futures import Future

    from squall.datanode.store.blobstore import BlobMeta, BlobStore

HEADER = 4  # the chunk record's crc32c
BACKGROUND_TXN_BYTES = 1 << 20  # a repair copy's chunks per transaction
_U32 = struct.Struct(">I")


def seal(record: bytearray) -> int:
    """Write the CRC32C of a chunk record's data into its header; return it."""
    crc = crc32c(memoryview(record)[HEADER:])
    _U32.pack_into(record, 0, crc)
    return crc


def records_of(data: bytes, chunk_bytes: int) -> list[bytes | bytearray]:
    """The chunk records of a payload held in memory (batch puts)."""
    if len(data) <= chunk_bytes:
        return [_U32.pack(crc32c(data)) + data] if data else []
    view = memoryview(data)
    out: list[bytes | bytearray] = []
    for i in range(0, len(data), chunk_bytes):
        part = view[i:i + chunk_bytes]
        rec = bytearray(HEADER + len(part))
        rec[HEADER:] = part
        seal(rec)
        out.append(rec)
    return out


class Upload:
    """One streamed write: ``await up.write(part)`` any number of times (it returns the data
    of the chunks that part completed), ``up.finish()`` (the last, short chunk), then
    ``await up.commit()`` (durable when it returns) or ``await up.abort()``."""

    def __init__(self, store: BlobStore, blob_id: str, declared_crc: int | None,
                 background: bool = False) -> None:
        self.store, self.blob_id, self.declared_crc = store, blob_id, declared_crc
        self.background = background  # a repair copy: written behind client writes, ...
        # ... in small transactions (a client's write may wait for one that started)
        self.txn_bytes = min(store.txn_bytes, BACKGROUND_TXN_BYTES) if background \
            else store.txn_bytes
        self.size = 0  # bytes received
        self.crc = 0  # CRC32C of the sealed chunks, combined from theirs (layout.running_crc)
        self._sealed = 0  # chunks sealed
        self.upload = store.new_upload_id()
        self._rec: bytearray | None = None  # the chunk record being filled
        self._fill = 0
        self._records: list[bytearray] = []  # sealed, not yet handed to the writer
        self._rec_bytes = 0
        self._next_index = 0
        self._flushed = False  # a flush was submitted: a `pending` record may exist
        self._inflight: asyncio.Future[None] | None = None
        self._finished = self._done = False
        store.uploads_open += 1

    def feed(self, data: bytes | bytearray | memoryview) -> list[memoryview]:
        """Copy `data` into chunk records; the data of each chunk it completed."""
        if not data:
            return []
        self.size += len(data)
        cb = self.store.chunk_bytes
        view, pos, n = memoryview(data), 0, len(data)
        done: list[memoryview] = []
        while pos < n:
            if self._rec is None:
                self._rec, self._fill = bytearray(HEADER + cb), 0
            k = min(cb - self._fill, n - pos)
            at = HEADER + self._fill
            self._rec[at:at + k] = view[pos:pos + k]
            self._fill += k
            pos += k
            if self._fill == cb:
                done.append(self._seal())
        return done

    def _seal(self) -> memoryview:
        rec, self._rec = self._rec, None
        assert rec is not None
        if len(rec) > HEADER + self._fill:
            del rec[HEADER + self._fill:]
        data = memoryview(rec)[HEADER:]
        self.crc = running_crc(self.crc, seal(rec), data, self._sealed, self.store.chunk_bytes)
        self._sealed += 1
        self._records.append(rec)
        self._rec_bytes += len(rec)
        return data

    def finish(self) -> memoryview | None:
        """The body is complete: seal the last, short chunk and return its data."""
        if self._finished:
            return None
        self._finished = True
        return self._seal() if self._rec is not None and self._fill else None

    async def write(self, data: bytes | bytearray | memoryview) -> list[memoryview]:
        done = self.feed(data)
        if self._rec_bytes >= self.txn_bytes:
            await self._flush()
        return done

    async def _flush(self) -> None:
        if self._inflight is not None:
            fut, self._inflight = self._inflight, None
            await fut  # at most one flush in flight; its failure fails the upload
        records, self._records, nbytes, self._rec_bytes = self._records, [], self._rec_bytes, 0
        start, self._next_index = self._next_index, self._next_index + len(records)
        first, self._flushed = not self._flushed, True
        op = functools.partial(self.store._op_flush, self.upload, self.blob_id, start,
                               records, first)
        self._inflight = asyncio.wrap_future(self.store.env.submit(op, False, nbytes,
                                                                   self.background))

    async def commit(self) -> tuple[BlobMeta, bool]:
        self.finish()
        if self.declared_crc is not None and self.declared_crc != self.crc:
            await self.abort()
            raise BadRequest(f"blob {self.blob_id}: CRC32C of the {self.size} bytes received "
                             f"is {self.crc}, the declared one {self.declared_crc}; "
                             "nothing was stored")
        records, self._records, nbytes = self._records, [], self._rec_bytes
        op = functools.partial(self.store._op_commit, self.blob_id, self.upload,
                               self._flushed, self._next_index, records, self.size,
                               self.crc)
        try:
            if self._inflight is not None:
                fut, self._inflight = self._inflight, None
                await fut
            out = await self.store._submit(op, True, nbytes, self.background)
        except BaseException:
            await self.abort()
            raise
        self._done = True
        self.store.uploads_open -= 1
        self.store._note_written([out])
        return out

    async def abort(self) -> None:
        if self._done:
            return
        self._done = True
        self.store.uploads_open -= 1
        self._rec, self._records = None, []
        inflight, self._inflight = self._inflight, None
        if inflight is not None:  # its outcome no longer matters; retrieve it
            inflight.add_done_callback(lambda f: f.cancelled() or f.exception())
        if not self._flushed:
            return
        upload, leaked = self.upload, self.store._leaked
        try:  # queued after any flush in flight (the writer runs ops in order)
            fut = self.store.env.submit(functools.partial(self.store._op_abort, upload), False)
        except Exception:
            leaked.add(upload)
            return
        def _leak_on_failure(f: Future[Any]) -> None:
            if f.exception() is not None:
                leaked.add(upload)

        fut.add_done_callback(_leak_on_failure)
        with contextlib.suppress(Exception):
            await asyncio.wrap_future(fut)
