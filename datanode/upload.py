"""One streamed blob write into the store (see ``store.py`` for the life of an upload)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from squall.common.checksum import Crc32c
from squall.common.errors import BadRequest

if TYPE_CHECKING:
    from squall.datanode.store import BlobMeta, BlobStore


class Upload:
    """One streamed write: ``await up.write(part)`` any number of times, then
    ``await up.commit()`` (durable when it returns) or ``await up.abort()``."""

    def __init__(self, store: BlobStore, blob_id: str, declared_crc: int | None) -> None:
        self.store, self.blob_id, self.declared_crc = store, blob_id, declared_crc
        self.crc = Crc32c()
        self._buf = bytearray()
        self._chunks: list[bytes] = []
        self._next_index = 0
        self._upload = 0
        self._done = False
        store.uploads_open += 1

    @property
    def size(self) -> int:
        return self.crc.size

    async def write(self, data: bytes) -> None:
        cb = self.store.chunk_bytes
        self.crc.update(data)
        self._buf += data
        if len(self._buf) >= cb:
            n = len(self._buf) // cb * cb
            view = bytes(self._buf[:n])
            del self._buf[:n]
            self._chunks.extend(view[i:i + cb] for i in range(0, n, cb))
        if len(self._chunks) * cb >= self.store.txn_bytes:
            chunks, self._chunks = self._chunks, []
            start, self._next_index = self._next_index, self._next_index + len(chunks)
            self._upload = await self.store._submit(
                functools.partial(self.store._op_flush, self._upload, self.blob_id, start,
                                  chunks), False, len(chunks) * cb)

    async def commit(self) -> tuple[BlobMeta, bool]:
        if self._buf:
            self._chunks.append(bytes(self._buf))
            self._buf.clear()
        if self.declared_crc is not None and self.declared_crc != self.crc.value:
            await self.abort()
            raise BadRequest(f"blob {self.blob_id}: CRC32C of the {self.size} bytes received "
                             f"is {self.crc.value}, the declared one {self.declared_crc}; "
                             "nothing was stored")
        chunks, self._chunks = self._chunks, []
        op = functools.partial(self.store._op_commit, self.blob_id, self._upload,
                               self._next_index, chunks, self.size, self.crc.value)
        try:
            out = await self.store._submit(op, True, sum(len(c) for c in chunks))
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
        self._chunks, self._buf = [], bytearray()
        if self._upload:
            try:
                await self.store._submit(functools.partial(self.store._op_abort, self._upload),
                                         False)
            except Exception:
                self.store._leaked.add(self._upload)
