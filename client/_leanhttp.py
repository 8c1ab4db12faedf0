"""The sync client's HTTP/1.1 transport: httpx's interface over the standard library's
``http.client`` (the client's own CPU bounds one-at-a-time work).

httpx's default sync transport (httpcore + h11, pure Python) costs about 1 ms of CPU per
small request on the project's 2-core machine; ``http.client`` (C-accelerated header
parsing, no per-event state machine) about 0.3 ms, measured against the master. This
transport keeps everything above it: httpx builds the request (auth, headers, timeouts),
decodes the response and raises httpx's exceptions, so the client's retry and error
mapping (``_http.py``) see exactly what they saw before.

:meth:`exchange` is the direct path (``_direct.py``): the same pool and failures for a
call that skips httpx's request and response objects. It writes the request and reads the
answer on the pooled connection's socket itself, with the head built and parsed by
``common/transport/http1.py`` (shared with the async transport): ``http.client``'s request and
header machinery (``email.parser``) cost ~100 µs of CPU per exchange, measured with 1 KiB
tasks, where the whole client spends ~170 µs per request without it.

- At most ``max_connections`` requests at once (the client's ``max_connections``): more
  wait, at most the connect timeout, then fail as never sent (``httpx.PoolTimeout``).
- Keep-alive pool per (scheme, host, port), at most ``max_idle`` idle connections each;
  an idle connection the server has closed (readable at EOF) is dropped before reuse, as
  httpcore does. Nothing is re-sent on failure: the client's retry policy decides.
- Request bodies: bytes, or an iterable (streamed: with Content-Length as given, else
  chunked). Responses stream, in reads of at most 8 MiB: the connection goes back to the
  pool once the body was read to its end, and is closed otherwise.
- TLS: ``HTTPSConnection`` with the client's SSL context (server name checked).
- TCP_NODELAY on every connection (see ``_http.NODELAY``).
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import ssl
import threading
from collections.abc import Iterable, Iterator
from typing import BinaryIO, cast

import httpx

from squall.client._direct import Direct, Plain
from squall.common.transport.http1 import (
    COALESCE_BYTES,
    MAX_HEAD_BYTES,
    MAX_INTERIM,
    Head,
    parse_head,
    request_head,
)

Key = tuple[str, str, int]
# a streamed body is handed up in reads of at most this: a payload up to 8 MiB in one
# piece (in 1 MiB parts, httpx joined a 4 MiB payload again: a copy and ~2,000 page
# faults per read on fresh memory, half the read's CPU)
CHUNK = 8 << 20
# A body (or chunk) declared at most this long is read in one allocation; a longer one in
# steps that double from READ_STEP, so a server that declares more than it sends makes the
# client allocate about twice what arrived, not what it declared (CPython's http.client
# does the same since gh-119451). Above ONE_READ_BYTES the steps cost one more copy.
ONE_READ_BYTES = 64 << 20
READ_STEP = 1 << 20


class LeanTransport(httpx.BaseTransport):
    def __init__(self, ssl_context: ssl.SSLContext, max_idle: int = 100,
                 max_connections: int | None = None) -> None:
        self.ssl_context, self.max_idle = ssl_context, max_idle
        self._slots = (threading.BoundedSemaphore(max_connections) if max_connections
                       else None)
        self._idle: dict[Key, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    # -- the pool ----------------------------------------------------------------------------
    def _take(self, key: Key, timeout: dict[str, float | None]) -> http.client.HTTPConnection:
        with self._lock:
            idle = self._idle.get(key, [])
            while idle:
                conn = idle.pop()
                if conn.sock is not None and not _readable(conn.sock):
                    return conn
                conn.close()  # closed by the server while idle (or sent us junk)
        scheme, host, port = key
        connect_s = timeout.get("connect")
        conn = (http.client.HTTPSConnection(host, port, timeout=connect_s,
                                            context=self.ssl_context)
                if scheme == "https" else http.client.HTTPConnection(host, port,
                                                                      timeout=connect_s))
        try:
            conn.connect()
        except TimeoutError as e:
            conn.close()
            raise httpx.ConnectTimeout(str(e) or "connect timed out") from e
        except (OSError, ssl.SSLError) as e:
            conn.close()
            raise httpx.ConnectError(str(e) or type(e).__name__) from e
        assert conn.sock is not None
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _give_back(self, key: Key, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            idle = self._idle.setdefault(key, [])
            if not self._closed and len(idle) < self.max_idle and conn.sock is not None:
                idle.append(conn)
                return
        conn.close()

    def _release(self) -> None:
        if self._slots is not None:
            self._slots.release()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = [c for idle in self._idle.values() for c in idle]
            self._idle.clear()
        for c in conns:
            c.close()

    # -- one exchange ------------------------------------------------------------------------
    def _open(self, key: Key, timeout: dict[str, float | None]) -> http.client.HTTPConnection:
        """A connection for one exchange, holding a slot (give both back when done)."""
        if self._slots is not None and not self._slots.acquire(timeout=timeout.get("connect")):
            raise httpx.PoolTimeout(f"all connections to {key[1]} stayed busy")
        try:
            conn = self._take(key, timeout)
        except BaseException:
            self._release()
            raise
        try:
            assert conn.sock is not None
            conn.sock.settimeout(timeout.get("read"))
        except BaseException:
            conn.close()
            self._release()
            raise
        return conn

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.scheme
        if scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported URL scheme {scheme!r}")
        key = (scheme, url.host, url.port or (443 if scheme == "https" else 80))
        conn = self._open(key, request.extensions.get("timeout", {}))
        try:
            target = url.raw_path.decode("ascii")
            chunked = request.headers.get("transfer-encoding", "").lower() == "chunked"
            body: bytes | Iterator[bytes]
            if isinstance(request.stream, httpx.ByteStream):
                body = request.read()
            else:
                body = iter(cast(Iterable[bytes], request.stream))
            with _mapped(conn, httpx.RemoteProtocolError):
                conn.request(request.method, target, body=body,
                             headers=dict(request.headers.multi_items()),
                             encode_chunked=chunked)
                resp = conn.getresponse()
        except BaseException:
            conn.close()
            self._release()
            raise
        return httpx.Response(resp.status, headers=resp.getheaders(),
                              stream=_Body(self, key, conn, resp),
                              extensions={"http_version": b"HTTP/1.1",
                                          "reason_phrase": resp.reason.encode("latin-1")})

    def exchange(self, d: Direct) -> Plain:
        """The direct path (``_direct.py``): one request, its answer read whole, on the
        pooled connection's socket (see the module doc)."""
        conn = self._open(d.key, d.timeout)
        sock = conn.sock
        assert sock is not None
        try:
            body = d.body or b""
            raw, _ = request_head(d.method, d.target, d.headers, len(body))
            with _mapped(conn, httpx.RemoteProtocolError):
                if len(body) <= COALESCE_BYTES:  # one send: a segment (and syscall) less
                    sock.sendall(raw + body)
                else:
                    sock.sendall(raw)
                    sock.sendall(body)
                with sock.makefile("rb") as fp:  # (closed: else the socket never closes)
                    head = _read_head(fp, d.method)
                    with _mapped(conn, httpx.ReadError):
                        content = _read_body(fp, head)
        except BaseException:
            conn.close()
            self._release()
            raise
        if head.keep:
            self._give_back(d.key, conn)
        else:
            conn.close()
        self._release()
        return Plain(head.status, head.header_dict(), content)


