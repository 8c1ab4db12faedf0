"""The engine behind httpx's interface, and the direct path that skips httpx.

httpx stays the public seam: a client given a ``transport=`` (``MockTransport``,
``ASGITransport``, a test's fault injector) sends through httpx as usual; by default its
httpx client sends through :class:`SyncTransport` or :class:`AsyncTransport`, this engine.
httpx builds the request (auth, headers, timeouts from the request's extensions) and
decodes the response; the engine sends, pools and frames. With httpx's default transports
(httpcore, h11, anyio: pure Python) a small request costs about twice the CPU it costs
through the engine (``bench/transport_cpu.py``).

:meth:`SyncTransport.exchange` / :meth:`AsyncTransport.exchange` are the direct path: a
:class:`Direct` (the request as plain values, built by ``client/_direct.py``) answered as a
:class:`Plain` read whole, on the same pool, skipping httpx's request and response objects
(~300 µs of CPU per small request above the engine). It raises the engine's
:class:`~squall.common.transport.http1.Broken`; the httpx path raises httpx's exceptions,
translated from it by :func:`to_httpx` (connect: ``ConnectError`` / ``ConnectTimeout`` /
``PoolTimeout``, never sent; a broken answer head: ``RemoteProtocolError``; a broken body:
``ReadError``; timeouts as httpx names them).

- At most ``max_connections`` requests hold a connection at once (the client's
  ``max_connections``); more wait, at most the connect timeout, then fail as never sent.
- Keep-alive pool per (scheme, host, port), at most ``max_idle`` idle connections each;
  one the server closed while idle is dropped before reuse. Nothing is re-sent: the
  client's retry policy decides.
- Responses stream (sync: pieces of at most 8 MiB, so a payload comes up in one piece;
  async: parts of at most 1 MiB): the connection goes back to the pool once the body was
  read to its end, and is closed otherwise.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import httpx

from squall.common.transport import aio, sync
from squall.common.transport.http1 import Broken, PoolBusy

Key = tuple[str, str, int]
IDLE_S = 4.0  # async: below uvicorn's 5 s keep-alive, a server rarely closes one under us

__all__ = ["AsyncTransport", "Direct", "Plain", "SyncTransport", "to_httpx"]


class Plain:
    """An answer read whole on the direct path: the parts of an ``httpx.Response`` that
    the client reads (headers by lower-case name)."""

    __slots__ = ("content", "headers", "status_code", "stream")

    def __init__(self, status: int, headers: dict[str, str], content: bytes) -> None:
        self.status_code, self.headers, self.content = status, headers, content
        self.stream: Any = None

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


@dataclass(frozen=True, slots=True)
class Direct:
    """One request as the engine sends it: (scheme, host, port), the request target, the
    headers (naming the Host), a body of bytes and httpx-style timeouts."""

    key: Key
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes | bytearray | memoryview | None
    timeout: dict[str, float | None]


def _key(url: httpx.URL) -> Key:
    scheme = url.scheme
    if scheme not in ("http", "https"):
        raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme!r}")
    return (scheme, url.host, url.port or (443 if scheme == "https" else 80))


def _extensions(reason: str) -> dict[str, Any]:
    return {"http_version": b"HTTP/1.1", "reason_phrase": reason.encode("latin-1")}


class SyncTransport(httpx.BaseTransport):
    """httpx's sync interface over :class:`squall.common.transport.sync.Pool`."""

    def __init__(self, ssl_context: ssl.SSLContext, max_idle: int = 100,
                 max_connections: int | None = None) -> None:
        self.pool = sync.Pool(ssl_context, max_idle, max_connections)

    def close(self) -> None:
        self.pool.close()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        key = _key(request.url)
        timeout: dict[str, float | None] = request.extensions.get("timeout", {})
        stream = request.stream
        content: sync.Body = (request.read() if isinstance(stream, httpx.ByteStream)
                              else cast(Iterable[bytes], stream))
        try:
            r = self.pool.request(key, request.method, request.url.raw_path.decode("ascii"),
                                  request.headers.multi_items(), content,
                                  connect_timeout=timeout.get("connect"),
                                  read_timeout=timeout.get("read"))
        except Broken as e:
            raise to_httpx(e) from e
        return httpx.Response(r.status, headers=r.headers, stream=_SyncBody(r),
                              extensions=_extensions(r.reason))

    def exchange(self, d: Direct) -> Plain:
        """The direct path: one request, its answer read whole (:class:`Broken` on
        failure)."""
        r = self.pool.request(d.key, d.method, d.target, d.headers, d.body,
                              connect_timeout=d.timeout.get("connect"),
                              read_timeout=d.timeout.get("read"))
        try:
            content = r.read()
        finally:
            r.release()
        return Plain(r.status, r.header_dict(), content)


