"""``POST /v1/groups/{group}/queues/{queue}/tasks`` on a data node: the front door for
small payloads (see ``datanode/frontdoor.py``). Role: producer.

Body (``Content-Type: application/msgpack``)::

    {"tasks": [{"pid": str, "payload": bytes | nil, "not_before": float | nil,
                "delay_secs": float | nil}, ...]}

at most 1,000 tasks, each payload at most ``front_door_max_bytes`` (64 KiB; larger ones
take the streamed path). The answer is the master's enqueue answer (JSON
``{"ticket", "enqueued": [{"queue", "pid", "collapsed"}]}``), sent once the tasks are in
the master's fsynced WAL and their payloads on the write quorum.
"""

from __future__ import annotations

import time
from typing import Any

import msgpack
from fastapi import Request
from pydantic import ValidationError

from squall.common.errors import BadRequest, PayloadTooLarge, StatusError, Unavailable
from squall.common.server.http import JSON
from squall.common.wire.models import MAX_BATCH, TaskSpec
from squall.common.wire.names import check_name, check_pid
from squall.datanode.http.deps import NodeDep
from squall.datanode.service import DataNode

# extras a task may carry (checked as the master will: a refused item would refuse the
# node's whole group commit); `batch` is not here: joining a batch can be refused
_EXTRAS = {"unique", "debounce_secs", "debounce_max_secs", "traceparent", "tracestate"}
_FIELDS = {"pid", "payload", "not_before", "delay_secs", "idempotency_key", "key", *_EXTRAS}
BODY = {"requestBody": {"required": True, "content": {"application/msgpack": {
    "schema": {"type": "string", "format": "binary"}}}}}


def parse(body: bytes, content_type: str, max_payload: int) -> list[dict[str, Any]]:
    if content_type.split(";")[0].strip().lower() != "application/msgpack":
        raise BadRequest("send the tasks as Content-Type: application/msgpack")
    try:
        doc = msgpack.unpackb(body, raw=False, strict_map_key=True, max_array_len=MAX_BATCH,
                              max_map_len=16, max_str_len=4096, max_bin_len=max_payload)
    except ValueError as e:
        if "exceeds max_bin_len" in str(e):
            raise PayloadTooLarge(f"a payload is over the front door's limit of "
                                  f"{max_payload} bytes; put it through the streamed path "
                                  "(allocate, PUT, enqueue)") from None
        raise BadRequest(f"body is not valid msgpack for this route: {e}") from None
    except Exception as e:  # msgpack raises several unrelated types on bad input
        raise BadRequest(f"body is not valid msgpack: {type(e).__name__}") from None
    tasks = doc.get("tasks") if isinstance(doc, dict) else None
    if not isinstance(tasks, list) or not 1 <= len(tasks) <= MAX_BATCH:
        raise BadRequest(f'expected {{"tasks": [1..{MAX_BATCH} tasks]}}')
    for i, t in enumerate(tasks):
        _check(i, t)
    return tasks


def _check(i: int, t: Any) -> None:
    if not isinstance(t, dict) or set(t) - _FIELDS:
        raise BadRequest(f"task {i}: a map of {sorted(_FIELDS)}")
    pid, data = t.get("pid"), t.get("payload")
    if pid is not None:
        if not isinstance(pid, str):
            raise BadRequest(f"task {i}: pid must be a string")
        check_pid(pid)
    key = t.get("idempotency_key")
    if key is not None and not (isinstance(key, str) and 1 <= len(key) <= 128):
        raise BadRequest(f"task {i}: idempotency_key must be a string of 1-128 characters")
    fkey = t.get("key")
    if fkey is not None:
        if not isinstance(fkey, str):
            raise BadRequest(f"task {i}: key must be a string")
        check_name("key", fkey)
    if data is not None and not isinstance(data, bytes):
        raise BadRequest(f"task {i}: payload must be binary (msgpack bin)")
    if _EXTRAS.intersection(t):
        try:
            TaskSpec.model_validate({k: v for k, v in t.items() if k != "payload"})
        except ValidationError as e:
            raise BadRequest(f"task {i}: {e.errors()[0]['msg']}") from None
    for k in ("not_before", "delay_secs"):
        v = t.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int | float)):
            raise BadRequest(f"task {i}: {k} must be a number")


async def enqueue(group: str, queue: str, request: Request, node: NodeDep) -> JSON:
    """Enqueue tasks with small payloads in one round trip: stored here and on the replica
    set, committed to the master with other requests, answered when durable."""
    return JSON(await serve(node, group, queue, await request.body(),
                            request.headers.get("content-type", "")))


async def serve(node: DataNode, group: str, queue: str, body: bytes, content_type: str
                ) -> dict[str, Any]:
    """The route's work."""
    check_name("group", group)
    check_name("queue", queue)
    fd = node.frontdoor
    if fd is None:
        raise Unavailable("the front door is not running on this node")
    tasks = parse(body, content_type, node.settings.front_door_max_bytes)
    if node.spans.tracer is None:
        return await fd.enqueue(group, queue, tasks)
    t0 = time.time_ns()
    attrs = {"messaging.operation.type": "send", "messaging.operation.name": "enqueue",
             "messaging.destination.name": f"{group}#{queue}",
             "messaging.batch.message_count": len(tasks)}
    try:
        res = await fd.enqueue(group, queue, tasks)
    except StatusError as e:
        node.spans.record(f"squall enqueue {group}#{queue}", t0, attrs, (), e.code)
        raise
    node.spans.record(f"squall enqueue {group}#{queue}", t0, attrs,
                      (t.get("traceparent") for t in tasks))
    return res

