"""Small blob reads on the event loop (``datanode/store/reads.py``, ``read_small_now``):
the bytes a read may copy are bounded before it starts, a read during a map resize goes to
a thread, and a read that touched the disk (a major page fault) sends reads to threads for
a while."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from squall.datanode.store import reads
from squall.datanode.store.blobstore import BlobStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[BlobStore]:
    s = BlobStore(str(tmp_path / "blobs"), chunk_bytes=64 << 10, txn_bytes=1 << 20,
                  map_size=64 << 20)
    try:
        yield s
    finally:
        s.close()


async def test_small_reads_on_the_loop_are_bounded(store: BlobStore) -> None:
    small = {f"s{i}": os.urandom(20 << 10) for i in range(6)}  # 120 KiB in all
    big = os.urandom(reads.LOOP_BLOB_BYTES + 1)
    await store.put_batch([(k, v, None) for k, v in small.items()] + [("big", big, None)])
    ids = list(small)
    got = store.read_small_now(ids, 16 << 20)
    assert got is not None
    # LOOP_BYTES (64 KiB) in all, passed by the last blob: 4 of 20 KiB, the rest later
    assert [s.blob_id for s in got] == ids[:4]
    assert all(s.error is None and s.data == small[s.blob_id] for s in got)
    # a blob over the loop's limit ends the read before it: a thread reads it
    got = store.read_small_now(["s0", "big", "s1"], 16 << 20)
    assert got is not None and [s.blob_id for s in got] == ["s0"]
    got = store.read_small_now(["big"], 16 << 20)
    assert got == []
    # missing blobs are answered (no bytes to copy)
    got = store.read_small_now(["nope", "s5"], 16 << 20)
    assert got is not None and got[0].meta is None and got[1].data == small["s5"]


async def test_a_read_that_touched_the_disk_sends_reads_to_threads(
        store: BlobStore, monkeypatch: pytest.MonkeyPatch) -> None:
    await store.put_batch([("a", b"x" * 100, None)])
    assert store.read_small_now(["a"], 1 << 20) is not None
    faults = iter(range(100, 200, 7))  # every call: more major faults than before
    monkeypatch.setattr(reads, "_major_faults", lambda: next(faults))
    got = store.read_small_now(["a"], 1 << 20)
    assert got is not None and got[0].data == b"x" * 100  # answered, but it was cold
    assert store.loop_reads.cold == 1
    assert store.read_small_now(["a"], 1 << 20) is None  # threads now, for a while
    store.loop_reads.off_until = 1.0  # (the while is over)
    monkeypatch.setattr(reads, "_major_faults", lambda: 0)
    assert store.read_small_now(["a"], 1 << 20) is not None


async def test_no_read_on_the_loop_while_the_map_is_resized(store: BlobStore) -> None:
    await store.put_batch([("a", b"y" * 10, None)])
    with store.env._alone():  # a resize holds every reader off
        assert store.read_small_now(["a"], 1 << 20) is None
    assert store.read_small_now(["a"], 1 << 20) is not None