class _SyncBody(httpx.SyncByteStream):
    """A response body for httpx; its connection is reused only if it was iterated to the
    end (a reader that left early may have left more than the engine saw)."""

    def __init__(self, resp: sync.Response) -> None:
        self.resp, self.ended = resp, False

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self.resp.parts()
        except Broken as e:
            raise to_httpx(e) from e
        self.ended = True

    def close(self) -> None:
        self.resp.keep = self.resp.keep and self.ended
        self.resp.release()


class AsyncTransport(httpx.AsyncBaseTransport):
    """httpx's async interface over :class:`squall.common.transport.aio.Pool`."""

    def __init__(self, ssl_context: ssl.SSLContext, max_idle: int = 100,
                 idle_s: float = IDLE_S, max_connections: int | None = None) -> None:
        self.pool = aio.Pool(ssl_context, idle_s, max_idle, max_connections)

    async def aclose(self) -> None:
        self.pool.close()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        key = _key(request.url)
        if self.pool.closed:
            raise RuntimeError("the transport is closed")
        timeout: dict[str, float | None] = request.extensions.get("timeout", {})
        stream = request.stream
        content: aio.Body = (request.read() if isinstance(stream, httpx.ByteStream)
                             else cast(AsyncIterable[bytes], stream))
        try:
            r = await self.pool.request(
                key, request.method, request.url.raw_path.decode("ascii"),
                request.headers.multi_items(), content,
                connect_timeout=timeout.get("connect"), write_timeout=timeout.get("write"),
                read_timeout=timeout.get("read"))
        except Broken as e:
            raise to_httpx(e) from e
        return httpx.Response(r.status, headers=r.headers, stream=_AsyncBody(r),
                              extensions=_extensions(r.reason))

    async def exchange(self, d: Direct) -> Plain:
        """The direct path: one request, its answer read whole (:class:`Broken` on
        failure)."""
        if self.pool.closed:
            raise RuntimeError("the transport is closed")
        r = await self.pool.request(
            d.key, d.method, d.target, d.headers, d.body,
            connect_timeout=d.timeout.get("connect"),
            write_timeout=d.timeout.get("write"), read_timeout=d.timeout.get("read"))
        try:
            content = await r.read()
        finally:
            r.release()
        return Plain(r.status, r.header_dict(), content)


class _AsyncBody(httpx.AsyncByteStream):
    """As :class:`_SyncBody`, for the async client."""

    def __init__(self, resp: aio.Response) -> None:
        self.resp, self.ended = resp, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self.resp.parts():
                yield part
        except Broken as e:
            raise to_httpx(e) from e
        self.ended = True

    async def aclose(self) -> None:
        self.resp.keep = self.resp.keep and self.ended
        self.resp.release()


def to_httpx(e: Broken) -> httpx.TransportError:
    """The engine's failure as httpx's: connect failures were never sent; a broken answer
    head is a protocol error, a broken body a read error."""
    msg = str(e)
    if e.phase == "connect":
        if isinstance(e.cause, PoolBusy):
            return httpx.PoolTimeout(msg)
        return httpx.ConnectTimeout(msg) if e.timeout else httpx.ConnectError(msg)
    if e.timeout:
        return httpx.WriteTimeout(msg) if e.phase == "send" else httpx.ReadTimeout(msg)
    if e.phase == "send":
        return httpx.WriteError(msg)
    return httpx.RemoteProtocolError(msg) if e.head else httpx.ReadError(msg)
