"""Data-node facing routes: heartbeats, blob allocation, and the cluster map."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastapi import Request

from squall.common.server.guard import PRINCIPAL
from squall.common.wire.cluster import (
    AllocateRequest,
    HeartbeatRequest,
)
from squall.master.http.answers import JSON
from squall.master.http.deps import MasterDep
from squall.master.http.routes.frontdoor import node_speaks
from squall.master.service import Master


async def heartbeat(body: HeartbeatRequest, request: Request, m: MasterDep) -> JSON:
    """A data node's heartbeat and block report (authenticated by a node credential for
    its node id, or a heartbeat token signed with the cluster key and scoped to it); the
    answer carries commands (replicate, delete)."""
    return JSON(beat(m, body, request.scope.get(PRINCIPAL), request.headers.get("authorization"),
                     request.app.state.credentials.revoked))


def beat(m: Master, body: HeartbeatRequest, principal: object, authorization: str | None,
         revoked: Iterable[str]) -> dict[str, Any]:
    """The heartbeat's work once parsed (the master's fast path calls it too: a full block
    report of many thousand ids validates ~10x faster from JSON than through FastAPI)."""
    node_speaks(m, principal, authorization, body.node_id)
    answer = m.cluster.heartbeat(body).model_dump()
    answer["revoked"] = sorted(revoked)
    return answer


async def allocate(body: AllocateRequest, m: MasterDep) -> JSON:
    """Blob ids and the data nodes to write them to, with a write token. PUT each blob to
    the first replica; it forwards to the others and answers with receipts, which the
    enqueue that references the blob must carry."""
    return JSON(m.placement.allocate(body.count, body.size_bytes))


async def cluster(m: MasterDep) -> JSON:
    """Data nodes and their health, replication factor, under-replicated and lost blobs."""
    return JSON(m.cluster.info())
