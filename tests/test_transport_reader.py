"""The engine's answer reader (common/transport/http1.py, llhttp through httptools) and its
bounds: an oversized or endless head, bad chunk framing, too many interim answers and
endless trailers are a clear error, never a hang, whether the bytes come at once or
dribbled; framing, keep-alive and HEAD answers as HTTP/1.1 says. Then the same bounds
through both drivers and the client's error translation: a squall TransportError."""

from __future__ import annotations

import asyncio
import ssl

import pytest

from squall.client._effects import Call
from squall.client._http import transport_error
from squall.common.errors import TransportError
from squall.common.transport import aio, sync
from squall.common.transport.http1 import (
    MAX_HEAD_BYTES,
    MAX_INTERIM,
    Broken,
    Cut,
    Malformed,
    Reader,
)
from tests.rawhttp import RawServer, ok

CHUNKED = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


def _read(raw: bytes, method: str = "GET", step: int | None = None, eof: bool = False
          ) -> Reader:
    r = Reader(method)
    for i in range(0, len(raw), step or max(1, len(raw))):
        r.feed(raw[i:i + (step or len(raw))])
    if eof:
        r.eof()
    return r


@pytest.mark.parametrize("step", [None, 1, 7, 4096])
def test_framings_parse_the_same_in_any_pieces(step: int | None) -> None:
    r = _read(b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"abc", b"x-a: 1\r\n"), step=step)
    assert (r.status, r.done, r.keep, r.length) == (200, True, True, 3)
    assert b"".join(r.take()) == b"abc" and ("x-a", "1") in r.headers
    r = _read(CHUNKED + b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nx-t: 1\r\n\r\n", step=step)
    assert (r.done, r.keep, r.length, b"".join(r.take())) == (True, True, None, b"abcde")
    r = _read(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nto the end", step=step, eof=True)
    assert (r.done, r.keep, b"".join(r.take())) == (True, False, b"to the end")
    r = _read(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok", step=step)
    assert (r.done, r.keep) == (True, False)  # HTTP/1.0: no keep-alive
    r = _read(b"HTTP/1.1 200 OK\nx-a: 1\ncontent-length: 2\n\nok", step=step)  # bare LF
    assert (r.done, b"".join(r.take())) == (True, b"ok")


def test_a_head_answer_has_no_body_and_extra_bytes_spoil_the_connection() -> None:
    r = _read(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n", "HEAD")
    assert (r.done, r.keep, r.take()) == (True, True, [])
    r = _read(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n0123456789", "HEAD")
    assert (r.done, r.keep, r.take()) == (True, False, [])  # a body nobody asked for
    r = _read(ok(b"ok") + b"HTTP/1.1 200 OK\r\n")  # an answer nobody asked for
    assert (r.done, r.keep) == (True, False)
    r = _read(ok(b"ok") + b"junk")
    assert (r.done, r.keep) == (True, False)
    r = _read(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert (r.done, r.keep, r.length) == (True, True, 0)


@pytest.mark.parametrize("step", [None, 1000])
def test_an_oversized_head_is_malformed(step: int | None) -> None:
    big = b"HTTP/1.1 200 OK\r\nx-pad: " + b"p" * MAX_HEAD_BYTES + b"\r\n\r\n"
    with pytest.raises(Malformed, match="head over"):
        _read(big, step=step)
    many = b"HTTP/1.1 200 OK\r\n" + b"x-h: 0123456789\r\n" * 5000 + b"\r\n"
    with pytest.raises(Malformed, match="head over"):
        _read(many, step=step)
    fits = b"HTTP/1.1 200 OK\r\nx-pad: " + b"p" * (MAX_HEAD_BYTES - 100) + b"\r\n"
    assert _read(fits + b"content-length: 0\r\n\r\n", step=step).done


def test_a_head_dribbled_without_end_is_malformed_not_a_wait() -> None:
    r = Reader("GET")
    r.feed(b"HTTP/1.1 200 OK\r\nx-endless: ")
    with pytest.raises(Malformed, match="head over"):
        for _ in range(3 * MAX_HEAD_BYTES // 1000):
            r.feed(b"v" * 1000)  # one header value that never ends


@pytest.mark.parametrize("framing", [b"zz\r\n", b"-1\r\nabc", b"3\r\nabcXY", b"3 4\r\nabc"])
def test_bad_chunk_framing_is_malformed(framing: bytes) -> None:
    with pytest.raises(Malformed):
        _read(CHUNKED + framing)


def test_too_many_interim_answers_are_malformed() -> None:
    assert _read(b"HTTP/1.1 100 Continue\r\n\r\n" * MAX_INTERIM + ok()).done
    with pytest.raises(Malformed, match="interim"):
        _read(b"HTTP/1.1 100 Continue\r\n\r\n" * (MAX_INTERIM + 1) + ok())
    with pytest.raises(Malformed, match="interim"):  # dribbled: the same count
        _read(b"HTTP/1.1 103 Early Hints\r\n\r\n" * (MAX_INTERIM + 1) + ok(), step=5)


@pytest.mark.parametrize("step", [None, 100])
def test_trailers_are_bounded(step: int | None) -> None:
    t = b"x-t: " + b"t" * 4000 + b"\r\n"
    assert _read(CHUNKED + b"1\r\na\r\n0\r\n" + t * 4 + b"\r\n", step=step).done
    with pytest.raises(Malformed, match="trailers over"):
        _read(CHUNKED + b"1\r\na\r\n0\r\n" + t * 20 + b"\r\n", step=step)
    r = Reader("GET")
    r.feed(CHUNKED + b"1\r\na\r\n0\r\nx-endless: ")
    with pytest.raises(Malformed, match="trailers over"):
        for _ in range(3 * MAX_HEAD_BYTES // 1000):
            r.feed(b"v" * 1000)


def test_the_end_of_the_connection() -> None:
    with pytest.raises(Cut, match="without response"):
        Reader("GET").eof()
    with pytest.raises(Cut, match="before the answer did"):
        _read(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", eof=True)
    with pytest.raises(Cut):
        _read(CHUNKED + b"3\r\nabc\r\n", eof=True)
    with pytest.raises(Malformed):
        _read(b"SSH-2.0-OpenSSH\r\n\r\n")


def test_a_length_framed_body_can_be_read_past_the_parser() -> None:
    r = _read(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
    assert (r.headed, r.done, r.remaining) == (True, False, 7)
    assert r.unfeed_body() == 3 and r.take() == [] and r.remaining == 10
    r.got(10)
    assert r.done and r.keep


BAD = {
    "head too long": b"HTTP/1.1 200 OK\r\nx-pad: " + b"p" * (MAX_HEAD_BYTES + 10) + b"\r\n\r\n",
    "endless interim": b"HTTP/1.1 100 Continue\r\n\r\n" * (MAX_INTERIM + 1) + ok(),
    "bad chunk": CHUNKED + b"zz\r\n",
    "endless trailers": CHUNKED + b"1\r\na\r\n0\r\n" + (b"x-t: " + b"t" * 4000 + b"\r\n") * 20,
}


@pytest.mark.parametrize("kind", sorted(BAD))
def test_both_drivers_fail_a_bad_answer_as_a_squall_transport_error(kind: str) -> None:
    """A bad answer on a connection the server keeps open fails at once (not at the read
    timeout) as Broken, which the client translates into a TransportError that says the
    request may have been sent (not a ConnectError)."""
    srv = RawServer(lambda req: BAD[kind] if b"/bad" in req else ok())
    port = int(srv.url.rsplit(":", 1)[1])
    key, hdrs = ("http", "127.0.0.1", port), [("Host", f"127.0.0.1:{port}")]
    call = Call("GET", f"{srv.url}/bad")
    spool = sync.Pool(ssl.create_default_context())
    apool = aio.Pool()

    def sync_get() -> None:
        r = spool.request(key, "GET", "/bad", hdrs, read_timeout=30)
        try:
            r.read()
        finally:
            r.release()

    async def async_get() -> None:
        r = await apool.request(key, "GET", "/bad", hdrs, read_timeout=30)
        try:
            await r.read()
        finally:
            r.release()

    try:
        for run in (sync_get, lambda: asyncio.run(asyncio.wait_for(async_get(), 10))):
            with pytest.raises(Broken) as e:
                run()
            assert e.value.phase == "read" and not e.value.timeout
            err = transport_error(e.value, call, srv.url)
            assert type(err) is TransportError and "failed" in str(err)
        assert sum(b"/bad" in r for r in srv.requests) == 2  # once per driver, never resent
    finally:
        spool.close()
        apool.close()
        srv.close()
