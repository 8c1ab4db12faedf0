"""The data node's LMDB blob store, in process: chunks, checksums, group commit, streamed and
interrupted uploads, corruption, map growth and its bound, and the scrubber."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import struct
from collections.abc import AsyncIterator

import lmdb
import pytest

from squall.common.checksum import crc32c
from squall.common.errors import (
    BadRequest,
    Conflict,
    DataCorrupt,
    InsufficientStorage,
    NotFound,
    Unavailable,
)
from squall.datanode.config import DataNodeSettings
from squall.datanode.service import DataNode
from squall.datanode.store.blobstore import BlobMeta, BlobStore
from squall.datanode.store.lmdbenv import _classify
from squall.datanode.store.scrubber import Scrubber

CB = 4096  # small chunks, so a few KiB exercise every multi-chunk path


@pytest.fixture
async def store(tmp_path) -> AsyncIterator[BlobStore]:  # type: ignore[no-untyped-def]
    # reads after the first chunk in groups of two: a few chunks cross group boundaries
    s = BlobStore(str(tmp_path / "blobs"), chunk_bytes=CB, txn_bytes=4 * CB,
                  map_size=1 << 20, map_size_max=64 << 20, read_bytes=2 * CB)
    try:
        yield s
    finally:
        s.close()


async def read_all(s: BlobStore, blob_id: str, start: int = 0, end: int | None = None) -> bytes:
    meta = s.stat(blob_id)
    assert meta is not None
    return b"".join([p async for p in s.stream(meta, start, end)])


def flip_chunk_byte(s: BlobStore, meta: BlobMeta, index: int, offset: int) -> None:
    """Damage one stored byte behind the store's back (as a bad disk would)."""
    key = struct.pack(">QI", meta.upload, index)
    with s.env.env.begin(write=True) as txn:
        raw = bytearray(txn.get(key, db=s.db[b"chunks"]))
        raw[4 + offset] ^= 0x40
        txn.put(key, bytes(raw), db=s.db[b"chunks"])


