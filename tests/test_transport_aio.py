"""The engine's asyncio driver (common/transport/aio.py; behind httpx: adapters.AsyncTransport)
against a raw HTTP/1.1 server on 127.0.0.1: keep-alive reuse, an idle connection the server closed,
no resend, a response left half-read, chunked and Content-Length bodies, a large body in
bounded parts, errors mapped to httpx's exceptions, TLS."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Callable, Iterator

import httpx
import pytest
import trustme

from squall.common.transport.adapters import AsyncTransport
from squall.common.transport.aio import CHUNK, COALESCE_BYTES, Body, Broken, Pool
from tests.helpers import until
from tests.rawhttp import Answer, RawServer, chunked_echo, ok

Make = Callable[..., tuple[httpx.AsyncClient, RawServer]]


@pytest.fixture
def client() -> Iterator[Make]:
    made: list[tuple[httpx.AsyncClient, RawServer]] = []

    def make(answer: Answer, tls: ssl.SSLContext | None = None,
             trust: ssl.SSLContext | None = None) -> tuple[httpx.AsyncClient, RawServer]:
        srv = RawServer(answer, tls)
        c = httpx.AsyncClient(base_url=srv.url, timeout=5, transport=AsyncTransport(
            trust or ssl.create_default_context()))
        made.append((c, srv))
        return c, srv

    yield make
    for _c, srv in made:
        srv.close()


def _pooled(c: httpx.AsyncClient) -> list:  # type: ignore[type-arg]
    t = c._transport
    assert isinstance(t, AsyncTransport)
    return [conn for pool in t.pool._idle.values() for conn in pool]


def echo(req: bytes) -> bytes:
    return ok(req.partition(b"\r\n\r\n")[2] or b"{}")


async def test_keep_alive_reuses_one_connection(client: Make) -> None:
    c, srv = client(echo)
    async with c:
        for i in range(20):
            assert (await c.post("/x", content=f'{{"i":{i}}}'.encode())).json() == {"i": i}
        assert (await c.get("/y")).json() == {}
    assert srv.connections == 1
    assert b"content-length" not in srv.requests[-1].lower()  # a GET has no body


async def test_a_small_body_goes_out_with_its_head_in_one_write(
        client: Make, monkeypatch: pytest.MonkeyPatch) -> None:
    """Head and body of a small request in one send (on loopback each send is a syscall
    that also runs the receiver's side of TCP); a large body is not copied to join it."""
    writes: list[int] = []
    real = asyncio.StreamWriter.write

    def counted(self: asyncio.StreamWriter, data: bytes) -> None:
        writes.append(len(data))
        real(self, data)

    monkeypatch.setattr(asyncio.StreamWriter, "write", counted)
    c, _ = client(echo)
    async with c:
        assert (await c.post("/x", content=b'{"i":1}')).json() == {"i": 1}
        assert len(writes) == 1
        writes.clear()
        big = b"x" * (COALESCE_BYTES + 1)
        assert (await c.post("/x", content=big)).content == big
        assert len(writes) == 2 and writes[1] == len(big)


async def test_an_idle_connection_the_server_closed_is_not_reused(client: Make) -> None:
    c, srv = client(lambda req: ok())
    async with c:
        srv.hang_up_after = True  # answers, then closes the connection without saying so
        assert (await c.get("/a")).json() == {"ok": True}
        [conn] = _pooled(c)
        await until(conn.reader.at_eof, timeout=5, what="the server's FIN")
        srv.hang_up_after = False
        assert (await c.post("/b", content=b"x")).json() == {"ok": True}  # a new connection
    assert srv.connections == 2 and len(srv.requests) == 2


async def test_no_answer_is_an_error_never_a_silent_resend(client: Make) -> None:
    c, srv = client(lambda req: ok())
    async with c:
        assert (await c.get("/a")).json() == {"ok": True}
        srv.answer = lambda req: None  # reads the request, hangs up without answering
        with pytest.raises(httpx.RemoteProtocolError):
            await c.post("/b", content=b"once")
        assert sum(b"/b" in r for r in srv.requests) == 1
        srv.answer = lambda req: ok()
        assert (await c.get("/c")).json() == {"ok": True}
    assert srv.connections == 2


async def test_half_read_responses_close_their_connection(client: Make) -> None:
    big = b"x" * (3 * CHUNK)
    c, srv = client(lambda req: ok(big) if b"/big" in req else ok())
    async with c:
        async with c.stream("GET", "/big") as r:
            async for part in r.aiter_raw():
                assert part
                break  # read a little, then leave
        assert not _pooled(c)
        assert (await c.get("/small")).json() == {"ok": True}
        assert srv.connections == 2  # the half-read connection was not reused
        async with c.stream("GET", "/big") as r:
            parts = [p async for p in r.aiter_raw()]
        assert b"".join(parts) == big
        assert max(map(len, parts)) <= CHUNK and len(parts) >= 3  # handed up in bounded parts
        assert (await c.get("/small")).json() == {"ok": True}
    assert srv.connections == 2  # read to its end: back in the pool and reused


async def _agen(parts: list[bytes]) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


async def test_chunked_both_ways_and_content_length_streams(client: Make) -> None:
    c, srv = client(chunked_echo)
    parts = [b"abc", b"", b"defgh" * 1000]
    whole = b"".join(parts)
    async with c:
        r = await c.post("/up", content=_agen(parts))
        assert r.content == whole
        assert b"transfer-encoding: chunked" in srv.requests[-1].lower()
        r = await c.post("/up", content=_agen(parts),
                         headers={"Content-Length": str(len(whole))})
        assert r.content == whole
        head = srv.requests[-1].lower().partition(b"\r\n\r\n")[0]
        assert b"content-length: %d" % len(whole) in head and b"chunked" not in head
        assert (await c.post("/up", content=b"plain")).content == b"plain"
    assert srv.connections == 1


async def test_errors_are_httpx_errors(client: Make) -> None:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there
    t = AsyncTransport(ssl.create_default_context())
    async with httpx.AsyncClient(transport=t, timeout=2) as c:
        with pytest.raises(httpx.ConnectError):
            await c.get(f"http://127.0.0.1:{port}/")
        with pytest.raises(httpx.UnsupportedProtocol):
            await c.get("ftp://127.0.0.1/")
    gate = threading.Event()  # the server holds its answer until the client gave up
    hang, _ = client(lambda req: ok() if gate.wait(10) else None)
    async with hang:
        with pytest.raises(httpx.ReadTimeout):
            await hang.get("/slow", timeout=httpx.Timeout(5, read=0.3))
    gate.set()


async def test_interim_answers_are_skipped(client: Make) -> None:
    """A 1xx answer before the answer is skipped (at most 8), so the reused connection
    never hands the next request an answer left over; more than 8 is an error."""
    def answer(req: bytes) -> bytes:
        path = req.split(b" ", 2)[1]
        n = 9 if path == b"/endless" else 2
        return b"HTTP/1.1 100 Continue\r\n\r\n" * n + ok(b'{"path":"%s"}' % path)

    c, srv = client(answer)
    async with c:
        for path in ("/a", "/b"):
            r = await c.get(path)
            assert (r.status_code, r.json()) == (200, {"path": path})
        with pytest.raises(httpx.TransportError):
            await c.get("/endless")
        assert (await c.get("/c")).json() == {"path": "/c"}
    assert srv.connections == 2


async def test_trailers_are_read_up_to_a_bound(client: Make) -> None:
    """Trailer lines after the last chunk are skipped, at most 64 KiB of them: beyond, the
    answer is a transport error and the connection is not reused."""
    def answer(req: bytes) -> bytes:
        n = 20 if b"/many" in req else 4
        return (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n"
                + (b"x-t: " + b"t" * 4000 + b"\r\n") * n + b"\r\n")

    c, srv = client(answer)
    async with c:
        assert (await c.get("/few")).content == b"ok"
        with pytest.raises(httpx.TransportError):
            await c.get("/many")
        assert (await c.get("/few")).content == b"ok"
    assert srv.connections == 2


async def test_tls_with_the_given_context(client: Make) -> None:
    ca = trustme.CA()
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_ctx)
    trust = ssl.create_default_context()
    ca.configure_trust(trust)
    c, srv = client(echo, tls=server_ctx, trust=trust)
    async with c:
        for i in range(3):
            assert (await c.post("/t", content=b'{"i":%d}' % i)).json() == {"i": i}
    assert srv.connections == 1
    stranger, srv2 = client(echo, tls=server_ctx)  # the system's CAs: not ours
    async with stranger:
        with pytest.raises(httpx.ConnectError):
            await stranger.get("/t")
    assert not srv2.requests


