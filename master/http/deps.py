"""Typed FastAPI dependencies."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from starlette.types import Scope

from squall.master.service import Master


async def _master(request: Request) -> Master:  # async: a plain def runs in a thread pool
    m: Master = request.app.state.master
    return m


async def _settled(request: Request) -> Master:
    """The master once no index commit is in flight, so a read sees every answered write;
    503 while the index is behind the WAL (`GroupCommit.settled`). Routes that read the
    index take this instead of MasterDep: it runs before their body looks anything up."""
    m: Master = request.app.state.master
    await m.commit.settled()
    return m


def master_of(scope: Scope) -> Master:
    m: Master = scope["app"].state.master
    return m


MasterDep = Annotated[Master, Depends(_master)]
ReadMasterDep = Annotated[Master, Depends(_settled)]


def client_addr(request: Request) -> str:
    c = request.client
    return f"{c.host}:{c.port}" if c else ""

# how the fast dispatcher resolves the dependencies of the hot routes (from the scope)
RESOLVERS = {_master: master_of}
