"""JSON over HTTP for the electors (``etcd.py``, ``kube.py``): one request, one bounded
JSON answer, through the engine's pool (``common/transport``), under one deadline.

Every failure to get an answer (connect, send, read, timeout, a body over the bound) is
:class:`Unreachable`; an answer with any status is returned as (status, parsed body), the
body ``None`` when it is not JSON.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any
from urllib.parse import urlsplit

import orjson

from squall.common.transport.aio import Broken, Pool

MAX_ANSWER = 1 << 20  # an elector's answers are small: a Lease, a key, a status


class Unreachable(Exception):
    """No answer came back (the request may or may not have been applied)."""


class JsonHttp:
    def __init__(self, tls: ssl.SSLContext | None = None, timeout_s: float = 2.0) -> None:
        self.pool = Pool(tls, idle_s=30.0, idle_per_key=4)
        self.timeout_s = timeout_s

    async def call(self, method: str, url: str, body: Any = None,
                   headers: dict[str, str] | None = None, content_type: str = "application/json"
                   ) -> tuple[int, Any]:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise Unreachable(f"not an http(s) URL: {url!r}")
        port = u.port or (443 if u.scheme == "https" else 80)
        target = (u.path or "/") + (f"?{u.query}" if u.query else "")
        hdrs = [("Host", f"{u.hostname}:{port}"), ("Accept", "application/json"),
                *(headers or {}).items()]
        content = None
        if body is not None:
            content = orjson.dumps(body)
            hdrs.append(("Content-Type", content_type))
        try:
            async with asyncio.timeout(self.timeout_s):
                r = await self.pool.request((u.scheme, u.hostname, port), method, target, hdrs,
                                            content, connect_timeout=self.timeout_s,
                                            write_timeout=self.timeout_s,
                                            read_timeout=self.timeout_s)
                try:
                    data = bytearray()
                    async for part in r.parts():
                        data += part
                        if len(data) > MAX_ANSWER:
                            raise Unreachable(f"{method} {url}: answer over {MAX_ANSWER} bytes")
                finally:
                    r.release()
        except (Broken, TimeoutError, OSError) as e:
            raise Unreachable(f"{method} {url}: {type(e).__name__}: {e}") from e
        try:
            parsed: Any = orjson.loads(bytes(data)) if data else None
        except orjson.JSONDecodeError:
            parsed = None
        return r.status, parsed

    def close(self) -> None:
        self.pool.close()
