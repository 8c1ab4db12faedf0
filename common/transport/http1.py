"""HTTP/1.1 without I/O, shared by both drivers (``sync.py`` on sockets, ``aio.py`` on asyncio
streams): the request head they send, the answer they read, and how an exchange fails.

- :func:`request_head`: the request line and the caller's headers as given (they name the
  Host), plus ``Content-Length`` for a body of known size (also 0 for a method that
  normally has a body) or ``Transfer-Encoding: chunked`` for a streamed one, unless the
  caller set either.
- :class:`Reader`: one answer, fed the bytes that arrive, parsed by llhttp (``httptools``,
  C). It skips interim (1xx) answers, at most :data:`MAX_INTERIM`; bounds the head and the
  trailers to :data:`MAX_HEAD_BYTES` each; knows the body's framing (``Content-Length``,
  chunked, or up to the connection's end: :meth:`Reader.eof`) and whether the connection
  may carry another exchange afterwards. A bare LF ends a line, as most clients allow.
  Anything else raises :class:`Malformed`; a connection that ends before the answer does
  raises :class:`Cut`. A body framed by ``Content-Length`` may be read by the driver
  itself once the head is in (:meth:`Reader.unfeed_body`, :meth:`Reader.got`): one
  allocation for a large payload instead of the parser's copies.
- :class:`Broken`: an exchange failed in a phase (``connect``: never sent; ``send``;
  ``read``), with its cause. Callers translate it once: the client into squall's error
  tree (``client/_http.py``), the httpx seam into httpx's exceptions (``adapters.py``), the
  data node into ``PeerUnreachable`` (``datanode/replication/peers.py``).
"""

from __future__ import annotations

from typing import Literal

import httptools

NO_BODY = ("GET", "HEAD", "DELETE", "OPTIONS")  # methods that send no Content-Length: 0
MAX_HEAD_BYTES = 64 << 10  # an answer's head (status line and headers) is at most this
COALESCE_BYTES = 64 << 10  # a body up to this goes out with its head in one send
MAX_INTERIM = 8  # interim (1xx) answers a reader skips before the answer, at most
Phase = Literal["connect", "send", "read"]


def request_head(method: str, target: str, headers: list[tuple[str, str]],
                 size: int | None) -> tuple[bytes, bool]:
    """The request's head, ending with its blank line, and whether the body goes chunked.
    `size`: the body's length (0: none), None for a body streamed in parts."""
    lines = [f"{method} {target} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in headers]
    lower = {k.lower(): v for k, v in headers}
    chunked = "chunked" in lower.get("transfer-encoding", "").lower() or (
        size is None and "content-length" not in lower)
    if chunked and "transfer-encoding" not in lower:
        lines.append("Transfer-Encoding: chunked")
    elif size is not None and "content-length" not in lower and (
            size or method not in NO_BODY):
        lines.append(f"Content-Length: {size}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), chunked


class Malformed(ValueError):
    """The answer is not HTTP/1.x, or broke one of the reader's bounds."""


class Cut(EOFError):
    """The connection ended before the answer did."""


class PoolBusy(TimeoutError):
    """Every connection the pool may hold stayed busy for the connect timeout."""


class Broken(Exception):
    """An exchange failed in `phase` (connect: never sent); the cause is ``__cause__``.
    `reused`: on a connection from the pool; `head`: before the answer's head was in."""

    def __init__(self, phase: Phase, cause: BaseException, reused: bool = False,
                 head: bool = True) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}" if str(cause)
                         else type(cause).__name__)
        self.phase, self.cause, self.reused, self.head = phase, cause, reused, head

    @property
    def timeout(self) -> bool:
        return isinstance(self.cause, TimeoutError)

    @property
    def eof(self) -> bool:
        """The peer hung up (or sent something that is not HTTP/1.1)."""
        return isinstance(self.cause, EOFError | ValueError | ConnectionError)


class _Extra(Exception):
    """Bytes after the answer's end (stops the parser; the connection is not reused)."""


