"""The data node's page-cache prefill (datanode/store/prefill.py): it reads the preallocated tail
of LMDB's file ahead of the writer, within its window, never past the file, stops on close,
and LMDB's writes into the pages it read keep every blob intact."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from squall.datanode.store.blobstore import BlobStore
from squall.datanode.store.prefill import STEP, Prefill
from tests.helpers import wait_for


def test_reads_the_window_past_the_data_and_no_further(tmp_path: Path) -> None:
    f = tmp_path / "data.mdb"
    f.write_bytes(b"")
    os.truncate(f, 40 * STEP)
    p = Prefill(str(f), window=8 * STEP)
    try:
        p.ahead_of(end=3 * STEP, file_size=40 * STEP)
        assert p._want == 11 * STEP  # the thread reads up to this, no further
        wait_for(lambda: p.bytes == 8 * STEP)
        p.ahead_of(end=5 * STEP, file_size=40 * STEP)  # the data grew by two steps ...
        wait_for(lambda: p.bytes == 10 * STEP)  # ... so two more are read, not the window
        p.ahead_of(end=4 * STEP, file_size=40 * STEP)  # nothing new asked: nothing read
        assert p._want == 13 * STEP
        p.ahead_of(end=36 * STEP, file_size=40 * STEP)  # far ahead: from there, to the end
        assert p._want == 40 * STEP
        wait_for(lambda: p.bytes == 14 * STEP)
    finally:
        p.close()
    assert not any(t.name == "lmdb-prefill" and t.is_alive() for t in threading.enumerate())


def test_a_file_shorter_than_announced_ends_the_read_cleanly(tmp_path: Path) -> None:
    f = tmp_path / "data.mdb"
    f.write_bytes(b"\0" * (STEP + 100))
    p = Prefill(str(f), window=8 * STEP)
    try:
        p.ahead_of(end=0, file_size=8 * STEP)  # the file is shorter than that
        wait_for(lambda: p.bytes == STEP + 100)
        f.write_bytes(b"\0" * (3 * STEP))
        p.ahead_of(end=STEP, file_size=3 * STEP)  # grows later: read on from where it ended
        wait_for(lambda: p.bytes == 3 * STEP)
    finally:
        p.close()


async def test_lmdb_writes_into_prefilled_pages_keep_every_blob(tmp_path: Path) -> None:
    """A store whose file grows well past the window: every blob reads back intact, and
    the prefill thread read ahead of the writer."""
    s = BlobStore(str(tmp_path / "blobs"), chunk_bytes=64 << 10, txn_bytes=256 << 10,
                  map_size=1 << 20, map_size_max=256 << 20)
    try:
        assert s.env.tail.prefill is not None
        blobs = {f"b{i}": os.urandom(300_000 + i) for i in range(60)}  # ~18 MiB
        for k, v in blobs.items():
            await s.put(k, v)
        assert s.env.tail.prefill.bytes > 0
        for k, v in blobs.items():
            meta = s.stat(k)
            assert meta is not None
            assert b"".join([p async for p in s.stream(meta)]) == v
    finally:
        s.close()
    assert not any(t.name == "lmdb-prefill" and t.is_alive() for t in threading.enumerate())
