"""Typed FastAPI dependencies."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from squall.master.service import Master


async def _master(request: Request) -> Master:  # async: a plain def runs in a thread pool
    m: Master = request.app.state.master
    return m


MasterDep = Annotated[Master, Depends(_master)]


def client_addr(request: Request) -> str:
    c = request.client
    return f"{c.host}:{c.port}" if c else ""
