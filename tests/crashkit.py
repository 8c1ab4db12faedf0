"""Crash simulation for in-process masters (used by test_model.py, test_wal.py and others).

* :func:`kill9` stops a master the way ``kill -9`` would: no LMDB sync, no close. LMDB
  commits are plain ``write``\\ s into the page cache, so they survive the process.
* A *power loss* also loses whatever LMDB wrote since its last ``sync``: the index rolls
  back to a copy taken right after that sync (:func:`snapshot_index` /
  :func:`restore_index`). Acknowledged WAL records were fsynced and stay.
* :class:`InProcessMaster` holds such a master with its directory, event loop and clock,
  for the test harnesses and model machines that crash and restart it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from typing import Any

from squall.common.clock import ManualClock
from squall.master.service import Master, MasterSettings


def kill9(m: Master) -> None:
    m.wal.flush()  # every answered request is durable already; this only joins the writer
    m.wal.close()
    m.commit.close()  # an open batch nobody waits for is dropped: it was never committed
    m.index.env.close()


def index_dir(data_dir: str) -> str:
    return os.path.join(data_dir, "index")


def snapshot_index(data_dir: str, dest: str) -> None:
    """Copy the index file as the disk holds it right after ``env.sync()``."""
    shutil.copyfile(os.path.join(index_dir(data_dir), "data.mdb"), dest)


def restore_index(data_dir: str, snapshot: str | None) -> None:
    """Roll the (closed) index back to `snapshot`, or to nothing at all."""
    d = index_dir(data_dir)
    shutil.rmtree(d)
    os.makedirs(d)
    if snapshot is not None:
        shutil.copyfile(snapshot, os.path.join(d, "data.mdb"))


def dump_index(m: Master) -> dict[str, list[tuple[bytes, bytes]]]:
    """Every key and value of every named LMDB database the master's index holds."""
    dbs = {name: db for name, db in vars(m.index).items()
           if type(db).__name__ == "_Database"}
    assert dbs, "found no LMDB databases on the index"
    out: dict[str, list[tuple[bytes, bytes]]] = {}
    with m.index.env.begin() as txn:
        for name, db in sorted(dbs.items()):
            out[name] = [(bytes(k), bytes(v)) for k, v in txn.cursor(db=db)]
    return out


class InProcessMaster:
    """A real `Master` in this process on a `ManualClock` and an event loop of its own, in a
    temporary directory, without fsyncs (a crash here keeps the page cache; a power loss is
    simulated with a snapshot). `settings`: more `MasterSettings` fields. Its `__init__`
    calls the next class's (a Hypothesis state machine builds on it)."""

    def __init__(self, prefix: str, **settings: Any) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix=prefix)
        self.settings = MasterSettings(data_dir=os.path.join(self.tmp, "data"), fsync=False,
                                       index_sync=False, **settings)
        self.snapshot: str | None = None  # data.mdb as of the last checkpoint
        self.clock = ManualClock()
        self.loop = asyncio.new_event_loop()
        self.m = Master(self.settings, self.clock)

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def checkpoint_and_snapshot(self) -> None:
        """Checkpoint, then copy the index as the disk holds it for sure after a power loss."""
        self.m.checkpoint()
        self.snapshot = os.path.join(self.tmp, "snapshot.mdb")
        snapshot_index(self.settings.data_dir, self.snapshot)

    def restart(self, power_loss: bool = False) -> None:
        """kill -9 the master and start it again on its directory; `power_loss`: the index
        rolls back to the last snapshot first (to nothing without one)."""
        kill9(self.m)
        self.run(asyncio.sleep(0))  # let the dropped batch's flush end
        if power_loss:
            restore_index(self.settings.data_dir, self.snapshot)
        self.m = Master(self.settings, self.clock)

    def close(self) -> None:
        try:
            if not self.m.wal._closed:  # else a crash step failed half-way: just clean up
                self.m.close()
            self.run(asyncio.sleep(0))  # let dropped batches' flushes end
        finally:
            self.loop.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
