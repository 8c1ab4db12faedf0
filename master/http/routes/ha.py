"""A master set's routes: the journal calls between members, who leads, the members,
step-down (``master/ha/``)."""

from __future__ import annotations

from typing import Annotated, Any

import msgpack
from fastapi import Path, Request
from pydantic import BaseModel, Field
from starlette.responses import Response

from squall.common.errors import BadRequest, NotFound, Unavailable
from squall.master.ha.journal import Refused
from squall.master.http.answers import JSON
from squall.master.http.deps import MasterDep

MSGPACK = "application/x-msgpack"


def _set(m: Any) -> Any:
    ha = getattr(m, "ha", None)
    if ha is None:
        raise NotFound("this master runs alone (no --members): it has no master set")
    return ha


async def journal(method: Annotated[str, Path(max_length=32)], request: Request,
                  m: MasterDep) -> Response:
    """A journal call from another member (msgpack in and out; 409 = refused)."""
    ha = _set(m)
    try:
        args = msgpack.unpackb(await request.body(), raw=False)
    except (ValueError, msgpack.UnpackException) as e:
        raise BadRequest(f"the body is not msgpack: {e}") from None
    if not isinstance(args, dict):
        raise BadRequest("the body is a msgpack map of the call's arguments")
    try:
        out = await ha.rpc(method, args)
    except KeyError:
        raise NotFound(f"no journal call {method!r}") from None
    except TypeError as e:
        raise BadRequest(f"bad arguments for {method}: {e}") from None
    except Refused as e:
        return Response(msgpack.packb({"refused": e.kind, "detail": e.detail,
                                       "state": e.state}), 409, media_type=MSGPACK)
    return Response(msgpack.packb(out, use_bin_type=True), media_type=MSGPACK)


async def leader(m: MasterDep) -> JSON:
    """Who leads this master set (public, cheap): {leader, epoch, me, role, elector}."""
    ha = getattr(m, "ha", None)
    if ha is None:
        return JSON({"leader": None, "epoch": 0, "me": None, "role": "leader",
                     "elector": "none"})
    return JSON(ha.leader_view())


async def members(m: MasterDep) -> JSON:
    """The master set: members, leader, epoch, each journal's lag, the elector."""
    return JSON(_set(m).view())


class MemberChange(BaseModel):
    action: str = Field(pattern="^(add|remove)$")
    member: str = Field(max_length=300)


async def change_members(body: MemberChange, m: MasterDep) -> JSON:
    """Add or remove one member (admin; logged in the journal)."""
    ha = _set(m)
    if ha.role != "leader":
        raise Unavailable(ha.standby_reason())
    try:
        out = await (ha.add_member(body.member) if body.action == "add"
                     else ha.remove_member(body.member))
    except ValueError as e:
        raise BadRequest(str(e)) from None
    return JSON(out)


async def step_down(m: MasterDep) -> JSON:
    """Stop leading (maintenance): another member takes over."""
    ha = _set(m)
    if ha.role != "leader":
        raise Unavailable(ha.standby_reason())
    await ha.step_down("an operator asked (squall master step-down)")
    return JSON({"ok": True, "me": ha.me, "role": ha.role})
