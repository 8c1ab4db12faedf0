"""A standby member of a master set answers 503 naming the leader on every route but the
health probes, ``GET /v1/leader`` and the journal calls (clients follow the
``X-Squall-Leader`` header or the body's ``leader``)."""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

OPEN = frozenset({"/healthz", "/readyz", "/v1/leader"})


class StandbyGate:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ha = getattr(getattr(scope["app"].state, "master", None), "ha", None)
        path = scope["path"]
        if ha is None or ha.serving() or path in OPEN or path.startswith("/v1/journal/"):
            await self.app(scope, receive, send)
            return
        leader = ha.leader if ha.role != "leader" else None
        why = ha.standby_reason() if ha.role != "leader" else (ha.failure() or "stepping down")
        body = json.dumps({"detail": why, "leader": leader}).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()),
                   (b"retry-after", b"1")]
        if leader:
            headers.append((b"x-squall-leader", leader.encode()))
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
