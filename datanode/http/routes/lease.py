"""``POST /v1/groups/{group}/queues/{queue}/lease`` on a data node: a lease answered with
its payloads (see ``datanode/leasing.py``). Role: consumer (the node checks the
credential, and the master checks it again: the node sends the lease with it).

Body (JSON): the master's lease request (``max_tasks``, ``lease_secs``, ``max_pid``,
``worker``, ``wait_secs``) and ``dequeue``: tasks of the group to acknowledge in the same
atomic update (``[{"queue", "pid", "token"}]``). The answer
(``application/vnd.squall.lease``): ``u32 n``, the master's JSON answer (n bytes: a
``LeaseResponse``, or an ``UpdateResponse`` with ``leased`` when ``dequeue`` is given),
then one batch frame per payload attached (``common/wire/payload.py``).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path
from pydantic import Field
from starlette.responses import Response

from squall.common.errors import Unauthorized
from squall.common.wire.models import MAX_BATCH, NAME_PATTERN, LeaseRequest, TaskRef
from squall.common.wire.payload import LEASE_ANSWER_TYPE, encode_lease_answer
from squall.datanode.http.deps import AuthH, NodeDep
from squall.datanode.leasing import lease_for

GroupP = Annotated[str, Path(description="consistency group", pattern=NAME_PATTERN)]
QueueP = Annotated[str, Path(description="queue name", pattern=NAME_PATTERN)]
ANSWER = {"content": {LEASE_ANSWER_TYPE: {"schema": {"type": "string", "format": "binary"}}},
          "description": "u32 length, the master's JSON answer, then the payloads' frames"}


class NodeLeaseRequest(LeaseRequest):
    dequeue: Annotated[list[TaskRef], Field(max_length=MAX_BATCH)] = Field(
        [], description="tasks of the group to acknowledge in the same atomic update")


async def lease(group: GroupP, queue: QueueP, body: NodeLeaseRequest, node: NodeDep,
                authorization: AuthH = None) -> Response:
    """Lease up to `max_tasks` tasks on the master for the caller (with its credential),
    acknowledging `dequeue` in the same update; the answer carries the master's answer
    and the small payloads of the leased tasks."""
    if not authorization:  # the guard checked it; the master needs it too
        raise Unauthorized("a consumer credential is needed")
    spec = body.model_dump(exclude_none=True, exclude={"dequeue"})
    got = await lease_for(node, group, queue, spec, authorization,
                          [d.model_dump() for d in body.dequeue])
    crc = {t["payload"]["blob_id"]: t["payload"]["crc32c"] for t in got.tasks
           if isinstance(t, dict) and isinstance(t.get("payload"), dict)}
    return Response(encode_lease_answer(got.answer, ((b, d, crc[b])
                                                     for b, d in got.payloads.items())),
                    media_type=LEASE_ANSWER_TYPE)
