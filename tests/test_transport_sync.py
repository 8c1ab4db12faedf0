"""The engine's blocking driver (common/transport/sync.py) behind httpx's interface
(adapters.SyncTransport) against a raw HTTP/1.1 server on 127.0.0.1: keep-alive reuse, an
idle connection the server closed, a response left half-read, chunked bodies both ways,
large bodies in one piece, and errors mapped to httpx's exceptions; for the direct path
(exchange: the answer read whole) also every answer framing, interim answers, and
malformed or cut-off answers."""

from __future__ import annotations

import select
import socket
import ssl
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from squall.common.transport import sync
from squall.common.transport.adapters import Direct, SyncTransport, to_httpx
from squall.common.transport.http1 import Broken
from tests.helpers import wait_for
from tests.rawhttp import Answer, RawServer, chunked_echo, ok


@pytest.fixture
def client() -> Iterator[Callable[[Answer], tuple[httpx.Client, RawServer]]]:
    made: list[tuple[httpx.Client, RawServer]] = []

    def make(answer: Answer) -> tuple[httpx.Client, RawServer]:
        srv = RawServer(answer)
        c = httpx.Client(base_url=srv.url, timeout=5,
                         transport=SyncTransport(ssl.create_default_context()))
        made.append((c, srv))
        return c, srv

    yield make
    for c, srv in made:
        c.close()
        srv.close()


def test_keep_alive_reuses_one_connection(client) -> None:  # type: ignore[no-untyped-def]
    c, srv = client(lambda req: ok(req.partition(b"\r\n\r\n")[2] or b"{}"))
    for i in range(20):
        assert c.post("/x", content=f'{{"i":{i}}}'.encode()).json() == {"i": i}
    assert srv.connections == 1


def test_an_idle_connection_the_server_closed_is_not_reused(client) -> None:  # type: ignore[no-untyped-def]
    c, srv = client(lambda req: ok())
    srv.hang_up_after = True  # answers, then closes the connection without saying so
    assert c.get("/a").json() == {"ok": True}
    pooled = [conn for pool in c._transport.pool._idle.values() for conn in pool]
    assert len(pooled) == 1
    wait_for(lambda: select.select([pooled[0].sock], [], [], 0)[0], timeout=5,
             what="the server's FIN")
    srv.hang_up_after = False
    assert c.get("/b").json() == {"ok": True}  # on a new connection, not the dead one
    assert srv.connections == 2 and len(srv.requests) == 2


def test_no_answer_is_an_error_never_a_silent_resend(client) -> None:  # type: ignore[no-untyped-def]
    c, srv = client(lambda req: ok())
    assert c.get("/a").json() == {"ok": True}
    srv.answer = lambda req: None  # reads the request, hangs up without answering
    with pytest.raises(httpx.RemoteProtocolError):
        c.post("/b", content=b"once")
    assert sum(b"/b" in r for r in srv.requests) == 1
    srv.answer = lambda req: ok()
    assert c.get("/c").json() == {"ok": True}
    assert srv.connections == 2


def test_half_read_responses_close_their_connection(client) -> None:  # type: ignore[no-untyped-def]
    big = b"x" * (1 << 20)
    c, srv = client(lambda req: ok(big) if b"/big" in req else ok())
    with c.stream("GET", "/big") as r:
        assert len(next(r.iter_raw())) > 0  # read a little, then leave
    assert c.get("/small").json() == {"ok": True}
    assert srv.connections == 2  # the half-read connection was not reused
    with c.stream("GET", "/big") as r:
        assert b"".join(r.iter_bytes()) == big
    assert c.get("/small").json() == {"ok": True}
    assert srv.connections == 2  # read to its end: back in the pool and reused


def test_a_payload_sized_body_comes_up_in_one_piece(client) -> None:  # type: ignore[no-untyped-def]
    """A 4 MiB body is one read, not parts joined again above: that join cost a copy and,
    with the allocator's fresh pages, ~2,000 page faults per 4 MiB payload read."""
    body = bytes(range(256)) * (4 << 12)  # 4 MiB
    c, _ = client(lambda req: ok(body, b"content-type: application/octet-stream\r\n"))
    with c.stream("GET", "/blob") as r:
        parts = list(r.iter_raw())
    assert len(parts) == 1 and parts[0] == body
    assert c.get("/blob").content == body


