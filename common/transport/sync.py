"""The engine's blocking driver: keep-alive connections per (scheme, host, port) over plain
sockets, for the sync client (through ``adapters.SyncTransport``) and anything else that
blocks. The framing is ``http1.py``'s, the same as the asyncio driver's (``aio.py``).

- :meth:`Pool.request` sends a request and reads the answer's head; the body is read with
  :meth:`Response.parts` (pieces of at most :data:`CHUNK` bytes) or :meth:`Response.read`
  (whole), and :meth:`Response.release` puts the connection back in the pool when the body
  was read to its end, keep-alive was not refused and the request body was sent whole;
  otherwise it is closed.
- At most ``max_idle`` idle connections per key; one the server has closed (readable at
  EOF, or sent something unasked) is dropped before reuse, as httpcore does.
- ``max_active``: at most that many requests hold a connection at once (from sending to
  :meth:`Response.release`); more wait, at most the connect timeout, then fail as never
  sent (:class:`~squall.common.transport.http1.PoolBusy`).
- ``replay=True``: a request whose reused connection broke before any answer is sent once
  more on a new connection, if its body is bytes. Otherwise nothing is ever resent.
- Request bodies: bytes (up to ``COALESCE_BYTES`` in the same send as the head), or an
  iterable sent with the caller's ``Content-Length`` header, else chunked. A server that
  answers before taking the whole body is heard.
- A body framed by ``Content-Length`` is read past the parser, in one allocation for up to
  :data:`ONE_READ_BYTES` (a 4 MiB payload is one piece: in parts, joining them again cost
  a copy and ~2,000 page faults per read), beyond that in steps that double from
  :data:`READ_STEP`, so a server that declares more than it sends makes the client
  allocate about twice what arrived, not what it declared (as CPython's ``http.client``
  does since gh-119451).
- The read timeout bounds every wait on the socket, sends included. TCP_NODELAY on every
  connection (a small request is written in one send, a larger one in two: Nagle's
  algorithm would hold the second ~0.3-0.5 ms on loopback); TLS with the pool's SSL
  context, the server name checked (SNI).
- Failures raise :class:`~squall.common.transport.http1.Broken` naming the phase.
"""

from __future__ import annotations

import contextlib
import io
import select
import socket
import ssl
import threading
from collections.abc import Iterable, Iterator
from typing import cast

from squall.common.transport.http1 import (
    COALESCE_BYTES,
    Broken,
    PoolBusy,
    Reader,
    request_head,
)

Key = tuple[str, str, int]  # (scheme, host, port)
Part = bytes | bytearray | memoryview
Body = Part | Iterable[Part] | None
CHUNK = 8 << 20  # a streamed body is handed up in pieces of at most this
ONE_READ_BYTES = 64 << 20  # a Content-Length body up to this is read in one allocation
READ_STEP = 1 << 20  # beyond, in steps that double from this
BUFFER = 64 << 10  # the socket's read buffer: a head and a small body in one read
_FAIL = (OSError, EOFError, TimeoutError, ValueError)

__all__ = ["CHUNK", "Body", "Key", "Pool", "Response"]