async def test_the_replay_rule_of_the_core() -> None:
    """A request whose reused connection broke before any answer is resent once on a new
    connection only when the caller allows it and its body is bytes."""
    hang_ups = [0]

    def answer(req: bytes) -> bytes | None:
        if b"/drop" in req and hang_ups[0] == 0:
            hang_ups[0] += 1
            return None  # as if the server closed the idle connection as we reused it
        return ok()

    srv = RawServer(answer)
    pool = Pool(max_active=4)
    key = ("http", "127.0.0.1", int(srv.url.rsplit(":", 1)[1]))
    host = [("Host", f"127.0.0.1:{key[2]}")]

    async def call(path: str, content: Body, replay: bool) -> int:
        r = await pool.request(key, "POST", path, host, content, replay=replay)
        await r.read()
        r.release()
        return r.status

    try:
        assert await call("/warm", b"", replay=True) == 200  # one pooled connection
        assert await call("/drop", b"x", replay=True) == 200  # resent on a new one
        assert sum(b"/drop" in r for r in srv.requests) == 2
        for replay, body in ((False, b"x"), (True, _agen([b"x"]))):
            hang_ups[0] = 0
            with pytest.raises(Broken):
                await call("/drop", body, replay=replay)
            assert hang_ups[0] == 1
            assert await call("/warm", b"", replay=True) == 200
        assert sum(b"/drop" in r for r in srv.requests) == 4  # the last two: sent once
    finally:
        pool.close()
        srv.close()


