"""Enqueue through a data node's front door: tasks with small payloads go to one
data node in one request (``POST {node}/v1/groups/{g}/queues/{q}/tasks``, msgpack); the
node stores and replicates the payloads and commits the tasks to the master, then answers.
One round trip instead of three (allocate, write, enqueue).

Used by ``put`` and ``put_many`` when every payload of the batch is bytes of at most
``max_bytes`` (64 KiB, the nodes' default limit) and at least one task has a payload.
Which nodes exist comes from the master's ``GET /v1/cluster`` (alive ones), cached for
``NODES_TTL_S``; requests rotate over them. A node that fails (down, overloaded, no front
door, quorum not met) is skipped for a while and the next one is tried; when none of up
to three takes the batch, the caller falls back to the classic path, and the front door
rests for ``NODES_TTL_S``. Bad input and credential errors are raised as they are. A node
that lost the master's answer says so (502 ``outcome_unknown``, never 503): the batch is
resent to the next node, and if every later attempt is refused the caller raises
``OutcomeUnknown``, not the refusal (refused means not applied).
The client's credential goes with the request (the node checks role producer and the
group, as the master would). Every task carries a client-made pid, so a request whose
answer was lost (the node committed, then died) collapses into the first attempt wherever
it is resent.
"""

from __future__ import annotations

from typing import Any

import msgpack

from squall.client._blobs import AliveNodes, NodeBook
from squall.client._effects import Call, Proto, Retry, call, lost_answer, may_have_applied
from squall.common.errors import BadRequest, Forbidden, SquallError, Unauthorized

MAX_BYTES = 64 << 10


class FrontDoor:
    def __init__(self, retry: Retry, nodes: NodeBook, timeout_s: float,
                 token: str | None = None, max_bytes: int = MAX_BYTES) -> None:
        self.retry, self.book, self.timeout_s, self.max_bytes = retry, nodes, timeout_s, max_bytes
        self.headers = {"Content-Type": "application/msgpack"}
        if token:  # the data node checks the client's credential (role producer)
            self.headers["Authorization"] = f"Bearer {token}"
        self.nodes = AliveNodes(retry, nodes)
        self.used = self.fallbacks = 0

    def eligible(self, sources: list[Any]) -> bool:
        return (any(s is not None for s in sources)
                and all(s is None or (isinstance(s, bytes) and len(s) <= self.max_bytes)
                        for s in sources))

    def enqueue(self, group: str, name: str, specs: list[dict[str, Any]], sources: list[Any]
                ) -> Proto[tuple[list[dict[str, Any]] | None, str | None]]:
        """The master's enqueue results, or None: no node took it (use the classic path);
        and what happened to the first attempt that may have been applied (a node that
        lost the master's answer, a connection lost after sending), or None."""
        order = yield from self.nodes.next_order()
        if not order:
            return None, None
        tasks = []
        for spec, src in zip(specs, sources, strict=True):
            t = dict(spec)
            if src is not None:
                t["payload"] = src
            tasks.append(t)
        body = msgpack.packb({"tasks": tasks}, use_bin_type=True)
        unknown: str | None = None
        for node in order[:3]:
            c = Call("POST", f"{node}/v1/groups/{group}/queues/{name}/tasks", content=body,
                     headers=self.headers,
                     timeout=self.timeout_s, retries=0)
            try:
                ans = yield from call(c, self.retry)
            except (Unauthorized, Forbidden, BadRequest) as e:
                if unknown is None:  # the same on every path: the caller's problem
                    raise
                raise lost_answer(e, unknown) from e
            except SquallError as e:  # down, busy, quorum not met, too large, no front door...
                self.book.failed(node)
                if may_have_applied(e):  # resending is safe: the pids collapse into it
                    unknown = unknown or f"{node}: {type(e).__name__}: {e}"
                continue
            self.used += 1
            return list(ans["enqueued"]), None
        self.fallbacks += 1
        self.nodes.rest()  # the classic path for NODES_TTL_S
        return None, unknown
