"""common/server/layered.py: hot routes go through the app's own layers straight into the hot
path, skipping the framework's stack; everything else takes the full stack. A route table
gives the FastAPI routes, the rules and the hot dispatch, which answers as FastAPI would."""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends, Header, Path, Query, Request
from pydantic import BaseModel, Field
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from squall.common.security.access import PUBLIC, READ, rule
from squall.common.server.http import JSON, install_error_handlers
from squall.common.server.layered import LayeredApp, Route, RouteTable

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


# -- a route table: the FastAPI routes, the rules and the hot dispatch come from its rows --
class Item(BaseModel):
    n: int = Field(ge=0)


def _need(request: Request) -> str:
    return str(request.app.state.marker)


NeedDep = Annotated[str, Depends(_need)]


async def hot_put(group: Annotated[str, Path(pattern="^[a-z]+$")], body: Item, dep: NeedDep,
                  request: Request,
                  limit: Annotated[int, Query(ge=1, le=9)] = 3,
                  tag: Annotated[str | None, Header(alias="X-Tag")] = None) -> Response:
    return JSON({"group": group, "n": body.n, "dep": dep, "limit": limit, "tag": tag,
                 "client": request.client is not None, "route": request.scope["route"].path})


async def cold_get(group: str) -> Response:
    return JSON({"group": group})


TABLE = RouteTable([
    Route("POST", "/g/{group}/put", hot_put, None, rule("producer", "path"), hot=True),
    Route("GET", "/g/{group}", cold_get, None, READ),
    Route("GET", "/openapi.json", None, None, PUBLIC),
])


def _table_app(fast: bool, entered: Log) -> LayeredApp:
    app = LayeredApp(docs_url=None, redoc_url=None)
    app.state.marker = "state"
    install_error_handlers(app)
    TABLE.install(app)
    TABLE.check(app)
    app.dispatch(TABLE, {_need: lambda scope: str(scope["app"].state.marker)}, fast)
    real_build = app.build_middleware_stack

    def build() -> ASGIApp:
        stack = real_build()

        async def framework(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                entered.append(scope["path"])
            await stack(scope, receive, send)
        return framework
    app.build_middleware_stack = build  # type: ignore[method-assign]
    return app


REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("POST", "/g/abc/put", {"json": {"n": 1}}),
    ("POST", "/g/abc/put?limit=5", {"json": {"n": 2}, "headers": {"X-Tag": "t"}}),
    ("POST", "/g/ABC/put", {"json": {"n": 1}}),  # path pattern
    ("POST", "/g/abc/put?limit=0", {"json": {"n": 1}}),  # query bound
    ("POST", "/g/abc/put?limit=x", {"json": {"n": 1}}),
    ("POST", "/g/abc/put", {"json": {"n": -1}}),  # body field
    ("POST", "/g/abc/put", {"json": {}}),
    ("POST", "/g/abc/put", {"content": b"{not json", "headers": {"content-type":
                                                                   "application/json"}}),
    ("POST", "/g/abc/put", {"content": b"[" * 5000 + b"]" * 5000,  # nested too deeply
                            "headers": {"content-type": "application/json"}}),
    ("POST", "/g/abc/put", {"content": b'{"n": 1}'}),  # no Content-Type: not read as JSON
    ("POST", "/g/abc/put", {}),  # no body
    ("GET", "/g/abc", {}),
    ("POST", "/g/abc/put?limit=4&limit=6", {"json": {"n": 3},  # repeated: which one counts
                                            "headers": [("X-Tag", "a"), ("x-tag", "b")]}),
]


async def test_a_route_table_answers_the_same_through_either_dispatch() -> None:
    """The hot row's handler is called by the dispatcher with the arguments FastAPI would
    give (path, query, header, body, Request, dependency), and every error has the same
    status and wording; only with the dispatcher off does the hot request enter FastAPI."""
    answers = {}
    for fast in (True, False):
        entered: Log = []
        transport = httpx.ASGITransport(app=_table_app(fast, entered))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            answers[fast] = [(r.status_code, r.json()) for r in
                             [await c.request(m, u, **kw) for m, u, kw in REQUESTS]]
        hot = [p for p in entered if p.endswith("/put")]
        assert len(hot) == (0 if fast else 12)
    assert answers[True] == answers[False]
    got = answers[True]
    assert got[0] == (200, {"group": "abc", "n": 1, "dep": "state", "limit": 3, "tag": None,
                            "client": True, "route": "/g/{group}/put"})
    assert got[1][1]["limit"] == 5 and got[1][1]["tag"] == "t"
    assert [s for s, _ in got[2:11]] == [400] * 9
    assert "group" in got[2][1]["error"]["message"]
    assert "limit" in got[3][1]["error"]["message"]
    assert "JSON decode error (Expecting property name" in got[7][1]["error"]["message"]
    assert "nested too deeply" in got[8][1]["error"]["message"]
    assert "Field required" in got[10][1]["error"]["message"]
    assert got[11] == (200, {"group": "abc"})
    assert got[12][1]["tag"] in ("a", "b") and got[12][1]["limit"] in (4, 6)
    assert TABLE.rules()[("POST", "/g/{group}/put")] == rule("producer", "path")


def test_a_route_outside_the_table_or_a_hot_route_it_cannot_call_is_refused() -> None:
    app = LayeredApp(docs_url=None, redoc_url=None)
    TABLE.install(app)

    @app.get("/stray")
    async def stray() -> None: ...

    with pytest.raises(RuntimeError, match="/stray"):
        TABLE.check(app)
    with pytest.raises(ValueError, match="no fast resolver"):
        app.dispatch(TABLE, {})