def _get_headers(srv: RawServer) -> tuple[tuple[str, str, int], list[tuple[str, str]]]:
    port = int(srv.url.rsplit(":", 1)[1])
    return ("http", "127.0.0.1", port), [("Host", f"127.0.0.1:{port}")]


async def test_at_most_max_active_requests_hold_a_connection() -> None:
    srv = RawServer(lambda req: ok())
    pool = Pool(max_active=2)
    key, hdrs = _get_headers(srv)
    try:
        r1 = await pool.request(key, "GET", "/1", hdrs)
        r2 = await pool.request(key, "GET", "/2", hdrs)
        third = asyncio.create_task(pool.request(key, "GET", "/3", hdrs, connect_timeout=30))
        await until(lambda: len(pool._waiting) == 1, timeout=5, what="the third waits")
        assert not third.done() and len(srv.requests) == 2
        await r1.read()
        r1.release()  # its slot (and its connection) go to the third
        r3 = await third
        assert r3.status == 200 and srv.connections == 2
        with pytest.raises(Broken) as e:  # no slot within the connect timeout: never sent
            await pool.request(key, "GET", "/4", hdrs, connect_timeout=0.05)
        assert e.value.phase == "connect" and len(srv.requests) == 3
        r2.release()
        r3.release()
        assert pool.active == 0
        r4 = await pool.request(key, "GET", "/5", hdrs)
        r4.release()
        assert pool.active == 0
    finally:
        pool.close()
        srv.close()


def test_a_pool_used_from_another_event_loop_opens_a_new_connection() -> None:
    srv = RawServer(lambda req: ok())
    pool = Pool(max_active=4)
    key, hdrs = _get_headers(srv)

    async def get() -> int:
        r = await pool.request(key, "GET", "/", hdrs)
        await r.read()
        r.release()
        return r.status

    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        assert first.run_until_complete(get()) == 200
        assert second.run_until_complete(get()) == 200  # not the first loop's connection
        assert srv.connections == 2 and pool.active == 0
        first.run_until_complete(asyncio.sleep(0))  # the discarded connection's close runs
    finally:
        second.run_until_complete(asyncio.sleep(0))
        pool.close()
        second.run_until_complete(asyncio.sleep(0))
        first.close()
        second.close()
        srv.close()


async def test_a_connection_closed_with_unsent_bytes_is_closed_at_once() -> None:
    """A connection is closed when it is broken, cancelled or its answer was not read: what
    it has not sent yet is dropped, and its socket closes now. (Closing it gracefully
    waited for a peer that no longer reads: the socket stayed open, and was reported as
    an unclosed transport when the event loop ended first.)"""
    accepted: list[asyncio.StreamWriter] = []

    async def never_reads(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        accepted.append(w)

    server = await asyncio.start_server(never_reads, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        conn = await Pool()._connect(("http", "127.0.0.1", port), 5)
        conn.writer.write(b"x" * (64 << 20))  # more than the socket buffers take
        assert conn.writer.transport.get_write_buffer_size() > 0
        conn.close()
        await asyncio.wait_for(conn.writer.wait_closed(), 5)
    finally:
        for w in accepted:
            w.transport.abort()
        server.close()
        await server.wait_closed()


async def test_a_slow_reader_of_a_streamed_body_is_not_timed_out(client: Make) -> None:
    """The read timeout bounds each wait on the server, not the caller's time between
    parts."""
    big = b"x" * (3 * CHUNK)
    c, _ = client(lambda req: ok(big))
    async with c:
        async with c.stream("GET", "/big", timeout=httpx.Timeout(5, read=0.2)) as r:
            got = []
            async for part in r.aiter_raw():
                got.append(part)
                await asyncio.sleep(0.3)  # longer than the read timeout
        assert b"".join(got) == big
