"""The compact binary body of a data node's commit to the master
(``POST /v1/nodes/commit.msgpack``; the JSON form, :class:`NodeCommitRequest`, stays for
other callers).

A msgpack map ``{"node_id": str, "updates": [update...], "settles": [settle...]}``::

    update = [group, pending, replicas, receipts,
              [[queue, pid|nil, blob_id|nil, size|nil, crc32c|nil,
                not_before|nil, delay_secs|nil, idempotency_key|nil], ...]]
    settle = [group, durable, replicas, receipts,
              [[queue, pid, blob_id, size, crc32c], ...]]

Enqueues with a flow key or extras (unique, debounce, trace context) are sent in the JSON
form. Positional items carry no field names, and decoding checks each field with the same
rules as the JSON form's models (names, pids, blob ids, bounds) without building a
validated model per item: a commit of 100 enqueues decoded in a fraction of the JSON
form's time. Anything out of shape is a :class:`BadRequest` naming the item.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgpack

from squall.common.errors import BadRequest, StatusError
from squall.common.wire.cluster import NodeCommitRequest, NodeSettle, NodeUpdate, SettleItem
from squall.common.wire.models import (
    MAX_BATCH,
    MAX_DELAY_SECS,
    EnqueueItem,
    PayloadRef,
)
from squall.common.wire.names import check_name, check_pid

CONTENT_TYPE = "application/msgpack"
_BLOB_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")
_LISTS_MAX = 16  # replicas and receipts per update (as the JSON form)


def encode(node_id: str, updates: list[dict[str, Any]], settles: list[dict[str, Any]]
           ) -> bytes:
    """The compact body of a commit whose updates and settles are in the JSON form's
    shape (dicts, as the front door builds them)."""
    def item(e: dict[str, Any]) -> list[Any]:
        p = e.get("payload")
        return [e["queue"], e.get("pid"), p and p["blob_id"], p and p["size"],
                p and p["crc32c"], e.get("not_before"), e.get("delay_secs"),
                e.get("idempotency_key")]

    body: bytes = msgpack.packb({
        "node_id": node_id,
        "updates": [[u["group"], bool(u.get("pending")), u.get("replicas", []),
                     u.get("receipts", []), [item(e) for e in u["enqueue"]]]
                    for u in updates],
        "settles": [[s["group"], bool(s["durable"]), s.get("replicas", []),
                     s.get("receipts", []),
                     [[i["queue"], i["pid"], i["payload"]["blob_id"], i["payload"]["size"],
                       i["payload"]["crc32c"]] for i in s["items"]]]
                    for s in settles]})
    return body


def decode(body: bytes) -> NodeCommitRequest:
    """A compact body as the request it stands for (checked, see the module docstring)."""
    try:
        doc = msgpack.unpackb(body, raw=False, strict_map_key=True, max_str_len=1 << 16,
                              max_bin_len=0, max_array_len=MAX_BATCH, max_map_len=8)
    except Exception as e:  # msgpack raises several unrelated types on bad input
        raise BadRequest(f"body is not valid msgpack: {type(e).__name__}") from None
    if not isinstance(doc, dict) or set(doc) - {"node_id", "updates", "settles"}:
        raise BadRequest('expected a map {"node_id", "updates", "settles"}')
    node_id = doc.get("node_id")
    if not isinstance(node_id, str) or not 1 <= len(node_id) <= 128:
        raise BadRequest("node_id must be a string of 1-128 characters")
    try:
        updates = [_update(i, u) for i, u in enumerate(_list(doc.get("updates", [])))]
        settles = [_settle(i, s) for i, s in enumerate(_list(doc.get("settles", [])))]
    except StatusError:
        raise
    except (TypeError, ValueError, IndexError, KeyError) as e:
        raise BadRequest(f"body does not have the compact commit's shape: {e}") from None
    return NodeCommitRequest.model_construct(node_id=node_id, updates=updates,
                                             settles=settles)


def _list(v: Any) -> list[Any]:
    if not isinstance(v, list):
        raise BadRequest("updates and settles must be lists")
    return v


def _head(where: str, x: Any) -> tuple[str, bool, list[str], list[str], list[Any]]:
    if not isinstance(x, list) or len(x) != 5:
        raise BadRequest(f"{where}: a list [group, flag, replicas, receipts, items]")
    group, flag, replicas, receipts, items = x
    check_name("group", group)
    if not isinstance(flag, bool):
        raise BadRequest(f"{where}: its flag must be true or false")
    for name, v, most in (("replicas", replicas, 512), ("receipts", receipts, 4096)):
        if (not isinstance(v, list) or len(v) > _LISTS_MAX
                or not all(isinstance(s, str) and len(s) <= most for s in v)):
            raise BadRequest(f"{where}: {name} must be at most {_LISTS_MAX} strings")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_BATCH:
        raise BadRequest(f"{where}: 1-{MAX_BATCH} items")
    return group, flag, replicas, receipts, items


def _ref(where: str, blob_id: Any, size: Any, crc: Any) -> PayloadRef:
    if not isinstance(blob_id, str) or not _BLOB_RE.fullmatch(blob_id):
        raise BadRequest(f"{where}: invalid blob id {blob_id!r}")
    if type(size) is not int or not 0 <= size < 1 << 53:
        raise BadRequest(f"{where}: size must be an integer in [0, 2^53)")
    if type(crc) is not int or not 0 <= crc < 1 << 32:
        raise BadRequest(f"{where}: crc32c must be an integer in [0, 2^32)")
    return PayloadRef.model_construct(blob_id=blob_id, size=size, crc32c=crc, replicas=[],
                                      receipts=[], token=None)


def _number(where: str, name: str, v: Any, most: float) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v <= most or (
            isinstance(v, float) and math.isnan(v)):
        raise BadRequest(f"{where}: {name} must be a number in [0, {most:g}]")
    return float(v)


def _update(i: int, x: Any) -> NodeUpdate:
    where = f"update {i}"
    group, pending, replicas, receipts, items = _head(where, x)
    names: set[str] = set()
    out: list[EnqueueItem] = []
    for j, it in enumerate(items):
        w = f"{where}, task {j}"
        if not isinstance(it, list) or len(it) != 8:
            raise BadRequest(f"{w}: a list of 8 fields")
        queue, pid, blob_id, size, crc, nb, delay, key = it
        if queue not in names:
            names.add(check_name("queue", queue))
        if pid is not None:
            check_pid(pid)
        if key is not None and not (isinstance(key, str) and 1 <= len(key) <= 128):
            raise BadRequest(f"{w}: idempotency_key must be a string of 1-128 characters")
        out.append(EnqueueItem.model_construct(
            queue=queue, pid=pid,
            payload=None if blob_id is None else _ref(w, blob_id, size, crc),
            not_before=_number(w, "not_before", nb, 1e11),
            delay_secs=_number(w, "delay_secs", delay, MAX_DELAY_SECS),
            idempotency_key=key))
    return NodeUpdate.model_construct(group=group, enqueue=out, replicas=replicas,
                                      receipts=receipts, pending=pending)


def _settle(i: int, x: Any) -> NodeSettle:
    where = f"settle {i}"
    group, durable, replicas, receipts, items = _head(where, x)
    out: list[SettleItem] = []
    for j, it in enumerate(items):
        w = f"{where}, item {j}"
        if not isinstance(it, list) or len(it) != 5:
            raise BadRequest(f"{w}: a list [queue, pid, blob_id, size, crc32c]")
        queue, pid, blob_id, size, crc = it
        check_name("queue", queue)
        check_pid(pid)
        out.append(SettleItem.model_construct(queue=queue, pid=pid,
                                              payload=_ref(w, blob_id, size, crc)))
    return NodeSettle.model_construct(group=group, items=out, durable=durable,
                                      replicas=replicas, receipts=receipts)
