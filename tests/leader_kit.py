"""A stand-in member of a master set, for the tests of clients and data nodes following the
leader: a tiny ASGI app served by uvicorn on 127.0.0.1 (``helpers.running_app``).

As a **standby** it answers as a master set's standby does (common/masters.py):
``/healthz`` 200, ``/readyz`` 503, ``GET /v1/leader`` its view, every other route 503 with
``{"detail": "standby of <url> (lag N records)", "leader": <url or null>}`` and
``X-Squall-Leader`` when it knows the leader. As a **leader** it forwards every request to
a real master (``target``) and relays the answer, so a client reaches the real master
through it. ``drop_after_apply``: that many forwarded requests get the master's answer
cut off after the master applied them (the connection breaks mid-answer: the client cannot
know whether it was applied).
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import httpx
import orjson

from tests.helpers import asgi_body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
_HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}


class Member:
    def __init__(self, target: str | None = None, role: str = "standby",
                 leader: str | None = None) -> None:
        self.target = target  # the real master a leader forwards to
        self.role, self.leader = role, leader
        self.url = ""  # set once served
        self.lock = threading.Lock()
        self.hits: list[tuple[str, str, int]] = []  # (method, path, status answered)
        self.drop_after_apply = 0

    def set(self, role: str, leader: str | None = None) -> None:
        with self.lock:
            self.role, self.leader = role, leader

    def refused(self, path_prefix: str = "/v1/") -> int:
        """How many requests under `path_prefix` it refused as a standby."""
        with self.lock:
            return sum(1 for _m, p, s in self.hits if s == 503 and p.startswith(path_prefix)
                       and p != "/v1/leader")

    def count(self, path_prefix: str) -> int:
        with self.lock:
            return sum(1 for _m, p, _s in self.hits if p.startswith(path_prefix))

    def _hit(self, method: str, path: str, status: int) -> None:
        with self.lock:
            self.hits.append((method, path, status))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method, path = scope["method"], scope["path"]
        body = await asgi_body(receive)
        with self.lock:
            role, leader = self.role, self.leader
        if path == "/healthz":
            return await self._answer(send, method, path, 200, {"status": "ok"})
        if path == "/v1/leader" and method == "GET":
            return await self._answer(send, method, path, 200, {
                "leader": self.url if role == "leader" else leader, "epoch": 1,
                "me": self.url, "role": role, "elector": "static"})
        if role != "leader" or self.target is None:
            headers = [(b"x-squall-leader", leader.encode())] if leader else []
            return await self._answer(send, method, path, 503, {
                "detail": f"standby of {leader} (lag 0 records)", "leader": leader}, headers)
        await self._forward(scope, send, method, path, body)

    async def _forward(self, scope: Scope, send: Send, method: str, path: str,
                       body: bytes) -> None:
        headers = [(k.decode(), v.decode()) for k, v in scope["headers"]
                   if k.decode().lower() not in _HOP]
        query = scope.get("query_string", b"").decode()
        url = f"{self.target}{path}" + (f"?{query}" if query else "")
        async with httpx.AsyncClient(timeout=30.0) as http:  # closed with its connections
            r = await http.request(method, url, headers=headers, content=body)
        self._hit(method, path, r.status_code)
        out = [(k.encode(), v.encode()) for k, v in r.headers.items() if k.lower() not in _HOP]
        with self.lock:
            drop = self.drop_after_apply > 0 and path.startswith("/v1/groups/")
            if drop:
                self.drop_after_apply -= 1
        out.append((b"content-length", str(len(r.content) + (100 if drop else 0)).encode()))
        await send({"type": "http.response.start", "status": r.status_code, "headers": out})
        if drop:  # cut the answer off: the client sees the connection break mid-answer
            await send({"type": "http.response.body", "body": r.content[:1],
                        "more_body": True})
            raise ConnectionResetError("the stand-in member drops this answer")
        await send({"type": "http.response.body", "body": r.content})

    async def _answer(self, send: Send, method: str, path: str, status: int, body: Any,
                      headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self._hit(method, path, status)
        data = orjson.dumps(body)
        await send({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode()), *(headers or [])]})
        await send({"type": "http.response.body", "body": data})
