"""Request heads are bounded (common/server/serving.py): a head that grows past the byte bound, or
arrives in more reads than the read bound, is answered 431 and its connection closed;
legitimate heads (a large token, a head that starts in the read that ends a pipelined body)
pass. The protocol is fed reads of chosen sizes through a fake transport, so the counting is
tested exactly; one test sends an oversized head over a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from typing import Any

import httpx
import orjson
import pytest
import uvicorn
from uvicorn.server import ServerState

from squall.common.server.serving import (
    HEADER_TIMEOUT_S,
    MAX_HEAD_BYTES,
    HeaderDeadline,
    uvicorn_options,
)
from squall.master.http.app import create_master_app
from squall.master.service import MasterSettings
from tests.helpers import running_app, until


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out = b""
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def _ok(scope: Any, receive: Any, send: Any) -> None:
    """Answers 200 with the size of the request's body and of its X-Big header."""
    n = 0
    while True:
        msg = await receive()
        n += len(msg.get("body", b""))
        if not msg.get("more_body"):
            break
    big = dict(scope["headers"]).get(b"x-big", b"")
    body = b"%d %d" % (n, len(big))
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _protocol() -> tuple[HeaderDeadline, _Transport]:
    config = uvicorn.Config(_ok, lifespan="off", log_level="warning")
    config.load()
    p = HeaderDeadline(config=config, server_state=ServerState(), app_state={},
                       _loop=asyncio.get_running_loop())
    t = _Transport()
    p.connection_made(t)
    return p, t


def _feed(p: HeaderDeadline, t: _Transport, reads: list[bytes]) -> int:
    """Feed `reads` until the connection closes; how many were fed."""
    for i, r in enumerate(reads):
        if t.closed:
            return i
        p.data_received(r)
    return len(reads)


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def _431(t: _Transport) -> dict[str, Any]:
    head, _, body = t.out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431"), t.out[:200]
    assert t.closed
    return orjson.loads(body)["error"]  # type: ignore[no-any-return]


async def test_a_head_over_the_byte_bound_is_refused() -> None:
    p, t = _protocol()
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (2 * MAX_HEAD_BYTES)
    reads = _pieces(head, 100 << 10)
    fed = _feed(p, t, reads)
    err = _431(t)
    assert err["code"] == "headers_too_large" and "smaller headers" in err["message"]
    # the first read is not counted (it began outside a head): cut once the rest passed it
    assert fed == 1 + MAX_HEAD_BYTES // (100 << 10) + 1 < len(reads)


async def test_a_head_trickled_in_many_reads_is_refused() -> None:
    p, t = _protocol()
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
    fed = _feed(p, t, _pieces(head, 10))
    _431(t)
    assert fed == 1 + HeaderDeadline.max_head_reads + 1


async def test_large_legitimate_heads_pass() -> None:
    """A 300 KiB header (a token covering thousands of blob ids) in 40 reads reaches the app."""
    p, t = _protocol()
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * (300 << 10) + b"\r\n\r\n"
    reads = _pieces(head, len(head) // 40 + 1)
    assert _feed(p, t, reads) == len(reads)
    await until(lambda: t.out.endswith(b"0 %d" % (300 << 10)), 10, what="the answer")
    assert t.out.startswith(b"HTTP/1.1 200") and not t.closed


async def test_a_read_ending_a_body_and_starting_a_head_is_not_counted() -> None:
    """Pipelined: one read holds the end of a 1 MiB body and the start of the next head,
    then the next head trickles in. Only the reads that are all head count, so both
    requests are answered."""
    p, t = _protocol()
    body = b"x" * (2 * MAX_HEAD_BYTES)
    first = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
    second = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"c" * 1000 + b"\r\n\r\n"
    reads = [first + body[:1000], body[1000:] + second[:20], *_pieces(second[20:], 50)]
    assert len(reads) - 2 < HeaderDeadline.max_head_reads
    assert _feed(p, t, reads) == len(reads)
    await until(lambda: t.out.count(b"HTTP/1.1 200") == 2, 10, what="both answers")
    assert b"%d 0" % len(body) in t.out and b"0 1000" in t.out and not t.closed


async def test_counting_starts_again_with_each_head() -> None:
    """Two requests on one connection, each head in 40 reads: 80 reads of head in all,
    over the bound for one head, but each head is counted on its own."""
    p, t = _protocol()
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"d" * 400 + b"\r\n\r\n"
    for n in (1, 2):
        assert _feed(p, t, _pieces(head, len(head) // 40 + 1)) > 0
        await until(lambda n=n: t.out.count(b"HTTP/1.1 200") == n, 10, what="the answer")
    assert not t.closed


def test_an_oversized_head_over_a_socket_is_cut_early(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A master with a 30 s header deadline: a 4 MiB head is cut within seconds (431, or a
    reset when the server closes with unread bytes), and the master keeps serving."""
    app = create_master_app(MasterSettings(data_dir=str(tmp_path / "m"),
                                           require_receipts=False))

    class Slow(HeaderDeadline):
        header_timeout_s = 30.0

    with running_app(app, lifespan="on", http=Slow) as url:
        port = int(url.rsplit(":", 1)[1])
        head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"e" * (4 << 20)
        got, t0 = b"", time.monotonic()
        with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
            def send() -> None:
                with contextlib.suppress(OSError):  # the server closed it: expected
                    s.sendall(head)

            sender = threading.Thread(target=send, daemon=True)
            sender.start()
            try:
                while chunk := s.recv(65536):
                    got += chunk
            except ConnectionResetError:
                pass  # closed with our unread bytes in its buffer: the kernel resets
            sender.join(20)
        assert time.monotonic() - t0 < 15, "cut by the header deadline, not the size bound"
        assert got == b"" or got.startswith(b"HTTP/1.1 431"), got[:200]
        with httpx.Client(base_url=url, timeout=10) as c:
            assert c.get("/healthz").status_code == 200


def test_head_bounds_from_the_environment_are_checked_at_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The head bounds' environment variables are read when a server starts; a value that
    is not a number stops it with a message naming the variable, not a traceback."""
    monkeypatch.setattr(HeaderDeadline, "header_timeout_s", HeaderDeadline.header_timeout_s)
    monkeypatch.setattr(HeaderDeadline, "max_head_bytes", HeaderDeadline.max_head_bytes)
    monkeypatch.setenv("SQUALL_HEADER_TIMEOUT_S", "2.5")
    monkeypatch.setenv("SQUALL_MAX_HEADER_BYTES", "65536")
    assert uvicorn_options()["http"] is HeaderDeadline
    assert (HeaderDeadline.header_timeout_s, HeaderDeadline.max_head_bytes) == (2.5, 65536)
    for name, bad in (("SQUALL_HEADER_TIMEOUT_S", "ten"), ("SQUALL_HEADER_TIMEOUT_S", "0"),
                      ("SQUALL_MAX_HEADER_BYTES", "inf"), ("SQUALL_MAX_HEADER_BYTES", "1e2")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(SystemExit, match=f"{name}='{bad}' is not a number"):
            uvicorn_options()
        monkeypatch.delenv(name)
    uvicorn_options()  # unset: the defaults
    assert (HeaderDeadline.header_timeout_s, HeaderDeadline.max_head_bytes) == (
        HEADER_TIMEOUT_S, MAX_HEAD_BYTES)
