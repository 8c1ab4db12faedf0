"""The LMDB record formats of the blob store (documented at the top of ``blobstore.py``)."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import msgpack

from squall.common.checksum import crc32c, crc32c_combine
from squall.common.errors import DataCorrupt

U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
_CHUNK = struct.Struct(">QI")
HEADER = 4  # a chunk record is u32 crc32c(data) | data


@dataclass(frozen=True, slots=True)
class BlobMeta:
    blob_id: str
    upload: int
    size: int
    crc32c: int
    nchunks: int
    chunk_bytes: int
    committed_ms: int

    def pack(self) -> bytes:
        body = msgpack.packb([self.upload, self.size, self.crc32c, self.nchunks,
                              self.chunk_bytes, self.committed_ms])
        return body + U32.pack(crc32c(body))

    @classmethod
    def unpack(cls, blob_id: str, raw: bytes | memoryview) -> BlobMeta:
        raw = bytes(raw)
        body, check = raw[:-4], raw[-4:]
        if len(raw) < 5 or U32.pack(crc32c(body)) != check:
            raise DataCorrupt(f"blob {blob_id}: its metadata record fails its checksum")
        return cls(blob_id, *msgpack.unpackb(body))

    def chunk_len(self, index: int) -> int:
        return self.chunk_bytes if index < self.nchunks - 1 else (
            self.size - self.chunk_bytes * (self.nchunks - 1))


def chunk_key(upload: int, index: int) -> bytes:
    return _CHUNK.pack(upload, index)


def running_crc(crc: int, own: int, data: bytes | bytearray | memoryview, index: int,
                chunk_bytes: int) -> int:
    """A blob's CRC32C over its chunks up to chunk `index` (`data`, whose own CRC32C is
    `own`), from the CRC32C over the chunks before it (`crc`). A full chunk's is combined
    (no second pass over its bytes); only the short last chunk is passed over again (the
    combining operator is cached for the chunk size, not for every length)."""
    if index == 0:
        return own
    if len(data) == chunk_bytes:
        return crc32c_combine(crc, own, chunk_bytes)
    return crc32c(data, crc)
