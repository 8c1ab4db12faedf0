"""A data node runs no delete command from a master-set epoch below the highest one a
heartbeat answer carried (a deposed leader's view of unreferenced blobs may be stale);
other commands pass, and a single master (epoch 0) is never fenced."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from squall.datanode.heartbeat import Heartbeat

DELETE = {"op": "delete", "blob_ids": ["b1"]}
COPY = {"op": "replicate", "blob_id": "b2", "target": "http://127.0.0.1:9"}


def hb() -> Heartbeat:
    node: Any = SimpleNamespace(settings=SimpleNamespace(heartbeat_interval_s=1.0,
                                                         copies_max=1))
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
