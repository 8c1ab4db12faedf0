"""The compact body of a node's commit (common/wire/nodecommit.py): what the front door
encodes decodes to the request the JSON form stands for; anything out of shape is a 400
naming what is wrong, never a 500."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from squall.common.errors import BadRequest, PayloadTooLarge
from squall.common.wire import nodecommit
from squall.common.wire.cluster import NodeCommitRequest

UPDATE = {"group": "g", "pending": True, "replicas": ["http://a", "http://b"],
          "receipts": [], "enqueue": [
              {"queue": "q", "pid": "p1", "payload": {"blob_id": "f0-1", "size": 3,
                                                      "crc32c": 7},
               "idempotency_key": "k", "delay_secs": 1.5},
              {"queue": "q", "pid": None, "not_before": 100}]}
SETTLE = {"group": "g", "durable": True, "replicas": ["http://a"], "receipts": ["sqb1.x"],
          "items": [{"queue": "q", "pid": "p1",
                     "payload": {"blob_id": "f0-1", "size": 3, "crc32c": 7}}]}


def test_the_compact_body_decodes_to_the_json_forms_request() -> None:
    got = nodecommit.decode(nodecommit.encode("n1", [UPDATE], [SETTLE]))
    want = NodeCommitRequest.model_validate({"node_id": "n1", "updates": [UPDATE],
                                             "settles": [SETTLE]})
    assert got.model_dump() == want.model_dump()


def _body(**over: Any) -> bytes:
    doc: dict[str, Any] = {"node_id": "n1", "updates": [
        ["g", False, [], [], [["q", "p", "b-1", 1, 2, None, None, None]]]], "settles": []}
    doc.update(over)
    return msgpack.packb(doc)


@pytest.mark.parametrize(("body", "says"), [
    (b"\xc1", "not valid msgpack"),
    (msgpack.packb([1]), "expected a map"),
    (_body(node_id=""), "node_id"),
    (_body(updates=[["bad name!", False, [], [], [["q", "p", "b", 1, 2, 0, 0, 0]]]]),
     "group name"),
    (_body(updates=[["g", 1, [], [], [["q", "p", "b", 1, 2, None, None, None]]]]), "flag"),
    (_body(updates=[["g", False, [], [], []]]), "1-1000 items"),
    (_body(updates=[["g", False, [], [], [["q", "p", "b/x", 1, 2, None, None, None]]]]),
     "blob id"),
    (_body(updates=[["g", False, [], [], [["q", "p", "b", -1, 2, None, None, None]]]]),
     "size"),
    (_body(updates=[["g", False, [], [], [["q", "p", "b", 1, 1 << 32, None, None, None]]]]),
     "crc32c"),
    (_body(updates=[["g", False, [], [], [["q", "p", "b", 1, 2, True, None, None]]]]),
     "not_before"),
    (_body(updates=[["g", False, [], [], [["q", "p", "b", 1, 2, None, None, ""]]]]),
     "idempotency_key"),
    (_body(updates=[["g", False, ["x"] * 17, [], [["q", "p", "b", 1, 2, 0, 0, 0]]]]),
     "replicas"),
    (_body(settles=[["g", True, [], [], [["q", "p", "b", 1]]]]), r"a list \[queue"),
    (_body(updates=[["g", False, [], [], [["q", "p", "b", 1, 2]]]]), "8 fields"),
])
def test_bad_compact_bodies_are_400s(body: bytes, says: str) -> None:
    with pytest.raises(BadRequest, match=says):
        nodecommit.decode(body)


def test_a_huge_pid_is_413() -> None:
    with pytest.raises(PayloadTooLarge):
        nodecommit.decode(_body(updates=[["g", False, [], [], [
            ["q", "p" * 5000, None, None, None, None, None, None]]]]))
