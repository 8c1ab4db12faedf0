"""Node-facing routes of the data-node front door (see ``datanode/frontdoor.py``): blocks
of blob ids granted ahead of time, and the group commit of many clients' enqueues.

Both need the node's own credential (its node credential, or a token it signs with the
cluster key scoped to its node id, as its heartbeats do): role ``node``.

- ``POST /v1/nodes/blocks``: a block of ``count`` blob ids (a fresh random prefix plus
  0..count-1) and the peers to replicate them to, valid for ``BLOCK_SECS`` (well inside
  the orphan grace, so a blob written from a block and never committed is collected, and
  one that is committed always passes the receipt age check). At most
  ``BLOCKS_PER_NODE`` unexpired blocks per node (429 beyond).
- ``POST /v1/nodes/commit``: a list of updates (one per client request, each a list of
  enqueues, and the replicas and batch receipts their payloads share, sent once) and of
  settles (a parallel put's pending tasks confirmed with their receipts, or abandoned;
  master/tasks/pending.py); each is applied all or nothing on its own, all of them
  concurrently, so they share the WAL's group commit (one fsync for the lot). An update
  marked ``pending`` logs its payload tasks pending (the parallel put). The answer has,
  per update and per settle, the master's answer or its error.
- ``POST /v1/nodes/commit.msgpack``: the same with the compact binary body the data nodes
  send (``common/wire/nodecommit.py``).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable
from typing import Any

from fastapi import Request

from squall.common.errors import (
    Forbidden,
    Overloaded,
    StatusError,
    Unavailable,
    UnsupportedMediaType,
)
from squall.common.security.tokens import TokenClaims, bearer, verify
from squall.common.server.guard import PRINCIPAL
from squall.common.wire import nodecommit
from squall.common.wire.cluster import (
    BlockRequest,
    NodeCommitRequest,
    NodeUpdate,
)
from squall.common.wire.models import EnqueueItem, UpdateRequest
from squall.master.http.answers import JSON
from squall.master.http.deps import MasterDep, client_addr
from squall.master.security import check_node
from squall.master.service import Master

COMPACT_BODY = {"requestBody": {"required": True, "content": {"application/msgpack": {
    "schema": {"type": "string", "format": "binary"}}}}}
BLOCK_SECS = 60.0
BLOCKS_PER_NODE = 8


def _node(m: Master, request: Request, node_id: str) -> None:
    node_speaks(m, request.scope.get(PRINCIPAL), request.headers.get("authorization"), node_id)


def node_speaks(m: Master, principal: object, authorization: str | None, node_id: str) -> None:
    """The caller speaks for `node_id`: its node credential, or a heartbeat token. The
    guard already checked a heartbeat token's signature, expiry and scope and left its
    claims as the principal: only the node id is left to check (no second MAC)."""
    if isinstance(principal, TokenClaims) and principal.op == "heartbeat":
        if not principal.covers(node_id):
            raise Forbidden(f"token does not cover node {node_id!r}")
        return
    if not check_node(principal, node_id):
        verify(m.key, bearer(authorization), "heartbeat", node_id, m.clock.now())


async def blocks(body: BlockRequest, request: Request, m: MasterDep) -> JSON:
    """A block of blob ids for this node's front door, and the peers to copy them to."""
    _node(m, request, body.node_id)
    c = m.cluster
    now = c.clock.now()
    me = c.nodes.get(body.node_id)
    if me is None or c.state(me, now) != "alive":
        raise Unavailable(f"node {body.node_id} is not alive here yet: heartbeat first",
                          retry_after=c.s.heartbeat_interval_s)
    grants = [t for t in me.block_grants if t > now]
    if len(grants) >= BLOCKS_PER_NODE:
        raise Overloaded(f"node {body.node_id} holds {len(grants)} unexpired blocks",
                         retry_after=1)
    others = [n for n in c.live(now, strict=True) if n.node_id != body.node_id]
    others.sort(key=lambda n: n.used_bytes / max(1, n.capacity_bytes))
    peers = others[:c.s.replication_factor - 1]
    if 1 + len(peers) < c.s.quorum:
        raise Unavailable(f"{1 + len(peers)} data node(s) alive, a write needs "
                          f"{c.s.quorum}", retry_after=c.s.heartbeat_interval_s)
    expires = now + min(BLOCK_SECS, c.s.orphan_grace_s / 4)
    me.block_grants = [*grants, expires]
    return JSON({"prefix": "f" + secrets.token_hex(8) + "-", "count": body.count,
                 "expires_at": expires, "replicas": [n.address for n in peers],
                 "write_quorum": c.s.quorum})


async def commit(body: NodeCommitRequest, request: Request, m: MasterDep) -> JSON:
    """Commit many clients' front-door enqueues, each update on its own, in one go."""
    _node(m, request, body.node_id)
    return JSON(await commit_updates(m, body, client_addr(request)))


async def commit_compact(request: Request, m: MasterDep) -> JSON:
    """:func:`commit` with the compact binary body the data nodes send
    (``common/wire/nodecommit.py``: msgpack, positional items)."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype != nodecommit.CONTENT_TYPE:
        raise UnsupportedMediaType(f"send the commit as Content-Type: {nodecommit.CONTENT_TYPE}")
    body = nodecommit.decode(await request.body())
    _node(m, request, body.node_id)
    return JSON(await commit_updates(m, body, client_addr(request)))


async def commit_updates(m: Master, body: NodeCommitRequest, addr: str) -> dict[str, Any]:
    """Apply each update and each settle on its own, all of them concurrently (one group
    commit), each answered once durable in the WAL."""

    async def one(call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        try:
            return {"ok": await call}
        except StatusError as e:
            return {"error": {**e.to_body()["error"], "status": e.status}}

    def update(u: NodeUpdate) -> Awaitable[dict[str, Any]]:
        if u.pending:  # the parallel put: payloads still being stored on u.replicas
            return m.enqueue_pending(u.group, u.enqueue, body.node_id, u.replicas,
                                     answer_when_durable=True)
        return m.update(u.group, UpdateRequest.model_construct(
            enqueue=_shared(u), dequeue=[], renew=[], release=[], lease=None), addr,
            answer_when_durable=True)

    out = await asyncio.gather(*(one(update(u)) for u in body.updates),
                               *(one(m.settle(s.group, s, answer_when_durable=True))
                                 for s in body.settles))
    n = len(body.updates)
    return {"results": list(out[:n]), "settled": list(out[n:])}


def _shared(u: NodeUpdate) -> list[EnqueueItem]:
    """The update's enqueues; a payload that names neither receipts nor replicas of its
    own gets the update's (the front door sends them once per request)."""
    if u.receipts or u.replicas:
        for e in u.enqueue:
            p = e.payload
            if p is not None and not p.receipts and not p.replicas:
                p.receipts, p.replicas = u.receipts, u.replicas
    return u.enqueue
