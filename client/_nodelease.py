"""Leases answered with their payloads by a data node: ``POST {node}/v1/groups/{g}/queues/
{q}/lease`` (``datanode/leasing.py``). The node leases on the master with the client's
credential, acknowledging the tasks given (the acks ride on it, as on a direct lease) and
attaches the small payloads of the leased tasks: one round trip per batch instead of a
lease and a batch read per data node.

Used by ``lease(payloads=True)``, ``batches()`` and the ``Worker`` when the client's
``lease_via_node`` is on and the update carries nothing but acknowledgements. Which nodes
exist comes from the master's ``GET /v1/cluster`` (alive ones), cached for ``NODES_TTL_S``;
requests rotate over them. Failures:

- a node that is down, busy or without a master (nothing leased: connection refused,
  503, 429) is skipped for a while and the next is tried, up to two; then the lease goes
  to the master directly and the node path rests for ``NODES_TTL_S``;
- a node that may have leased and lost the answer (a connection cut after sending, 502,
  500, 504): without acknowledgements, the lease is sent again elsewhere (the tasks it
  may have taken come back when their lease expires); with them, the error is raised, as
  a direct update's would be (the acks may have been applied);
- every other error (credential, bad input, the master's refusals) is raised as it came.

Each payload attached is checked against the size and CRC32C of the master's answer; one
that is missing or fails is read from its replicas, as after a direct lease.
"""

from __future__ import annotations

from typing import Any

import orjson

from squall.client._blobs import AliveNodes, NodeBook
from squall.client._effects import Call, ConnectError, Proto, Reply, Retry, call, may_have_applied
from squall.common.checksum import crc32c
from squall.common.errors import BadRequest, Overloaded, SquallError, TransportError, Unavailable
from squall.common.wire.payload import OK, decode_lease_answer

TRIES = 2  # nodes tried before the lease goes to the master


class NodeLease:
    def __init__(self, retry: Retry, book: NodeBook, timeout_s: float,
                 token: str | None = None) -> None:
        self.retry, self.book, self.timeout_s = retry, book, timeout_s
        self.headers = {"Content-Type": "application/json"}
        if token:  # the node, then the master, check the client's credential
            self.headers["Authorization"] = f"Bearer {token}"
        self.nodes = AliveNodes(retry, book)
        self.used = self.fallbacks = 0

    def lease(self, group: str, name: str, body: dict[str, Any],
              dequeue: list[dict[str, Any]]
              ) -> Proto[tuple[dict[str, Any], dict[str, bytes]] | None]:
        """(the master's answer, the payloads attached by blob id, unchecked), or None: no
        node took it (lease on the master)."""
        order = yield from self.nodes.next_order()
        if not order:
            return None
        content = orjson.dumps({**body, "dequeue": dequeue} if dequeue else body)
        wait = body.get("wait_secs")
        for node in order[:TRIES]:
            c = Call("POST", f"{node}/v1/groups/{group}/queues/{name}/lease", content=content,
                     headers=self.headers, raw=True, idempotent=False, retries=0,
                     timeout=self.timeout_s + wait if wait else self.timeout_s)
            try:
                reply: Reply = yield from call(c, self.retry)
            except (ConnectError, Unavailable, Overloaded):  # refused: nothing leased
                self.book.failed(node)
                continue
            except SquallError as e:
                if not may_have_applied(e) or dequeue:
                    raise  # as it came; or acks that may have been applied, as direct
                self.book.failed(node)  # a lost lease: its tasks come back when it expires
                continue
            try:
                raw, frames = decode_lease_answer(reply.content)
                doc = orjson.loads(raw)
            except (BadRequest, orjson.JSONDecodeError) as e:  # an answer cut or garbled
                self.book.failed(node)
                if dequeue:
                    raise TransportError(f"{node}: the lease answer did not parse ({e}); "
                                         "the acknowledgements may have been applied") from e
                continue
            self.used += 1
            return doc, {f.blob_id: f.data for f in frames if f.status == OK}
        self.fallbacks += 1
        self.nodes.rest()  # the master directly for NODES_TTL_S
        return None


def checked(data: bytes | None, size: int, crc: int) -> bool:
    return data is not None and len(data) == size and crc32c(data) == crc