def test_chunked_both_ways(client) -> None:  # type: ignore[no-untyped-def]
    c, srv = client(chunked_echo)
    parts = [b"abc", b"", b"defgh" * 1000]
    r = c.post("/up", content=iter(parts))
    assert r.content == b"".join(parts)
    assert b"transfer-encoding: chunked" in srv.requests[-1].lower()
    assert c.post("/up", content=b"plain").content == b"plain"
    assert srv.connections == 1


def test_errors_are_httpx_errors(client) -> None:  # type: ignore[no-untyped-def]
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    t = SyncTransport(ssl.create_default_context())
    with httpx.Client(transport=t, timeout=2) as c, pytest.raises(httpx.ConnectError):
        c.get(f"http://127.0.0.1:{port}/")
    gate = threading.Event()  # the server holds its answer until the client gave up
    hang, _ = client(lambda req: ok() if gate.wait(10) else None)
    with pytest.raises(httpx.ReadTimeout):
        hang.get("/slow", timeout=httpx.Timeout(5, read=0.3))
    gate.set()
    with httpx.Client(transport=t) as c, pytest.raises(httpx.UnsupportedProtocol):
        c.get("ftp://127.0.0.1/")


def test_at_most_max_connections_requests_at_once() -> None:
    srv = RawServer(lambda req: ok())
    c = httpx.Client(base_url=srv.url, timeout=5, transport=SyncTransport(
        ssl.create_default_context(), max_connections=2))
    try:
        held = [c.send(c.build_request("GET", f"/{i}"), stream=True) for i in range(2)]
        with pytest.raises(httpx.PoolTimeout):  # both busy: never sent
            c.get("/2", timeout=httpx.Timeout(5, connect=0.05))
        assert len(srv.requests) == 2
        held[0].read()
        held[0].close()  # its slot is free again
        assert c.get("/3").json() == {"ok": True}
        held[1].close()
        assert [c.get(f"/{i}").status_code for i in range(4, 8)] == [200] * 4
    finally:
        c.close()
        srv.close()


# -- the direct path (SyncTransport.exchange): its own reads and writes on the socket ---------
def _direct(srv: RawServer, method: str = "GET", path: str = "/x", body: bytes | None = None,
            read_s: float = 5) -> Direct:
    port = int(srv.url.rsplit(":", 1)[1])
    return Direct(("http", "127.0.0.1", port), method, path,
                  [("Host", f"127.0.0.1:{port}")], body, {"connect": 5, "read": read_s})


