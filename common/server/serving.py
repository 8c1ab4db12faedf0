"""Serving with uvicorn, hardened against slow and bloated request heads.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but waits forever for
a request's headers to finish, so a few hundred half-sent requests hold as many
connections open (slowloris), and it buffers a head of any size (httptools concatenates a
header value part by part: a head trickled in small reads costs CPU quadratic in its
size). :class:`HeaderDeadline` closes a connection whose headers do not complete within
``header_timeout_s`` of its first byte (or of the connection), and answers 431 and closes
one whose head grows past ``max_head_bytes`` or takes more than ``max_head_reads`` reads.

Only reads that begin and end inside a head are counted (a read holding the end of one
request's body and the start of the next head is not), so no legitimate head is refused;
a refused head has buffered at most ``max_head_bytes`` plus two reads (uvloop reads at most
256 KiB at once). The largest head squall itself sends is a node-to-node token covering
1,000 blob ids (~40 KB); a token is at most 256 KiB (``tokens.MAX_TOKEN_CHARS``). Bodies
have their own limit and deadline in :mod:`squall.common.server.guard` and
``common/server/http.py``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from squall.common.errors import HeadersTooLarge

HEADER_TIMEOUT_S = 10.0  # defaults; SQUALL_HEADER_TIMEOUT_S and SQUALL_MAX_HEADER_BYTES
MAX_HEAD_BYTES = 512 << 10  # set them when a server starts (uvicorn_options)
MAX_HEAD_READS = 64


class HeaderDeadline(HttpToolsProtocol):
    header_timeout_s = HEADER_TIMEOUT_S
    max_head_bytes = MAX_HEAD_BYTES
    max_head_reads = MAX_HEAD_READS
    _header_timer: asyncio.TimerHandle | None = None
    _in_head = False  # the parser is inside a request head
    _heads = 0  # heads completed on this connection
    _head_bytes = _head_reads = 0  # of the head in progress, counted as the module says

    def data_received(self, data: bytes) -> None:
        inside, heads = self._in_head, self._heads
        super().data_received(data)
        if not (inside and self._in_head and heads == self._heads):
            return  # this read was not all head
        self._head_bytes += len(data)
        self._head_reads += 1
        if self._head_bytes > self.max_head_bytes or self._head_reads > self.max_head_reads:
            self._head_too_large()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes, self._head_reads = True, 0, 0
        if self._header_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_head = False
        self._heads += 1
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _head_too_large(self) -> None:
        """Answer 431 and close; the parser stops with the connection."""
        self._disarm()
        self._in_head = False
        if self.transport.is_closing():
            return
        err = HeadersTooLarge(f"request head over {self.max_head_bytes} bytes or "
                              f"{self.max_head_reads} reads: send smaller headers (a token "
                              "covering many blob ids goes in the body of a batch call)")
        body = orjson.dumps(err.to_body())
        self.transport.write(b"".join([
            STATUS_LINE[431], b"content-type: application/json\r\n",
            b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body), body]))
        self.transport.close()

    def _too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def env_number(name: str, default: float, minimum: float) -> float:
    """A number from the environment, or `default` when unset; a value that is not a finite
    number >= `minimum` stops the server with a message saying so (SystemExit)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not minimum <= value < float("inf"):
        raise SystemExit(f"squall: {name}={raw[:40]!r} is not a number >= {minimum:g}; set "
                         f"it to one, or unset it for the default ({default:g})")
    return value


def uvicorn_options(tls_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `uvicorn.run` / `uvicorn.Config` options both servers use (read when a server
    starts: the head bounds' environment variables are checked here)."""
    HeaderDeadline.header_timeout_s = env_number("SQUALL_HEADER_TIMEOUT_S", HEADER_TIMEOUT_S,
                                                 0.1)
    HeaderDeadline.max_head_bytes = int(env_number("SQUALL_MAX_HEADER_BYTES", MAX_HEAD_BYTES,
                                                   1024))
    return {"loop": "uvloop", "http": HeaderDeadline, "access_log": False,
            "log_level": "warning", "lifespan": "on", "timeout_keep_alive": 5,
            **(tls_kwargs or {})}
