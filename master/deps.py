"""Typed FastAPI dependencies."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from squall.master.service import Master


def _master(request: Request) -> Master:
    m: Master = request.app.state.master
    return m


MasterDep = Annotated[Master, Depends(_master)]


def client_addr(request: Request) -> str:
    c = request.client
    return f"{c.host}:{c.port}" if c else ""
