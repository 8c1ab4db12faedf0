"""Operator verbs on data nodes (admin role): inspect, decommission (and cancel it),
forget. See ``master/cluster/drain.py`` for what the states mean."""

from __future__ import annotations

from typing import Annotated

from fastapi import Path

from squall.master.cluster import drain
from squall.master.http.answers import JSON
from squall.master.http.deps import MasterDep

NodeP = Annotated[str, Path(description="a data node's id (`GET /v1/cluster` lists them)",
                            min_length=1, max_length=128)]


async def get_node(node_id: NodeP, m: MasterDep) -> JSON:
    """One data node: health, usage, and decommission progress."""
    return JSON(drain.describe(m.cluster, node_id))


async def decommission(node_id: NodeP, m: MasterDep) -> JSON:
    """Start decommissioning a node (idempotent): it gets no new blobs and the master copies
    every blob it holds to other nodes while it keeps serving reads. Poll `GET
    /v1/nodes/{node_id}` until `state` is `decommissioned`; then stop it and forget it.
    The request survives a master restart. 409 if the other nodes in service could not hold
    the replication factor."""
    return JSON(await m.decommission(node_id))


async def recommission(node_id: NodeP, m: MasterDep) -> JSON:
    """Cancel a decommission (idempotent): the node takes new blobs again and extra copies
    made meanwhile are trimmed."""
    return JSON(await m.recommission(node_id))


async def forget(node_id: NodeP, m: MasterDep) -> JSON:
    """Remove a dead or decommissioned node from the master's node table. Refused (409)
    for a node that is alive and not decommissioned. If it heartbeats again it rejoins as a
    new node."""
    return JSON(await m.forget_node(node_id))
