"""Node-to-node HTTP/1.1 client for the replicate endpoints: keep-alive connections per peer
over asyncio streams.

Every replicated write and every re-replication copy is one request to a peer's
``/v1/replicate`` endpoints. A general-purpose client (httpx: h11, httpcore and anyio
underneath) spent a millisecond or more of CPU on each and copied every body part once
more; this one writes the request head and the body parts (memoryviews of the sealed chunk
records, as they are) straight to the transport, and reads answers framed by
``Content-Length`` or chunked encoding, which is all the data nodes send.

- A connection goes back to its peer's pool when the answer was read whole, keep-alive was
  not refused and the body was sent whole. Pooled connections are dropped after
  ``idle_s`` (shorter than uvicorn's 5 s keep-alive), so a peer rarely closes one under us;
  if it does, a request with a bytes body is retried once on a new connection (one whose
  body is a stream cannot be replayed: its failure is reported).
- Bodies that are async iterators are sent with their ``Content-Length`` header when the
  caller gives one, else chunked. A peer that answers before taking the whole body (an
  error: bad token, no space) is heard: the answer is read even if the send broke off.
- Timeouts: ``connect_timeout`` to connect, ``timeout`` for each wait on the peer (a
  drain of the send buffer, the whole answer). Failures raise :class:`PeerUnreachable`.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections.abc import AsyncIterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

Body = bytes | bytearray | memoryview | AsyncIterable[bytes | bytearray | memoryview] | None


class PeerUnreachable(Exception):
    """The request did not get an answer (connect, send or read failed, or timed out)."""


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


@dataclass
class _Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = field(default_factory=time.monotonic)
    reused: bool = False


class Peers:
    def __init__(self, connect_timeout: float = 5.0, timeout: float = 60.0,
                 idle_s: float = 2.0, idle_per_peer: int = 32,
                 tls: ssl.SSLContext | None = None) -> None:
        self.connect_timeout, self.timeout = connect_timeout, timeout
        self.tls = tls  # for https:// peers: verifies them, presents our certificate
        self.idle_s, self.idle_per_peer = idle_s, idle_per_peer
        self._idle: dict[tuple[str, int, str], list[_Conn]] = {}
        self.requests = self.connects = 0

    async def aclose(self) -> None:
        for conns in self._idle.values():
            for c in conns:
                c.writer.close()
        self._idle.clear()

    async def put(self, url: str, content: Body = None, headers: dict[str, str] | None = None
                  ) -> PeerResponse:
        return await self.request("PUT", url, content, headers)

    async def post(self, url: str, content: Body = None, headers: dict[str, str] | None = None,
                   replay: bool = True) -> PeerResponse:
        return await self.request("POST", url, content, headers, replay)

    async def request(self, method: str, url: str, content: Body = None,
                      headers: dict[str, str] | None = None, replay: bool = True
                      ) -> PeerResponse:
        """`replay=False`: never resend, even on a reused connection that broke (the
        request may have been applied)."""
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise PeerUnreachable(f"unsupported peer URL {url!r} (http(s)://host:port only)")
        if u.scheme == "https" and self.tls is None:
            self.tls = ssl.create_default_context()
        key = (u.hostname, u.port or (443 if u.scheme == "https" else 80), u.scheme)
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        replayable = replay and (content is None
                                 or isinstance(content, bytes | bytearray | memoryview))
        self.requests += 1
        for attempt in range(2):
            conn = self._take(key)
            try:
                if conn is None:
                    conn = await self._connect(key)
                return await self._exchange(key, conn, method, path, content, headers or {})
            except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                    TimeoutError, ValueError) as e:
                if conn is not None:
                    conn.writer.close()
                if attempt == 0 and replayable and conn is not None and conn.reused:
                    continue  # the peer closed an idle connection as we reused it
                raise PeerUnreachable(f"{method} {url}: {type(e).__name__}: {e}") from e
            except BaseException:  # cancelled: the connection is in an unknown state
                if conn is not None:
                    conn.writer.close()
                raise
        raise AssertionError("unreachable")

    def _take(self, key: tuple[str, int, str]) -> _Conn | None:
        conns = self._idle.get(key)
        now = time.monotonic()
        while conns:
            c = conns.pop()
            if now - c.idle_since < self.idle_s and not c.writer.is_closing() \
                    and not c.reader.at_eof():
                c.reused = True
                return c
            c.writer.close()
        return None

    async def _connect(self, key: tuple[str, int, str]) -> _Conn:
        tls = self.tls if key[2] == "https" else None
        async with asyncio.timeout(self.connect_timeout):
            reader, writer = await asyncio.open_connection(
                key[0], key[1], limit=1 << 20, ssl=tls,
                server_hostname=key[0] if tls is not None else None)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connects += 1
        return _Conn(reader, writer)

    async def _exchange(self, key: tuple[str, int, str], conn: _Conn, method: str, path: str,
                        content: Body, headers: dict[str, str]) -> PeerResponse:
        w = conn.writer
        head = [f"{method} {path} HTTP/1.1", f"Host: {key[0]}:{key[1]}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        lower = {k.lower() for k in headers}
        size = (0 if content is None else len(content)
                if isinstance(content, bytes | bytearray | memoryview) else None)
        chunked = size is None and "content-length" not in lower
        if size is not None and "content-length" not in lower:
            head.append(f"Content-Length: {size}")
        if chunked:
            head.append("Transfer-Encoding: chunked")
        w.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        sent = True
        try:
            await self._send_body(w, content, chunked)
        except (ConnectionError, OSError):
            sent = False  # the peer may have answered early (an error): try to read it
        async with asyncio.timeout(self.timeout):
            resp, keep = await _read_response(conn.reader)
        if keep and sent and not w.is_closing():
            conn.idle_since, pool = time.monotonic(), self._idle.setdefault(key, [])
            if len(pool) < self.idle_per_peer:
                pool.append(conn)
            else:
                w.close()
        else:
            w.close()
        return resp


    async def _send_body(self, w: asyncio.StreamWriter, content: Body, chunked: bool) -> None:
        if isinstance(content, bytes | bytearray | memoryview):
            w.write(content)
        elif content is not None:
            async for part in content:
                if not part:
                    continue
                if chunked:
                    w.write(f"{len(part):x}\r\n".encode())
                w.write(part)
                if chunked:
                    w.write(b"\r\n")
                async with asyncio.timeout(self.timeout):
                    await w.drain()
            if chunked:
                w.write(b"0\r\n\r\n")
        async with asyncio.timeout(self.timeout):
            await w.drain()


async def _read_response(r: asyncio.StreamReader) -> tuple[PeerResponse, bool]:
    """(the answer, whether the connection may be reused)."""
    block = await r.readuntil(b"\r\n\r\n")
    lines = block[:-4].decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    status = int(rest[:3])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts = []
        while True:
            size = int((await r.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
            if size == 0:
                while (await r.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                break
            parts.append(await r.readexactly(size))
            await r.readexactly(2)
        content = b"".join(parts)
    elif "content-length" in headers:
        content = await r.readexactly(int(headers["content-length"]))
    elif status in (204, 304) or 100 <= status < 200:
        content = b""
    else:
        content, keep = await r.read(), False
    return PeerResponse(status, headers, content), keep
