"""The data node's HTTP/1.1 client, for the replicate endpoints, the front door's master
calls and the heartbeat: the engine's asyncio driver (``common/transport/aio.py``), one
keep-alive pool per node process, answers read whole.

Every replicated write and every re-replication copy is one request to a peer's
``/v1/replicate`` endpoints. A general-purpose client (httpx: h11, httpcore and anyio
underneath) spent a millisecond or more of CPU on each and copied every body part once
more; the core writes the request head and the body parts (memoryviews of the sealed chunk
records, as they are) straight to the transport.

- Pooled connections are dropped after ``idle_s`` (shorter than uvicorn's 5 s keep-alive),
  so a peer rarely closes one under us; if it does, a request with a bytes body is retried
  once on a new connection unless ``replay=False`` (one whose body is a stream cannot be
  replayed: its failure is reported).
- Bodies that are async iterators are sent with their ``Content-Length`` header when the
  caller gives one, else chunked. A peer that answers before taking the whole body (an
  error: bad token, no space) is heard.
- Timeouts: ``connect_timeout`` to connect, ``timeout`` for each wait on the peer (a drain
  of the send buffer, the answer's head) and for the whole body. Failures raise
  :class:`PeerUnreachable`.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import orjson

from squall.common.transport.aio import Body, Broken, Pool

__all__ = ["Body", "PeerResponse", "PeerUnreachable", "Peers"]


class PeerUnreachable(Exception):
    """The request did not get an answer (connect, send or read failed, or timed out).
    `sent`: it may have reached the peer (it failed after connecting), so it may have
    been applied there."""

    def __init__(self, message: str, sent: bool = False) -> None:
        super().__init__(message)
        self.sent = sent


@dataclass
class PeerResponse:
    status_code: int
    headers: dict[str, str]  # lower-case names
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")

    def json(self) -> Any:
        return orjson.loads(self.content)


class Peers:
    def __init__(self, connect_timeout: float = 5.0, timeout: float = 60.0,
                 idle_s: float = 2.0, idle_per_peer: int = 32,
                 tls: ssl.SSLContext | None = None) -> None:
        self.connect_timeout, self.timeout = connect_timeout, timeout
        self.pool = Pool(tls, idle_s, idle_per_peer)

    @property
    def requests(self) -> int:
        return self.pool.requests

    @property
    def connects(self) -> int:
        return self.pool.connects

    async def aclose(self) -> None:
        self.pool.close()

    async def put(self, url: str, content: Body = None, headers: dict[str, str] | None = None
                  ) -> PeerResponse:
        return await self.request("PUT", url, content, headers)

    async def post(self, url: str, content: Body = None, headers: dict[str, str] | None = None,
                   replay: bool = True, connect_timeout: float | None = None,
                   timeout: float | None = None) -> PeerResponse:
        return await self.request("POST", url, content, headers, replay, connect_timeout,
                                  timeout)

    async def request(self, method: str, url: str, content: Body = None,
                      headers: dict[str, str] | None = None, replay: bool = True,
                      connect_timeout: float | None = None, timeout: float | None = None
                      ) -> PeerResponse:
        """`replay=False`: never resend, even on a reused connection that broke (the
        request may have been applied). `connect_timeout`, `timeout`: this call's, instead
        of the pool's."""
        connect_s = self.connect_timeout if connect_timeout is None else connect_timeout
        timeout_s = self.timeout if timeout is None else timeout
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise PeerUnreachable(f"unsupported peer URL {url!r} (http(s)://host:port only)")
        port = u.port or (443 if u.scheme == "https" else 80)
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        hdrs = [("Host", f"{u.hostname}:{port}"), *(headers or {}).items()]
        try:
            r = await self.pool.request((u.scheme, u.hostname, port), method, path, hdrs,
                                        content, connect_timeout=connect_s,
                                        write_timeout=timeout_s, read_timeout=timeout_s,
                                        replay=replay)
            try:
                async with asyncio.timeout(timeout_s):
                    body = await r.read()
            finally:
                r.release()
        except Broken as e:
            raise PeerUnreachable(f"{method} {url}: {e}", sent=e.phase != "connect") from e
        except TimeoutError as e:  # reading the body, after the answer's head
            raise PeerUnreachable(f"{method} {url}: TimeoutError: {e}", sent=True) from e
        return PeerResponse(r.status, r.header_dict(), body)