FRAMINGS = {  # answer -> (status, body, the connection is reused afterwards)
    "length": (ok(b"0123456789"), 200, b"0123456789", True),
    "chunked": (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n"
                b"2\r\nde\r\n0\r\nx-trailer: " + b"t" * (20 << 10) + b"\r\n\r\n", 200, b"abcde",
                True),  # (a trailer longer than one buffered read: all of it is read)
    "to the end": (b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil EOF", 200,
                   b"until EOF", False),
    "HTTP/1.0": (b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", 200, b"ok", False),
    "interim 100": (b"HTTP/1.1 100 Continue\r\n\r\n" + ok(), 200, b'{"ok":true}', True),
    "no content": (b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n", 204, b"", True),
    "bare LF": (b"HTTP/1.1 200 OK\nx-a: 1\ncontent-length: 2\n\nok", 200, b"ok", True),
    "error status": (b"HTTP/1.1 404 Not Found\r\nx-a: 1\r\nx-b: 2\r\ncontent-length: 1\r\n\r\n?",
                   404, b"?", True),
}


@pytest.mark.parametrize("kind", sorted(FRAMINGS))
def test_direct_exchange_reads_every_framing(kind: str) -> None:
    raw, status, body, reused = FRAMINGS[kind]
    srv = RawServer(lambda req: raw)
    t = SyncTransport(ssl.create_default_context())
    try:
        for _ in range(2):
            got = t.exchange(_direct(srv, "POST", "/up", b"\x00\xff" * 10))
            assert (got.status_code, got.content) == (status, body)
        assert srv.connections == (1 if reused else 2)
        assert srv.requests[-1].lower().endswith(b"content-length: 20\r\n\r\n" + b"\x00\xff" * 10)
        head = t.exchange(_direct(srv, "HEAD"))  # a HEAD answer's length names no body
        assert head.status_code == status and head.content == b""
    finally:
        t.close()
        srv.close()


@pytest.mark.parametrize("one_read", [64 << 20, 1000])
def test_direct_exchange_bodies_of_a_payload_size_both_ways(
        one_read: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4 MiB body: sent after its head; read in one piece, or (over the one-read limit)
    in doubling steps, the same bytes either way."""
    monkeypatch.setattr(sync, "ONE_READ_BYTES", one_read)
    monkeypatch.setattr(sync, "READ_STEP", 100)
    blob = bytes(range(256)) * (4 << 12)
    srv = RawServer(lambda req: ok(req.partition(b"\r\n\r\n")[2]))
    t = SyncTransport(ssl.create_default_context())
    try:
        assert t.exchange(_direct(srv, "PUT", "/blob", blob)).content == blob
        assert t.exchange(_direct(srv, "GET", "/x")).content == b""
        assert srv.connections == 1 and b"content-length" not in srv.requests[-1].lower()
    finally:
        t.close()
        srv.close()


BROKEN = {  # answer -> the httpx error it maps to (the direct path raises Broken)
    "no answer": (None, httpx.RemoteProtocolError),
    "not HTTP": (b"SSH-2.0-OpenSSH\r\n\r\n", httpx.RemoteProtocolError),
    "bad length": (b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n", httpx.RemoteProtocolError),
    "head too long": (b"HTTP/1.1 200 OK\r\n" + b"x-pad: " + b"p" * (70 << 10) + b"\r\n\r\n",
                      httpx.RemoteProtocolError),
    "endless interim": (b"HTTP/1.1 100 Continue\r\n\r\n" * 9 + ok(), httpx.RemoteProtocolError),
    "short body": (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\nconnection: close\r\n\r\nabc",
                   httpx.ReadError),
    "bad chunk": (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n"
                  b"\r\nzz\r\n", httpx.ReadError),
    # declared, never sent: allocated as it arrives (never a MemoryError, or 1 TiB held)
    "huge length": (b"HTTP/1.1 200 OK\r\ncontent-length: 1099511627776\r\n"
                    b"connection: close\r\n\r\nabc", httpx.ReadError),
    "huge chunk": (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n"
                   b"\r\n10000000000\r\nabc", httpx.ReadError),
    "negative chunk": (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n-1\r\n"
                       b"abc", httpx.ReadError),  # (not a read to the connection's end)
    "endless trailers": (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\na\r\n"
                         b"0\r\n" + (b"x-t: " + b"t" * 4000 + b"\r\n") * 20 + b"\r\n",
                         httpx.ReadError),
}


@pytest.mark.parametrize("kind", sorted(BROKEN))
def test_direct_exchange_failures_map_to_httpx_errors_and_drop_the_connection(
        kind: str) -> None:
    raw, error = BROKEN[kind]
    srv = RawServer(lambda req: raw if b"/bad" in req else ok())
    t = SyncTransport(ssl.create_default_context())
    try:
        with pytest.raises(Broken) as e:
            t.exchange(_direct(srv, "GET", "/bad"))
        assert e.value.phase == "read" and type(to_httpx(e.value)) is error
        if kind == "no answer":  # the words http.client (httpx's path here) uses
            assert "Remote end closed connection without response" in str(e.value)
        assert sum(b"/bad" in r for r in srv.requests) == 1  # never resent
        assert t.exchange(_direct(srv)).content == b'{"ok":true}'
        assert srv.connections == 2  # the broken connection was not pooled
    finally:
        t.close()
        srv.close()


def test_direct_exchange_read_timeout() -> None:
    gate = threading.Event()
    srv = RawServer(lambda req: ok() if gate.wait(10) else None)
    t = SyncTransport(ssl.create_default_context())
    try:
        with pytest.raises(Broken) as e:
            t.exchange(_direct(srv, read_s=0.2))
        assert e.value.timeout and isinstance(to_httpx(e.value), httpx.ReadTimeout)
    finally:
        gate.set()
        t.close()
        srv.close()
