"""A data node runs no delete command from a master-set epoch below the highest one a
heartbeat answer carried (a deposed leader's view of unreferenced blobs may be stale);
other commands pass, and a single master (epoch 0) is never fenced. The highest epoch is
kept in the node's data dir: a real node killed with SIGKILL and restarted still refuses a
lower epoch's deletes."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from squall.datanode.heartbeat import EPOCH_FILE, Heartbeat
from tests import blobhttp
from tests.dn_kit import ENV, FakeMaster, node_id_of, tok
from tests.helpers import DataNodeProcess, running_app, wait_for

DELETE = {"op": "delete", "blob_ids": ["b1"]}
COPY = {"op": "replicate", "blob_id": "b2", "target": "http://127.0.0.1:9"}


@pytest.fixture(autouse=True)
def _data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)


def hb(data_dir: str = ".") -> Heartbeat:
    node: Any = SimpleNamespace(settings=SimpleNamespace(heartbeat_interval_s=1.0,
                                                         copies_max=1, data_dir=data_dir))
    return Heartbeat(node)


def test_single_master_answers_are_never_fenced() -> None:
    h = hb()
    assert h.admit({"commands": [DELETE, COPY]}) == [DELETE, COPY]
    assert h.admit({"commands": [DELETE], "epoch": 0}) == [DELETE]
    assert h.fenced_deletes == 0


def test_deletes_from_a_lower_epoch_are_dropped() -> None:
    h = hb()
    assert h.admit({"commands": [DELETE], "epoch": 3}) == [DELETE]
    assert h.epoch == 3
    assert h.admit({"commands": [DELETE, COPY], "epoch": 2}) == [COPY]
    assert h.fenced_deletes == 1 and h.epoch == 3
    assert h.admit({"commands": [DELETE], "epoch": 4}) == [DELETE]
    assert h.admit({"commands": [DELETE], "epoch": 3}) == []


def test_malformed_answers_run_nothing_odd() -> None:
    h = hb()
    h.admit({"epoch": 5})
    assert h.admit({"commands": "x", "epoch": 5}) == []
    assert h.admit({"commands": [DELETE], "epoch": True}) == []  # not an epoch: 0 < 5
    assert h.admit({"commands": [DELETE], "epoch": "9"}) == []


def test_the_highest_epoch_is_kept_across_a_restart() -> None:
    h = hb()
    h.admit({"commands": [], "epoch": 7})
    asyncio.run(h.keep_epoch())
    assert stat.S_IMODE(os.stat(EPOCH_FILE).st_mode) == 0o600
    h.admit({"commands": [], "epoch": 5})  # lower: nothing rewritten
    asyncio.run(h.keep_epoch())
    again = hb()  # the node restarted
    assert again.epoch == 7
    assert again.admit({"commands": [DELETE, COPY], "epoch": 6}) == [COPY]


def test_an_unreadable_epoch_file_fails_the_start() -> None:
    with open(EPOCH_FILE, "w") as f:
        f.write("not a number")
    with pytest.raises(ValueError, match="master epoch"):
        hb()


@pytest.fixture()
def fake() -> Iterator[tuple[FakeMaster, str]]:
    fm = FakeMaster()
    with running_app(fm.app) as url:
        yield fm, url


def test_a_restarted_node_still_refuses_a_deposed_leaders_deletes(
        tmp_path: Path, fake: tuple[FakeMaster, str]) -> None:
    """A real node sees epoch 5, is killed (SIGKILL) and restarted; the leader of epoch 4
    (deposed) then asks it to delete a blob: refused. The leader of epoch 5 may."""
    fm, url = fake
    fm.epoch = 5
    node = DataNodeProcess(str(tmp_path / "n"), env=ENV,
                           extra=["--master", url, "--heartbeat-interval-s", "0.2"])
    node.start()
    try:
        nid = node_id_of(node.url)
        with httpx.Client(timeout=30) as c:
            for blob in ("ef-1", "ef-2"):
                blobhttp.put_blob(c, node.url, blob, b"x" * 100, tok("write", blob))
        wait_for(lambda: fm.holds(nid, "ef-1") and fm.holds(nid, "ef-2"), 30,
                 what="both blobs reported")
        wait_for(lambda: os.path.exists(os.path.join(node.data_dir, EPOCH_FILE)), 30,
                 what="epoch 5 kept")
        node.kill9()
        fm.epoch = 4  # a deposed leader answers the restarted node's beats
        node.start()
        fm.send(nid, {"op": "delete", "blob_ids": ["ef-1"]})
        after = len(fm.beats_of(nid))
        wait_for(lambda: nid not in fm.commands and len(fm.beats_of(nid)) > after + 2, 30,
                 what="the delete handed out and beats after it")
        assert fm.holds(nid, "ef-1")
        with httpx.Client(timeout=30) as c:
            assert blobhttp.get_blob(c, node.url, "ef-1", tok("read", "ef-1")) == b"x" * 100
        # the current leader's delete runs
        fm.epoch = 5
        fm.send(nid, {"op": "delete", "blob_ids": ["ef-2"]})
        wait_for(lambda: not fm.holds(nid, "ef-2"), 30, what="the epoch-5 delete ran")
        assert fm.holds(nid, "ef-1")
    finally:
        node.stop()
