"""Typed FastAPI dependencies of the data node's routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Path, Request
from starlette.types import Scope

from squall.common.wire.cluster import BLOB_ID_PATTERN
from squall.datanode.service import DataNode


async def _node(request: Request) -> DataNode:  # async: a plain def runs in a thread pool
    n: DataNode = request.app.state.node
    return n


def node_of(scope: Scope) -> DataNode:
    n: DataNode = scope["app"].state.node
    return n


NodeDep = Annotated[DataNode, Depends(_node)]
BlobIdP = Annotated[str, Path(min_length=1, max_length=128, pattern=BLOB_ID_PATTERN,
                              description="blob id the master allocated")]
AuthH = Annotated[str | None, Header(alias="Authorization",
                                     description="Bearer <token signed by the master>")]

# how the fast dispatcher resolves the dependencies of the hot routes (from the scope)
RESOLVERS = {_node: node_of}
