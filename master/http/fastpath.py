"""The hot POST routes (update, enqueue, lease, and the data nodes' front-door commit and
heartbeats) served without the framework's machinery.

Every request of a worker or producer goes through one of these, and FastAPI's
routing, dependency injection and stdlib JSON parsing cost about as much as the master's
own work for them. This thin ASGI layer matches their paths, validates the body with
pydantic's native JSON parser into the *same* models, calls the same :class:`Master`
methods and maps errors the same way. The FastAPI routes stay the documented contract
(OpenAPI) and serve every other path; tests run the whole API through this layer.

A request served here that logged a record is answered as soon as its WAL group is durable
(``commit.ANSWER_WHEN_DURABLE``); its batch's index commit runs while the answer travels,
and the routes that read the index wait for it first (``GroupCommit.settled``).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from squall.common.errors import StatusError
from squall.common.server.guard import PRINCIPAL
from squall.common.server.http import JSON, body_errors, error_response, parse_body
from squall.common.wire.cluster import HeartbeatRequest, NodeCommitRequest
from squall.common.wire.models import EnqueueRequest, LeaseRequest, UpdateRequest
from squall.common.wire.names import check_name
from squall.master.http.answers import invalid
from squall.master.http.routes.frontdoor import commit_updates, node_speaks
from squall.master.http.routes.nodes import beat
from squall.master.security import check_update
from squall.master.service import Master
from squall.master.storage.commit import ANSWER_WHEN_DURABLE

_ROUTE = re.compile(r"^/v1/groups/([^/]+)/(?:update|queues/([^/]+)/(tasks|lease))$"
                    r"|^/v1/nodes/(commit|heartbeat)$")


class FastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    @staticmethod
    def serves(scope: Scope) -> bool:
        """Whether this layer answers the (HTTP) request itself."""
        return scope["method"] == "POST" and _ROUTE.match(scope["path"]) is not None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        m = _ROUTE.match(scope["path"]) if scope["type"] == "http" else None
        if m is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = b""
        while True:  # BodyLimit, outside this layer, bounds it
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        master: Master = scope["app"].state.master
        early = ANSWER_WHEN_DURABLE.set(True)
        try:
            res = await self._serve(master, m, body, scope)
            resp = JSON(res)
        except ValidationError as e:
            resp = error_response(invalid(body_errors(e)))
        except StatusError as e:
            resp = error_response(e)
        finally:
            ANSWER_WHEN_DURABLE.reset(early)
        await resp(scope, receive, send)

    @staticmethod
    async def _serve(master: Master, m: re.Match[str], body: bytes, scope: Scope
                     ) -> dict[str, Any]:
        client = scope.get("client")
        addr = f"{client[0]}:{client[1]}" if client else ""
        if m[4] == "heartbeat":  # a data node's heartbeat and block report
            auth = next((v.decode("latin-1") for k, v in scope.get("headers", ())
                         if k == b"authorization"), None)
            return beat(master, parse_body(HeartbeatRequest, body), scope.get(PRINCIPAL), auth,
                        scope["app"].state.credentials.revoked)
        if m[4] is not None:  # a data node's group commit of front-door enqueues
            req_c = parse_body(NodeCommitRequest, body)
            auth = next((v.decode("latin-1") for k, v in scope.get("headers", ())
                         if k == b"authorization"), None)
            node_speaks(master, scope.get(PRINCIPAL), auth, req_c.node_id)
            return await commit_updates(master, req_c, addr)
        group = check_name("group", m[1])
        if m[2] is None:
            req = parse_body(UpdateRequest, body)
            check_update(scope.get(PRINCIPAL), bool(req.enqueue),
                         bool(req.dequeue or req.renew or req.release or req.lease))
            return await master.update(group, req, addr)
        queue = check_name("queue", m[2])
        if m[3] == "tasks":
            return await master.enqueue(group, queue, parse_body(EnqueueRequest, body).tasks)
        return await master.lease(group, queue, parse_body(LeaseRequest, body), addr)
