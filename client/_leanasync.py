"""The async client's HTTP/1.1 transport: httpx's interface over the shared asyncio core
(``common/transport/aio.py``, which the data nodes' peer client uses too).

httpx's default async transport (httpcore + h11 + anyio) was about a third of the async
``Worker``'s CPU per task (py-spy). This transport keeps everything above it:
httpx builds the request (auth, headers, timeouts from the request's extensions), decodes
the response and sees httpx's exceptions, so the client's retry and error mapping
(``_http.py``) see exactly what they saw before; failures map as ``_leanhttp.py`` maps
them (ConnectError / ConnectTimeout: never sent).

:meth:`exchange` is the direct path (``_direct.py``): the same pool and failures for a
call that skips httpx's request and response objects.

- At most ``max_connections`` requests at once (the client's ``max_connections``; more
  wait, at most the connect timeout).
- Keep-alive pool per (scheme, host, port), at most ``max_idle`` idle connections each;
  one the server closed while idle is dropped before reuse. Nothing is ever re-sent: the
  client's retry policy decides.
- Responses stream (parts of at most 1 MiB): the connection goes back to the pool once the
  body was read to its end, and is closed otherwise.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import httpx

from squall.client._direct import Direct, Plain
from squall.common.transport.aio import Broken, Pool, Response

IDLE_S = 4.0  # below uvicorn's 5 s keep-alive: a server rarely closes one under us


class LeanAsyncTransport(httpx.AsyncBaseTransport):
    def __init__(self, ssl_context: ssl.SSLContext, max_idle: int = 100,
                 idle_s: float = IDLE_S, max_connections: int | None = None) -> None:
        self.pool = Pool(ssl_context, idle_s, max_idle, max_connections)

    async def aclose(self) -> None:
        self.pool.close()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.scheme
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme!r}")
        if self.pool.closed:
            raise RuntimeError("the transport is closed")
        key = (scheme, url.host, url.port or (443 if scheme == "https" else 80))
        timeout: dict[str, float | None] = request.extensions.get("timeout", {})
        stream = request.stream
        content = (request.read() if isinstance(stream, httpx.ByteStream)
                   else stream)  # an AsyncByteStream: async-iterable parts
        try:
            r = await self.pool.request(
                key, request.method, url.raw_path.decode("ascii"),
                request.headers.multi_items(), content,  # type: ignore[arg-type]
                connect_timeout=timeout.get("connect"), write_timeout=timeout.get("write"),
                read_timeout=timeout.get("read"))
        except Broken as e:
            raise _mapped(e, head=True) from e
        return httpx.Response(r.status, headers=r.headers, stream=_Body(r),
                              extensions={"http_version": b"HTTP/1.1",
                                          "reason_phrase": r.reason.encode("latin-1")})

    async def exchange(self, d: Direct) -> Plain:
        """The direct path (``_direct.py``): one request, its answer read whole."""
        if self.pool.closed:
            raise RuntimeError("the transport is closed")
        try:
            r = await self.pool.request(
                d.key, d.method, d.target, d.headers, d.body,
                connect_timeout=d.timeout.get("connect"),
                write_timeout=d.timeout.get("write"), read_timeout=d.timeout.get("read"))
        except Broken as e:
            raise _mapped(e, head=True) from e
        try:
            content = await r.read()
        except Broken as e:
            raise _mapped(e, head=False) from e
        finally:
            r.release()
        return Plain(r.status, r.header_dict(), content)


class _Body(httpx.AsyncByteStream):
    def __init__(self, resp: Response) -> None:
        self.resp = resp

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self.resp.parts():
                yield part
        except Broken as e:
            raise _mapped(e, head=False) from e

    async def aclose(self) -> None:
        self.resp.release()


def _mapped(e: Broken, head: bool) -> httpx.TransportError:
    """The core's failure as httpx's (as ``_leanhttp._mapped``): connect failures were
    never sent; a broken answer head is a protocol error, a broken body a read error."""
    msg = str(e)
    if e.phase == "connect":
        return httpx.ConnectTimeout(msg) if e.timeout else httpx.ConnectError(msg)
    if e.phase == "send":
        return httpx.WriteTimeout(msg) if e.timeout else httpx.WriteError(msg)
    if e.timeout:
        return httpx.ReadTimeout(msg)
    return httpx.RemoteProtocolError(msg) if head else httpx.ReadError(msg)
