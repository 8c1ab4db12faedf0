"""The engine's asyncio driver: keep-alive connections per (scheme, host, port) over asyncio
streams, for the async client (through ``adapters.AsyncTransport``) and the data nodes'
calls to peers and to the master (``datanode/replication/peers.py``). The framing is
``http1.py``'s, the same as the blocking driver's (``sync.py``).

A general-purpose stack (httpx: httpcore, h11 and anyio underneath) spends a millisecond or
so of CPU per request; this one writes the request head and the body parts (bytes or
memoryviews, as they are) straight to the transport and reads answers framed by
``Content-Length`` (read as it is, past the parser), chunked encoding or the connection's
end (through the parser).

- :meth:`Pool.request` sends a request and reads the answer's head; the body is read with
  :meth:`Response.parts` (parts of at most :data:`CHUNK` bytes) or :meth:`Response.read`,
  and :meth:`Response.release` puts the connection back in the pool when the body was read
  to its end, keep-alive was not refused and the request body was sent whole; otherwise it
  is closed.
- Pooled connections are dropped after ``idle_s``, once the server closed them (EOF seen
  while idle), or when the pool is used from another event loop than the one they were
  opened on (a client used by two ``asyncio.run`` calls in turn).
- ``max_active``: at most that many requests hold a connection at once (from sending to
  :meth:`Response.release`); more wait in turn, at most the connect timeout, then fail
  as a connect failure (never sent).
- ``replay=True``: a request whose reused connection broke before any answer (the server
  closed it as we reused it) is sent once more on a new connection, if its body is bytes
  (a stream cannot be replayed). Otherwise nothing is ever resent.
- Request bodies: bytes, or an async iterable sent with the caller's ``Content-Length``
  header, else chunked. A server that answers before taking the whole body (an error) is
  heard: the answer is read even if the send broke off.
- Failures raise :class:`Broken` naming the phase (connect, send, read) and its cause.
  TCP_NODELAY on every connection; TLS with the pool's SSL context (server name checked).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field

from squall.common.transport.http1 import (
    COALESCE_BYTES,
    Broken,
    PoolBusy,
    Reader,
    request_head,
)

Body = bytes | bytearray | memoryview | AsyncIterable[bytes | bytearray | memoryview] | None
Key = tuple[str, str, int]  # (scheme, host, port)
CHUNK = 1 << 20  # a streamed body is handed up in parts of at most this
HEAD_READ = 64 << 10  # the answer's head (and a small body with it) is read in these
_FAIL = (OSError, EOFError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
         TimeoutError, ValueError)

__all__ = ["CHUNK", "COALESCE_BYTES", "Body", "Broken", "Conn", "Key", "Pool", "Response"]


@dataclass
class Conn:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    loop: asyncio.AbstractEventLoop
    idle_since: float = field(default_factory=time.monotonic)
    reused: bool = False

    def close(self) -> None:
        """Close now, dropping what was not sent: a connection is closed when it broke,
        was cancelled, went unused or its answer was left unread, never with a request
        still to deliver (a graceful close waited for a peer that may no longer read)."""
        with contextlib.suppress(RuntimeError):  # its event loop is closed: so is it
            self.writer.transport.abort()


class Pool:
    def __init__(self, tls: ssl.SSLContext | None = None, idle_s: float = 2.0,
                 idle_per_key: int = 32, max_active: int | None = None) -> None:
        self.tls = tls  # for https://: verifies servers, presents our certificate if any
        self.idle_s, self.idle_per_key, self.max_active = idle_s, idle_per_key, max_active
        self._idle: dict[Key, list[Conn]] = {}
        self.active = 0  # requests holding a connection (counted with max_active only)
        self._waiting: deque[asyncio.Future[None]] = deque()
        self.requests = self.connects = 0
        self.closed = False

    def close(self) -> None:
        self.closed = True
        for conns in self._idle.values():
            for c in conns:
                c.close()
        self._idle.clear()

    def _take(self, key: Key) -> Conn | None:
        conns = self._idle.get(key)
        now = time.monotonic()
        loop = asyncio.get_running_loop()
        while conns:
            c = conns.pop()
            if now - c.idle_since < self.idle_s and c.loop is loop \
                    and not c.writer.is_closing() and not c.reader.at_eof():
                c.reused = True
                return c
            c.close()
        return None

    def _give_back(self, key: Key, conn: Conn) -> None:
        pool = self._idle.setdefault(key, [])
        if self.closed or len(pool) >= self.idle_per_key or conn.writer.is_closing():
            conn.close()
            return
        conn.idle_since = time.monotonic()
        pool.append(conn)

    async def _connect(self, key: Key, timeout: float | None) -> Conn:
        scheme, host, port = key
        tls = None
        if scheme == "https":
            if self.tls is None:
                self.tls = ssl.create_default_context()
            tls = self.tls
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_connection(
                    host, port, limit=CHUNK, ssl=tls,
                    server_hostname=host if tls is not None else None)
        except (OSError, TimeoutError, ssl.SSLError) as e:
            raise Broken("connect", e) from e
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.connects += 1
        return Conn(reader, writer, asyncio.get_running_loop())

    async def _acquire(self, timeout: float | None) -> None:
        if self.max_active is None:
            return
        while self._waiting and self._waiting[0].done():
            self._waiting.popleft()  # gave up waiting
        if self.active < self.max_active and not self._waiting:
            self.active += 1
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        try:
            async with asyncio.timeout(timeout):
                await fut  # a request that finished handed its slot over
        except BaseException as e:
            if fut.done() and not fut.cancelled():
                self._release()  # handed over as we gave up: pass it on
            if isinstance(e, TimeoutError):
                raise Broken("connect", PoolBusy(
                    f"all {self.max_active} connections stayed busy")) from e
            raise

    def _release(self) -> None:
        if self.max_active is None:
            return
        while self._waiting:
            fut = self._waiting.popleft()
            if fut.done():
                continue  # its wait timed out or was cancelled
            try:
                fut.set_result(None)
                return
            except RuntimeError:  # its event loop is closed
                continue
        self.active -= 1

    async def request(self, key: Key, method: str, target: str,
                      headers: list[tuple[str, str]], content: Body = None, *,
                      connect_timeout: float | None = None, write_timeout: float | None = None,
                      read_timeout: float | None = None, replay: bool = False) -> Response:
        """Send one request and read the answer's head. `headers` should name the Host;
        Content-Length / Transfer-Encoding are added when missing."""
        replayable = replay and (content is None
                                 or isinstance(content, bytes | bytearray | memoryview))
        self.requests += 1
        await self._acquire(connect_timeout)
        try:
            for attempt in range(2):
                conn = self._take(key)
                if conn is None:
                    conn = await self._connect(key, connect_timeout)
                try:
                    return await self._exchange(key, conn, method, target, headers, content,
                                                write_timeout, read_timeout)
                except Broken as e:
                    conn.close()
                    if attempt == 0 and replayable and conn.reused and e.eof:
                        continue  # the server closed an idle connection as we reused it
                    raise
                except BaseException:  # cancelled: the connection is in an unknown state
                    conn.close()
                    raise
            raise AssertionError("unreachable")
        except BaseException:
            self._release()
            raise

    async def _exchange(self, key: Key, conn: Conn, method: str, target: str,
                        headers: list[tuple[str, str]], content: Body,
                        write_timeout: float | None, read_timeout: float | None) -> Response:
        w = conn.writer
        size = (0 if content is None else len(content)
                if isinstance(content, bytes | bytearray | memoryview) else None)
        raw, chunked = request_head(method, target, headers, size)
        sent: Broken | None = None
        try:
            if size and size <= COALESCE_BYTES:  # one send: a segment (and syscall) less
                w.write(raw + bytes(content))  # type: ignore[arg-type]
                content = None
            else:
                w.write(raw)
            await _send_body(w, content, chunked, write_timeout)
        except _FAIL as e:
            sent = Broken("send", e, conn.reused)  # the server may have answered early
        reader = Reader(method)
        try:
            async with asyncio.timeout(read_timeout):
                while not reader.headed:
                    data = await conn.reader.read(HEAD_READ)
                    if data:
                        reader.feed(data)
                    else:
                        reader.eof()
        except _FAIL as e:
            reader.close()
            raise (sent or Broken("read", e, conn.reused, head=not reader.headed)) from e
        return Response(self, key, conn, reader, sent is None, read_timeout)


async def _send_body(w: asyncio.StreamWriter, content: Body, chunked: bool,
                     timeout: float | None) -> None:
    if isinstance(content, bytes | bytearray | memoryview):
        if content:
            w.write(content)
    elif content is not None:
        async for part in content:
            if not part:
                continue
            if chunked:
                w.write(b"%x\r\n" % len(part))
            w.write(part)
            if chunked:
                w.write(b"\r\n")
            async with asyncio.timeout(timeout):
                await w.drain()
        if chunked:
            w.write(b"0\r\n\r\n")
    async with asyncio.timeout(timeout):
        await w.drain()


class Response:
    """An answer whose head was read; read its body, then :meth:`release` it (always)."""

    def __init__(self, pool: Pool, key: Key, conn: Conn, reader: Reader, sent: bool,
                 timeout: float | None) -> None:
        self.pool, self.key, self.conn, self.timeout = pool, key, conn, timeout
        self.reader = reader
        self.status, self.reason, self.headers = reader.status, reader.reason, reader.headers
        self.keep = sent  # a request not sent whole leaves the stream unknown
        self._released = False

    def header_dict(self) -> dict[str, str]:
        headers: dict[str, str] = self.reader.header_dict()
        return headers

    async def parts(self) -> AsyncIterator[bytes]:
        """The body in parts of at most :data:`CHUNK` bytes; :class:`Broken` on failure.
        A body framed by ``Content-Length`` is read as it is, without the parser."""
        rd, r = self.reader, self.conn.reader
        try:
            for part in rd.take():
                yield part
            while not rd.done:
                left = rd.remaining
                if left is not None:
                    async with asyncio.timeout(self.timeout):
                        part = await r.readexactly(min(left, CHUNK))
                    rd.got(len(part))
                    yield part
                    continue
                async with asyncio.timeout(self.timeout):
                    data = await r.read(CHUNK)
                if data:
                    rd.feed(data)
                else:
                    rd.eof()
                for part in rd.take():
                    yield part
        except _FAIL as e:
            self.conn.close()
            raise Broken("read", e, self.conn.reused, head=False) from e

    async def read(self) -> bytes:
        """The whole body."""
        rd = self.reader
        if rd.done:  # the usual small answer: it came with the head
            return b"".join(rd.take())
        return b"".join([p async for p in self.parts()])

    def release(self) -> None:
        """Back to the pool if the body was read to its end (and keep-alive holds), else
        closed. Idempotent."""
        if self._released:
            return
        self._released = True
        self.reader.close()
        if self.reader.done and self.reader.keep and self.keep:
            self.pool._give_back(self.key, self.conn)
        else:
            self.conn.close()
        self.pool._release()
