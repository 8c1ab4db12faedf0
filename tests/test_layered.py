"""common/server/layered.py: hot routes go through the app's own layers straight into the hot
path, skipping the framework's stack; everything else takes the full stack."""

from __future__ import annotations

from typing import Any

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from squall.common.server.layered import LayeredApp

Log = list[str]


def _recorder(name: str, log: Log) -> type[Any]:
    class Layer:
        def __init__(self, app: ASGIApp, refuse: bool = False) -> None:
            self.app, self.refuse = app, refuse

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                log.append(name)
                assert scope["app"].state.marker == "state"  # the layers find their state
                if self.refuse and not any(k == b"x" for k, _ in scope["headers"]):
                    await send({"type": "http.response.start", "status": 401, "headers": []})
                    await send({"type": "http.response.body", "body": b"no credential"})
                    return
            await self.app(scope, receive, send)
    return Layer


class Fast:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    @staticmethod
    def serves(scope: Scope) -> bool:
        return scope["method"] == "POST" and scope["path"] == "/hot"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.serves(scope):
            await self.app(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"fast"})


def _app(log: Log) -> LayeredApp:
    app = LayeredApp()
    app.state.marker = "state"

    @app.get("/cold")
    def cold() -> dict[str, str]:
        log.append("route")
        return {"answer": "cold"}

    app.hot_path(Fast, Fast.serves)
    app.layer(_recorder("limit", log))
    app.layer(_recorder("guard", log), refuse=True)
    real_build = app.build_middleware_stack

    def build() -> ASGIApp:  # everything that enters the framework's stack is seen here
        stack = real_build()

        async def entered(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                log.append("framework")
            await stack(scope, receive, send)
        return entered
    app.build_middleware_stack = build  # type: ignore[method-assign]
    return app


async def test_hot_requests_take_the_same_layers_and_skip_the_framework() -> None:
    log: Log = []
    transport = httpx.ASGITransport(app=_app(log))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.post("/hot", headers={"x": "1"})
        assert (r.status_code, r.text, log) == (200, "fast", ["guard", "limit"])
        log.clear()
        r = await c.post("/hot")  # the layers still guard the hot path
        assert (r.status_code, log) == (401, ["guard"])
        log.clear()
        r = await c.get("/cold", headers={"x": "1"})
        assert r.json() == {"answer": "cold"}
        assert log == ["framework", "guard", "limit", "route"]
        log.clear()
        r = await c.get("/hot", headers={"x": "1"})  # not the hot path's: FastAPI answers
        assert r.status_code == 404 and log == ["framework", "guard", "limit"]