@pytest.mark.parametrize("size", [0, 1, CB - 1, CB, CB + 1, 5 * CB + 17, 40 * CB])
async def test_roundtrip_and_ranges(store: BlobStore, size: int) -> None:
    data = random.Random(size).randbytes(size)
    meta, created = await store.put(f"b{size}", data, crc32c(data))
    assert created and (meta.size, meta.crc32c, meta.nchunks) == (size, crc32c(data),
                                                                  -(-size // CB))
    assert await read_all(store, f"b{size}") == data
    for start, end in ((0, 1), (CB - 1, CB + 1), (size // 3, size - 1), (size - 1, size)):
        if 0 <= start < end <= size:
            assert await read_all(store, f"b{size}", start, end) == data[start:end]
    # idempotent: the same bytes again are a success that creates nothing
    assert (await store.put(f"b{size}", data))[1] is False
    if size:
        with pytest.raises(Conflict):
            await store.put(f"b{size}", data[:-1] + bytes([data[-1] ^ 1]))
    assert await read_all(store, f"b{size}") == data


def test_one_environment_per_path(store: BlobStore) -> None:
    with pytest.raises(RuntimeError, match="already open"):
        BlobStore(store.env.path)


async def test_concurrent_small_writes_are_group_committed(store: BlobStore) -> None:
    syncs = store.env.syncs
    await asyncio.gather(*(store.put(f"s{i}", os.urandom(100)) for i in range(300)))
    assert store.space().blob_count == 300
    assert store.env.syncs - syncs < 100  # many writes per sync (exact count is timing)
    assert set(store.journal.take()[0]) == {f"s{i}" for i in range(300)}


async def test_batch_is_all_or_nothing(store: BlobStore) -> None:
    big = os.urandom(2 * CB + 9)  # several chunks: the declared CRC is the whole blob's
    items = [(f"x{i}", os.urandom(50), None) if i != 2 else ("x2", big, crc32c(big))
             for i in range(5)]
    bad = [*items, ("x9", b"abc", crc32c(b"abd"))]
    with pytest.raises(BadRequest, match="x9"):
        await store.put_batch(bad)
    assert store.space().blob_count == 0
    await store.put(items[2][0], b"other content")
    with pytest.raises(Conflict):
        await store.put_batch(items)
    assert store.all_ids() == ["x2"]
    out = await store.put_batch([i for i in items if i[0] != "x2"])
    assert len(out) == 4 and store.space().blob_count == 5
    await store.delete(["x2"])
    await store.put_batch([items[2]])
    assert await read_all(store, "x2") == big


async def test_declared_crc_mismatch_stores_nothing(store: BlobStore) -> None:
    data = os.urandom(10 * CB)
    with pytest.raises(BadRequest, match="declared"):
        await store.put("b", data, crc32c(data) ^ 1)
    assert store.stat("b") is None
    assert _chunk_count(store) == 0


def _chunk_count(s: BlobStore) -> int:
    with s.env.read() as txn:
        return int(txn.stat(s.db[b"chunks"])["entries"])


async def test_interrupted_upload_leaves_nothing(store: BlobStore, tmp_path) -> None:  # type: ignore[no-untyped-def]
    up = store.upload("big")
    for _ in range(20):
        await up.write(os.urandom(CB))
    assert _chunk_count(store) > 0  # streamed in: committed in bounded transactions
    assert store.stat("big") is None  # ... but not a blob
    await up.abort()
    assert _chunk_count(store) == 0 and store.stat("big") is None


async def test_upload_cut_by_a_crash_is_cleaned_on_open(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = str(tmp_path / "blobs")
    s = BlobStore(path, chunk_bytes=CB, txn_bytes=2 * CB)
    await s.put("kept", b"k" * (3 * CB))
    up = s.upload("cut")
    for _ in range(10):
        await up.write(os.urandom(CB))
    s.close()  # no commit, no abort: as if the process died here
    s = BlobStore(path, chunk_bytes=CB, txn_bytes=2 * CB)
    try:
        assert s.stat("cut") is None and s.all_ids() == ["kept"]
        assert _chunk_count(s) == 3
        assert await read_all(s, "kept") == b"k" * (3 * CB)
    finally:
        s.close()


@pytest.mark.parametrize("via_head", [False, True])
@pytest.mark.parametrize("index", [0, 3, 5])
async def test_corrupt_chunk_fails_loudly_and_is_dropped(store: BlobStore, index: int,
                                                         via_head: bool) -> None:
    """`via_head`: the first chunk read with the metadata in one hop (a whole GET)."""
    data = os.urandom(5 * CB + 100)
    meta, _ = await store.put("c", data)
    store.journal.take()
    flip_chunk_byte(store, meta, index, 7 if index < 5 else 50)
    head = None
    if via_head:
        found, head = await store.stat_and_head("c")
        assert found == meta and head is not None
    got = bytearray()
    with pytest.raises(DataCorrupt, match="chunk"):
        async for part in store.stream(meta, head=head):
            got += part
    assert got == data[:index * CB]  # every byte handed out was right, none after the damage
    assert store.stat("c") is None  # dropped ...
    _, deleted, corrupt = store.journal.take()
    assert corrupt == ["c"] and deleted == ["c"]  # ... and reported
    assert store.space().blob_count == 0 and _chunk_count(store) == 0


@pytest.mark.parametrize("size", [0, 1, CB - 1, CB, 3 * CB + 7])
async def test_metadata_and_first_chunk_in_one_hop_read_the_same_bytes(store: BlobStore,
                                                                       size: int) -> None:
    data = os.urandom(size)
    meta, _ = await store.put("h", data)
    found, head = await store.stat_and_head("h")
    assert found == meta and (head is None) == (size == 0)
    assert b"".join([p async for p in store.stream(meta, head=head)]) == data
    if size > CB:  # the head is a whole read's: a ranged read does not use it
        assert b"".join([p async for p in store.stream(meta, CB + 1, head=head)]
                        ) == data[CB + 1:]
    assert await store.stat_and_head("absent") == (None, None)


@pytest.mark.parametrize("size", [3 * CB, 3 * CB + 5])  # full chunks; a short last one
async def test_blob_checksum_checked_before_the_last_chunk(store: BlobStore, size: int
                                                           ) -> None:
    """Every chunk matches its own CRC32C, the blob's does not: a whole read (streamed, or
    batched) fails before the last chunk leaves; the blob's CRC is combined from the
    chunks' CRCs, so this also checks the combining."""
    data = os.urandom(size)
    meta, _ = await store.put("w", data)
    assert b"".join([p async for p in store.stream(meta)]) == data
    assert store.read_small(["w"], size)[0].data == data
    lying = BlobMeta("w", meta.upload, meta.size, meta.crc32c ^ 1, meta.nchunks,
                     meta.chunk_bytes, meta.committed_ms)
    with store.env.env.begin(write=True) as txn:
        txn.put(b"w", lying.pack(), db=store.db[b"blobs"])
    got = bytearray()
    with pytest.raises(DataCorrupt, match="fails its CRC32C"):
        async for part in store.stream(lying):
            got += part
    assert len(got) == 3 * CB if size % CB else 2 * CB
    await store.put("w2", data)
    with store.env.env.begin(write=True) as txn:
        txn.put(b"w2", BlobMeta("w2", *[getattr(store.stat("w2"), f) for f in (
            "upload", "size")], meta.crc32c ^ 1, meta.nchunks, meta.chunk_bytes,
            meta.committed_ms).pack(), db=store.db[b"blobs"])
    small = store.read_small(["w2"], size)[0]
    assert isinstance(small.error, DataCorrupt) and small.data == b""


async def test_corrupt_metadata_record(store: BlobStore) -> None:
    await store.put("m", b"payload")
    with store.env.env.begin(write=True) as txn:
        raw = bytearray(txn.get(b"m", db=store.db[b"blobs"]))
        raw[2] ^= 1
        txn.put(b"m", bytes(raw), db=store.db[b"blobs"])
    with pytest.raises(DataCorrupt, match="metadata"):
        store.stat("m")
    assert store.stat("m") is None and store.journal.take()[2] == ["m"]


async def test_deleted_while_reading_is_not_found(store: BlobStore) -> None:
    meta, _ = await store.put("d", os.urandom(4 * CB))
    stream = store.stream(meta)
    await anext(stream)
    assert await store.delete(["d", "never"]) == ["d"]
    with pytest.raises(NotFound):
        async for _ in stream:
            pass


async def test_map_grows_then_stops_at_its_bound(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = BlobStore(str(tmp_path / "blobs"), chunk_bytes=CB, txn_bytes=16 * CB,
                  map_size=256 << 10, map_size_max=2 << 20)
    try:
        await s.put("a", os.urandom(600 << 10))
        assert s.env.map_size > 256 << 10  # grew on MapFullError
        with pytest.raises(InsufficientStorage, match="bound"):
            await s.put("huge", os.urandom(3 << 20))
        assert s.stat("huge") is None
        assert s.space().free_bytes < 3 << 20
        # the store still works and holds what it acknowledged
        await s.put("small", b"still fine")
        assert await read_all(s, "small") == b"still fine"
        assert len(await read_all(s, "a")) == 600 << 10
        with pytest.raises(InsufficientStorage):
            s.check_space(10 << 20)
    finally:
        s.close()


def test_storage_errors_are_classified(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = BlobStore(str(tmp_path / "blobs"))
    try:
        assert isinstance(_classify(lmdb.ReadonlyError("ro"), s.env), Unavailable)
        assert isinstance(_classify(OSError(errno.EROFS, "Read-only file system"), s.env),
                          Unavailable)
        assert isinstance(_classify(OSError(errno.ENOSPC, "No space left"), s.env),
                          InsufficientStorage)
        assert isinstance(_classify(lmdb.MapFullError("full"), s.env), InsufficientStorage)
        other = _classify(lmdb.Error("mdb_txn_commit: Input/output error"), s.env)
        assert isinstance(other, Unavailable)  # EIO with plenty of free disk: not "full"
    finally:
        s.close()


async def test_scrubber_drops_and_reports_corrupt_replicas(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = DataNode(DataNodeSettings(data_dir=str(tmp_path), advertise_url="http://n1",
                                     chunk_bytes=CB, txn_bytes=4 * CB,
                                     cluster_key=b"scrubber-test-cluster-key-0123456789"))
    try:
        metas = [(await node.store.put(f"b{i}", os.urandom(3 * CB)))[0] for i in range(20)]
        node.store.journal.take()
        flip_chunk_byte(node.store, metas[7], 1, 0)
        flip_chunk_byte(node.store, metas[13], 2, 9)
        sc = Scrubber(node)
        sc.rate = 0  # unpaced in tests
        assert await sc.scrub_pass() == 2
        assert sc.blobs_checked == 18
        assert sorted(node.store.journal.take()[2]) == ["b13", "b7"]
        assert await sc.scrub_pass() == 0
        assert node.store.space().blob_count == 18
    finally:
        node.close()
