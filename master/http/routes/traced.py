"""The task routes' work with a server span around it (``common/server/tracing.py``): only
when the master was started with an exporter configured. Spans: ``squall enqueue g#q``,
``squall lease g#q``, ``squall update g`` (its acks, enqueues and lease), each linked to
the trace context of the tasks it enqueued or leased."""

from __future__ import annotations

import time
from typing import Any

from squall.common.errors import StatusError
from squall.common.wire.models import EnqueueRequest, LeaseRequest, UpdateRequest
from squall.master.service import Master


async def traced_enqueue(m: Master, group: str, queue: str, body: EnqueueRequest
                         ) -> dict[str, Any]:
    t0 = time.time_ns()
    attrs = {"messaging.operation.type": "send", "messaging.operation.name": "enqueue",
             "messaging.destination.name": f"{group}#{queue}",
             "messaging.batch.message_count": len(body.tasks)}
    try:
        res = await m.enqueue(group, queue, body.tasks, answer_when_durable=True)
    except StatusError as e:
        m.spans.record(f"squall enqueue {group}#{queue}", t0, attrs, (), e.code)
        raise
    m.spans.record(f"squall enqueue {group}#{queue}", t0, attrs,
                   (t.traceparent for t in body.tasks))
    return res


async def traced_lease(m: Master, group: str, queue: str, body: LeaseRequest, addr: str
                       ) -> dict[str, Any]:
    t0 = time.time_ns()
    attrs: dict[str, Any] = {"messaging.operation.type": "receive",
                             "messaging.operation.name": "lease",
                             "messaging.destination.name": f"{group}#{queue}"}
    try:
        res = await m.lease(group, queue, body, addr, answer_when_durable=True)
    except StatusError as e:
        m.spans.record(f"squall lease {group}#{queue}", t0, attrs, (), e.code)
        raise
    attrs["messaging.batch.message_count"] = len(res["tasks"])
    m.spans.record(f"squall lease {group}#{queue}", t0, attrs,
                   (t.get("traceparent") for t in res["tasks"]))
    return res


async def traced_update(m: Master, group: str, body: UpdateRequest, addr: str
                        ) -> dict[str, Any]:
    t0 = time.time_ns()
    attrs: dict[str, Any] = {"messaging.operation.type": "settle",
                             "messaging.operation.name": "update",
                             "squall.group": group, "squall.acks": len(body.dequeue),
                             "squall.enqueues": len(body.enqueue),
                             "squall.releases": len(body.release)}
    try:
        res = await m.update(group, body, addr, answer_when_durable=True)
    except StatusError as e:
        m.spans.record(f"squall update {group}", t0, attrs, (), e.code)
        raise
    attrs["squall.leased"] = len(res.get("leased") or ())
    m.spans.record(f"squall update {group}", t0, attrs,
                   [*(e.traceparent for e in body.enqueue),
                    *(t.get("traceparent") for t in res.get("leased") or ())])
    return res