class _Body(httpx.SyncByteStream):
    def __init__(self, owner: LeanTransport, key: Key, conn: http.client.HTTPConnection,
                 resp: http.client.HTTPResponse) -> None:
        self.owner, self.key, self.conn, self.resp = owner, key, conn, resp
        self.done = False
        self.holds_slot = True

    def __iter__(self) -> Iterator[bytes]:
        with _mapped(self.conn, httpx.ReadError):
            while True:
                chunk = self.resp.read(CHUNK)
                if not chunk:
                    break
                yield chunk
        self.done = True

    def close(self) -> None:
        if self.done and self.resp.isclosed() and not self.resp.will_close:
            self.owner._give_back(self.key, self.conn)
        else:
            self.conn.close()
        self.done = False  # give back once
        if self.holds_slot:
            self.holds_slot = False
            self.owner._release()


@contextlib.contextmanager
def _mapped(conn: http.client.HTTPConnection, other: type[httpx.TransportError]
            ) -> Iterator[None]:
    """http.client's failures raised as httpx's; the connection is closed (unusable)."""
    try:
        yield
    except TimeoutError as e:
        conn.close()
        raise httpx.ReadTimeout(str(e) or "timed out") from e
    except (OSError, ValueError, http.client.HTTPException) as e:
        conn.close()
        raise other(f"{type(e).__name__}: {e}") from e


def _read_head(fp: BinaryIO, method: str) -> Head:
    """The answer's head, at most MAX_HEAD_BYTES; interim 1xx answers (at most
    MAX_INTERIM) are skipped."""
    for _ in range(MAX_INTERIM + 1):
        lines, size = [], 0
        while (line := fp.readline(MAX_HEAD_BYTES + 1)) not in (b"\r\n", b"\n"):
            if not line:  # as http.client says it
                raise http.client.RemoteDisconnected("Remote end closed connection without"
                                                     " response")
            size += len(line)
            if size > MAX_HEAD_BYTES:
                raise http.client.LineTooLong(f"answer head over {MAX_HEAD_BYTES} bytes")
            lines.append(line)
        head = parse_head(b"".join(lines), method)
        if not head.interim:
            return head
    raise http.client.HTTPException(f"more than {MAX_INTERIM} interim answers")


def _read_body(fp: BinaryIO, head: Head) -> bytes:
    if head.length is not None:
        return _read_exactly(fp, head.length)
    if not head.chunked:
        return fp.read()  # up to the connection's end
    parts: list[bytes] = []
    while True:
        line = fp.readline(MAX_HEAD_BYTES + 1)
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            _skip_trailers(fp)
            return b"".join(parts)
        parts.append(_read_exactly(fp, size))
        if fp.read(2) != b"\r\n":
            raise http.client.IncompleteRead(parts[-1], 0)


def _read_exactly(fp: BinaryIO, n: int) -> bytes:
    """`n` bytes, allocated as they arrive beyond ONE_READ_BYTES (see there)."""
    if n < 0:  # a chunk size of "-1" (Content-Length is digits only) would read to the end
        raise ValueError(f"negative chunk size {n}")
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
        raise http.client.IncompleteRead(data, n - len(data))
    return data


def _skip_trailers(fp: BinaryIO) -> None:
    """The trailer lines after the last chunk, at most MAX_HEAD_BYTES of them."""
    size = 0
    while (line := fp.readline(MAX_HEAD_BYTES + 1)) not in (b"\r\n", b"\n", b""):
        size += len(line)
        if size > MAX_HEAD_BYTES:
            raise http.client.LineTooLong(f"trailers over {MAX_HEAD_BYTES} bytes")


def _readable(sock: socket.socket) -> bool:
    try:
        r, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(r)