class Reader:
    """One answer to a request made with `method`. Feed it what arrives (:meth:`feed`),
    tell it when the connection ended (:meth:`eof`); the body comes out of :meth:`take`.

    ``headed``: the answer's head is in (``status``, ``reason``, ``headers``). ``done``:
    the whole answer is in. ``keep``: the connection may carry another exchange once
    ``done``. ``length``: the body's size when ``Content-Length`` frames it, else None."""

    __slots__ = ("_head_only", "_interim", "_p", "_pre", "_quiet", "_size", "chunked",
                 "done", "headed", "headers", "keep", "length", "parts", "reason", "received",
                 "status")

    def __init__(self, method: str) -> None:
        p = httptools.HttpResponseParser(self)
        p.set_dangerous_leniencies(lenient_optional_cr_before_lf=True)
        self._p: httptools.HttpResponseParser | None = p
        self._head_only = method == "HEAD"
        self.status, self.reason = 0, ""
        self.headers: list[tuple[str, str]] = []
        self.headed = self.done = self.keep = self.chunked = False
        self.length: int | None = None
        self.parts: list[bytes] = []
        self.received = 0  # body bytes so far
        self._interim = self._size = self._pre = self._quiet = 0

    # -- fed by the driver -----------------------------------------------------------------
    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Parse what arrived; :class:`Malformed` if it is not a bounded HTTP/1.x answer."""
        p = self._p
        if p is None:
            if data:
                self.keep = False  # bytes nobody asked for: the stream is unknown
            return
        before = self.received
        try:
            p.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.done, self.keep = True, False  # 101: the connection is no longer HTTP
        except httptools.HttpParserCallbackError as e:
            cause = e.__context__
            if isinstance(cause, Malformed):
                raise cause from None
            if not isinstance(cause, _Extra):
                raise Malformed(str(e)) from e
        except httptools.HttpParserError as e:
            if self.done:  # junk after the answer
                self.keep = False
                return
            what = "answer" if self.headed else "HTTP/1.x answer head"
            raise Malformed(f"not an {what}: {e}") from None
        if self.done:
            self._p = None
        else:
            self._bound(len(data), self.received != before)

    def _bound(self, n: int, body: bool) -> None:
        """After a feed of `n` bytes that did not end the answer (`body`: some of them were
        body): a head or framing that grows without end, the callbacks seeing none of it,
        is malformed."""
        if not self.headed:
            self._pre += n
            if self._pre > 2 * MAX_HEAD_BYTES:
                raise Malformed(f"answer head over {MAX_HEAD_BYTES} bytes")
        elif self._head_only:
            self.done, self._p = True, None  # a HEAD answer's length names no body
        elif body:
            self._quiet = 0
        else:
            self._quiet += n  # framing without body: chunk lines, trailers
            if self._quiet > 2 * MAX_HEAD_BYTES:
                raise Malformed(f"trailers over {MAX_HEAD_BYTES} bytes")

    def eof(self) -> None:
        """The connection ended: the end of a body framed by it, else :class:`Cut`."""
        if self.done:
            return
        if self.headed and self.length is None and not self.chunked:
            self.done, self.keep, self._p = True, False, None
            return
        if not self.headed and not self._pre and not self._interim:
            raise Cut("Remote end closed connection without response")
        raise Cut("the connection ended before the answer did")

    def close(self) -> None:
        """Drop the parser (it refers back to the reader: a cycle the garbage collector
        would have to find, holding the body until then). Done by itself at the end."""
        self._p = None

    def take(self) -> list[bytes]:
        """The body's parts parsed since the last call."""
        parts, self.parts = self.parts, []
        return parts

    def unfeed_body(self) -> int:
        """Forget the body bytes parsed so far (call it after the :meth:`feed` that brought
        the head in: the driver reads them again itself, with :meth:`got`); how many there
        were."""
        n, self.received, self.parts = self.received, 0, []
        return n

    def got(self, n: int) -> None:
        """`n` body bytes of a ``Content-Length`` body were read by the driver (the parser
        is not fed again)."""
        self.received += n
        if self.length is not None and self.received >= self.length:
            self.done, self._p = True, None

    @property
    def remaining(self) -> int | None:
        """Body bytes still to come when ``Content-Length`` frames it, else None."""
        return None if self.length is None else self.length - self.received

    def header_dict(self) -> dict[str, str]:
        """The headers by lower-case name (the last of repeated ones)."""
        return {k.lower(): v for k, v in self.headers}

    # -- llhttp's callbacks ----------------------------------------------------------------
    def on_status(self, reason: bytes) -> None:
        if self.headed:
            self.keep = False
            raise _Extra
        self.reason = reason.decode("latin-1")
        self._size += len(reason) + 16

    def on_header(self, name: bytes, value: bytes) -> None:
        self._size += len(name) + len(value) + 4
        if self._size > MAX_HEAD_BYTES:
            what = "trailers" if self.headed else "answer head"
            raise Malformed(f"{what} over {MAX_HEAD_BYTES} bytes")
        if self.headed:
            return  # a trailer: skipped
        self.headers.append((name.decode("latin-1"), value.decode("latin-1")))
        n = len(name)
        if n == 14 and name.lower() == b"content-length":
            self.length = int(value)  # llhttp checked it: digits, never two that differ
        elif n == 17 and name.lower() == b"transfer-encoding" and b"chunked" in value.lower():
            self.chunked = True

    def on_headers_complete(self) -> None:
        if self.headed:
            self.keep = False
            raise _Extra
        p = self._p
        assert p is not None
        status = p.get_status_code()
        if 100 <= status < 200 and status != 101:  # interim: the answer follows
            self._interim += 1
            if self._interim > MAX_INTERIM:
                raise Malformed(f"more than {MAX_INTERIM} interim answers")
            self.headers, self.length, self.chunked, self._size = [], None, False, 0
            return
        self.status, self.headed, self._size = status, True, 0
        self.keep = p.should_keep_alive()  # False when the body runs to the end
        if self._head_only or status in (101, 204, 304):
            self.length, self.chunked = 0, False
        elif self.chunked:
            self.length = None

    def on_body(self, body: bytes) -> None:
        if self._head_only:
            self.keep = False  # a body to a HEAD request: the stream is unknown
            return
        self.parts.append(body)
        self.received += len(body)

    def on_message_complete(self) -> None:
        if self.headed:
            self.done = True
