"""Crash simulation for in-process masters (used by test_model.py and test_wal.py).

* :func:`kill9` stops a master the way ``kill -9`` would: no LMDB sync, no close. LMDB
  commits are plain ``write``\\ s into the page cache, so they survive the process.
* A *power loss* also loses whatever LMDB wrote since its last ``sync``: the index rolls
  back to a copy taken right after that sync (:func:`snapshot_index` /
  :func:`restore_index`). Acknowledged WAL records were fsynced and stay.
"""

from __future__ import annotations

import os
import shutil

from squall.master.service import Master


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