class Conn:
    __slots__ = ("reused", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.reused = sock, False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class Pool:
    def __init__(self, tls: ssl.SSLContext | None = None, max_idle: int = 100,
                 max_active: int | None = None) -> None:
        self.tls = tls  # for https://: verifies servers, presents our certificate if any
        self.max_idle = max_idle
        self._slots = threading.BoundedSemaphore(max_active) if max_active else None
        self.max_active = max_active
        self._idle: dict[Key, list[Conn]] = {}
        self._lock = threading.Lock()
        self.requests = self.connects = 0
        self.closed = False

    def close(self) -> None:
        with self._lock:
            self.closed = True
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for c in conns:
            c.close()

    def _take(self, key: Key) -> Conn | None:
        with self._lock:
            idle = self._idle.get(key)
            while idle:
                conn = idle.pop()
                if not _readable(conn.sock):
                    conn.reused = True
                    return conn
                conn.close()  # closed by the server while idle (or sent us junk)
        return None

    def _give_back(self, key: Key, conn: Conn) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if not self.closed and len(idle) < self.max_idle:
                idle.append(conn)
                return
        conn.close()

    def _release(self) -> None:
        if self._slots is not None:
            self._slots.release()

    def _connect(self, key: Key, timeout: float | None) -> Conn:
        scheme, host, port = key
        try:
            sock = socket.create_connection((host, port), timeout)
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if scheme == "https":
                    if self.tls is None:
                        self.tls = ssl.create_default_context()
                    sock = self.tls.wrap_socket(sock, server_hostname=host)
            except BaseException:
                sock.close()
                raise
        except (OSError, TimeoutError) as e:  # ssl.SSLError is an OSError
            raise Broken("connect", e) from e
        self.connects += 1
        return Conn(sock)

    def request(self, key: Key, method: str, target: str, headers: list[tuple[str, str]],
                content: Body = None, *, connect_timeout: float | None = None,
                read_timeout: float | None = None, replay: bool = False) -> Response:
        """Send one request and read the answer's head. `headers` should name the Host;
        Content-Length / Transfer-Encoding are added when missing."""
        replayable = replay and (content is None or isinstance(content, Part))
        self.requests += 1
        if self._slots is not None and not self._slots.acquire(timeout=connect_timeout):
            busy = PoolBusy(f"all {self.max_active} connections to {key[1]} stayed busy")
            raise Broken("connect", busy) from busy
        try:
            for attempt in range(2):
                conn = self._take(key) or self._connect(key, connect_timeout)
                try:
                    conn.sock.settimeout(read_timeout)
                    return _exchange(self, key, conn, method, target, headers, content,
                                     read_timeout)
                except Broken as e:
                    conn.close()
                    if attempt == 0 and replayable and conn.reused and e.eof:
                        continue  # the server closed an idle connection as we reused it
                    raise
                except BaseException:
                    conn.close()
                    raise
            raise AssertionError("unreachable")
        except BaseException:
            self._release()
            raise


def _exchange(pool: Pool, key: Key, conn: Conn, method: str, target: str,
              headers: list[tuple[str, str]], content: Body,
              timeout: float | None) -> Response:
    sock = conn.sock
    size = (0 if content is None else len(content) if isinstance(content, Part) else None)
    raw, chunked = request_head(method, target, headers, size)
    sent: Broken | None = None
    try:
        if isinstance(content, Part):
            if len(content) <= COALESCE_BYTES:  # one send: a segment (and syscall) less
                sock.sendall(raw + content if content else raw)
            else:
                sock.sendall(raw)
                sock.sendall(content)
        else:
            sock.sendall(raw)
            if content is not None:
                _send_parts(sock, content, chunked)
    except _FAIL as e:
        sent = Broken("send", e, conn.reused)  # the server may have answered early
    fp = cast(io.BufferedReader, sock.makefile("rb", buffering=BUFFER))
    reader = Reader(method)
    try:
        while not reader.headed:
            data = fp.peek(1)
            if not data:
                reader.eof()
            reader.feed(data)
            if reader.remaining and not reader.done:  # the body is read past the parser
                fp.read(len(data) - reader.unfeed_body())
            else:
                fp.read(len(data))
    except _FAIL as e:
        fp.close()
        reader.close()
        raise (sent or Broken("read", e, conn.reused, head=not reader.headed)) from e
    except BaseException:
        fp.close()  # (else the socket stays open: the file holds a reference)
        reader.close()
        raise
    return Response(pool, key, conn, fp, reader, sent is None, timeout)


def _send_parts(sock: socket.socket, parts: Iterable[Part], chunked: bool) -> None:
    for part in parts:
        if not part:
            continue
        if chunked:
            sock.sendall(b"%x\r\n" % len(part))
            sock.sendall(part)
            sock.sendall(b"\r\n")
        else:
            sock.sendall(part)
    if chunked:
        sock.sendall(b"0\r\n\r\n")


class Response:
    """An answer whose head was read; read its body, then :meth:`release` it (always)."""

    __slots__ = ("_released", "conn", "fp", "headers", "keep", "key", "pool", "reader",
                 "reason", "status", "timeout")

    def __init__(self, pool: Pool, key: Key, conn: Conn, fp: io.BufferedReader, reader: Reader,
                 sent: bool, timeout: float | None) -> None:
        self.pool, self.key, self.conn, self.fp, self.reader = pool, key, conn, fp, reader
        self.status, self.reason, self.headers = reader.status, reader.reason, reader.headers
        self.keep, self.timeout = sent, timeout  # a request not sent whole: stream unknown
        self._released = False

    def header_dict(self) -> dict[str, str]:
        headers: dict[str, str] = self.reader.header_dict()
        return headers

    def parts(self, limit: int | None = CHUNK) -> Iterator[bytes]:
        """The body in pieces of at most `limit` bytes (None: a ``Content-Length`` body in
        one); :class:`Broken` on failure."""
        rd, fp = self.reader, self.fp
        try:
            if rd.parts:
                yield b"".join(rd.take())
            while not rd.done:
                left = rd.remaining
                if left is not None:
                    piece = _read_exactly(fp, left if limit is None else min(left, limit))
                    rd.got(len(piece))
                    yield piece
                    continue
                data = fp.read1(limit or CHUNK)
                if data:
                    rd.feed(data)
                else:
                    rd.eof()
                if rd.parts:
                    yield b"".join(rd.take())
        except _FAIL as e:
            self.conn.close()
            raise Broken("read", e, self.conn.reused, head=False) from e

    def read(self) -> bytes:
        """The whole body (a ``Content-Length`` body in one allocation)."""
        rd = self.reader
        if rd.done:  # the usual small answer: it came with the head
            return b"".join(rd.take())
        return b"".join(list(self.parts(None)))

    def release(self) -> None:
        """Back to the pool if the body was read to its end (and keep-alive holds), else
        closed. Idempotent."""
        if self._released:
            return
        self._released = True
        self.reader.close()
        self.fp.close()  # (else the socket never closes: the file holds a reference)
        if self.reader.done and self.reader.keep and self.keep:
            self.pool._give_back(self.key, self.conn)
        else:
            self.conn.close()
        self.pool._release()


def _read_exactly(fp: io.BufferedReader, n: int) -> bytes:
    """`n` bytes, allocated as they arrive beyond ONE_READ_BYTES (see the module doc)."""
    if n <= ONE_READ_BYTES:
        data = fp.read(n) if n else b""
    else:
        parts, got, step = [], 0, READ_STEP
        while got < n and (part := fp.read(min(step, n - got))):
            parts.append(part)
            got += len(part)
            step *= 2
        data = b"".join(parts)
    if len(data) != n:
        raise EOFError(f"the connection ended {n - len(data)} bytes before the body did")
    return data


def _readable(sock: socket.socket) -> bool:
    try:
        r, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(r)
