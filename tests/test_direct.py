"""The clients' direct path (client/_direct.py): a call that skips httpx's request and
response objects sends what httpx's path sends (request line, Host, Authorization for the
master only, Content-Type, Content-Length, the call's headers, the body), answers and
fails as httpx's path does, and is taken only when nothing about the call needs httpx.
Both drivers, against a raw HTTP/1.1 server on 127.0.0.1 that records every request."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from squall.client._async import _AsyncDriver
from squall.client._direct import Shortcut
from squall.client._effects import Call, Reply
from squall.client._http import MasterAuth
from squall.client._syncdriver import Driver
from squall.common.errors import ServerError, StatusError, TransportError, Unavailable
from squall.common.transport.adapters import AsyncTransport, SyncTransport
from tests.rawhttp import RawServer

TOKEN = "s3cret-credential"
SENT = ("host", "authorization", "content-type", "content-length", "x-squall-crc32c",
        "x-squall-token")


def answer(raw: bytes) -> bytes | None:
    line = raw.split(b"\r\n", 1)[0]
    if b"/hang-up" in line:
        return None
    if b"/busy" in line:
        body = orjson.dumps({"error": {"code": "unavailable", "message": "try later"}})
        return (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                b"retry-after: 2\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    if b"/html" in line:
        return b"HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: 5\r\n\r\n<b>x!"
    body = raw.partition(b"\r\n\r\n")[2]
    out = orjson.dumps({"echo": len(body), "line": line.decode()})
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-squall-crc32c: 7\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(out), out))


@pytest.fixture
def servers() -> Iterator[tuple[RawServer, RawServer]]:
    master, node = RawServer(answer), RawServer(answer)
    yield master, node
    master.close()
    node.close()


def run(kind: str, direct: bool, url: str, call: Call) -> tuple[Any, int]:
    """(the call's result or the error it raised, requests the httpx path carried)."""
    carried = [0]
    if kind == "sync":
        lean = SyncTransport(ssl.create_default_context())
        real = lean.handle_request

        def counted(request: httpx.Request) -> httpx.Response:
            carried[0] += 1
            return real(request)

        lean.handle_request = counted  # type: ignore[method-assign]
        http = httpx.Client(base_url=url, timeout=5, transport=lean, auth=MasterAuth(url, TOKEN))
        try:
            return Driver(http, lean if direct else None, TOKEN)._call(call, []), carried[0]
        except Exception as e:
            return e, carried[0]
        finally:
            http.close()

    async def go() -> Any:
        alean = AsyncTransport(ssl.create_default_context())
        areal = alean.handle_async_request

        async def acounted(request: httpx.Request) -> httpx.Response:
            carried[0] += 1
            return await areal(request)

        alean.handle_async_request = acounted  # type: ignore[method-assign]
        ahttp = httpx.AsyncClient(base_url=url, timeout=5, transport=alean,
                                  auth=MasterAuth(url, TOKEN))
        try:
            return await _AsyncDriver(ahttp, alean if direct else None, TOKEN)._call(call, [])
        except Exception as e:
            return e
        finally:
            await ahttp.aclose()

    return asyncio.run(go()), carried[0]


def request_of(raw: bytes) -> tuple[bytes, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    line, *rest = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in rest)}
    if headers.get("content-length") == "0":  # httpx's path says it of a GET; same thing
        del headers["content-length"]
    return line.encode(), {k: v for k, v in headers.items() if k in SENT}, body


def calls(node: str) -> list[Call]:
    return [Call("POST", "/v1/queues/g/q:lease", json={"max_tasks": 3, "worker": "w"}),
            Call("PUT", f"{node}/v1/blobs/b1?x=1", content=b"\x00payload\xff",
                 headers={"x-squall-token": "tk", "x-squall-crc32c": "42"}, raw=True),
            Call("GET", f"{node}/v1/blobs/b1", raw=True, timeout=3.0),
            # a blob write's query: replica URLs and the quorum, encoded as httpx encodes them
            Call("PUT", f"{node}/v1/blobs/b2", content=b"x" * 70_000, raw=True,
                 params={"quorum": "2", "replicas": "http://127.0.0.1:1,https://h.x:2/p q+&é"}),
            Call("GET", "/v1/queues", params={"prefix": "a/b c", "limit": "5"}),
            Call("DELETE", "/v1/queues/g/q", headers={"Authorization": "Bearer own"})]


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_the_direct_path_sends_and_reads_what_httpx_does(kind: str, servers) -> None:  # type: ignore[no-untyped-def]
    master, node = servers
    for call in calls(node.url):
        got = {}
        for direct in (False, True):
            result, carried = run(kind, direct, master.url, call)
            assert carried == (0 if direct else 1), (call, direct)  # which path it took
            if isinstance(result, Reply):  # raw: status, the headers we read, the body
                result = (result.status, result.headers.get("x-squall-crc32c"), result.content)
            got[direct] = result
            srv = node if call.url.startswith("http") else master
            got[direct, "request"] = request_of(srv.requests.pop())
        assert got[True] == got[False], call
        assert got[True, "request"] == got[False, "request"], call
    _, headers, _ = got[True, "request"]  # the last: the call's own credential
    assert headers["authorization"] == "Bearer own"
    _, headers, body = request_of(_resend(kind, master.url, calls(node.url)[1], node))
    assert "authorization" not in headers  # data nodes never see the master's credential
    assert body == b"\x00payload\xff" and headers["host"] == node.url.split("//")[1]


def _resend(kind: str, url: str, call: Call, srv: RawServer) -> bytes:
    run(kind, True, url, call)
    return srv.requests.pop()


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_answers_and_failures_map_as_on_httpx_path(kind: str, servers) -> None:  # type: ignore[no-untyped-def]
    master, _ = servers
    for path, want in (("/busy", Unavailable), ("/html", ServerError),
                       ("/hang-up", TransportError)):
        seen = []
        for direct in (False, True):
            before = len(master.requests)
            err, _ = run(kind, direct, master.url, Call("POST", path, json={}))
            assert isinstance(err, want), (path, direct, err)
            assert len(master.requests) == before + 1  # sent once: never resent silently
            seen.append((type(err), str(err), getattr(err, "retry_after", None)))
        assert seen[0] == seen[1], path
    err, _ = run(kind, True, master.url, Call("POST", "/busy", json={}))
    assert isinstance(err, StatusError) and err.retry_after == 2.0


def test_only_calls_httpx_would_send_unchanged_go_direct(servers) -> None:  # type: ignore[no-untyped-def]
    master, node = servers
    lean = SyncTransport(ssl.create_default_context())
    http = httpx.Client(base_url=master.url, transport=lean)
    s = Shortcut(http, TOKEN, enabled=True)
    assert s.prepare(Call("GET", "/v1/queues")) is not None
    assert s.prepare(Call("GET", f"{node.url}/v1/blobs/x")) is not None
    d = s.prepare(Call("PUT", f"{node.url}/v1/blobs/x", content=b"x",
                       params={"quorum": "2", "replicas": "http://127.0.0.1:1"}))
    assert d is not None and d.target == "/v1/blobs/x?quorum=2&replicas=http%3A%2F%2F127.0.0.1%3A1"
    for c in (Call("GET", "/v1/queues", stream=True),
              Call("GET", "/v1/queues?a=1", params={"prefix": "a"}),  # httpx merges the two
              Call("GET", "/v1/queues", params={"limit": 5}),  # type: ignore[dict-item]
              Call("GET", "/v1/queues", params={"all": True}),  # type: ignore[dict-item]
              Call("PUT", "/v1/blobs/x", content=iter([b"a", b"b"])),
              Call("GET", "/v1/queues/a b"), Call("GET", "/v1/queues/é"),
              Call("GET", "ftp://127.0.0.1:21/x"), Call("GET", "http://u:p@127.0.0.1:1/x"),
              Call("GET", "relative/path")):
        assert s.prepare(c) is None, c
    http.event_hooks = {"request": [lambda r: None], "response": []}
    assert s.prepare(Call("GET", "/v1/queues")) is None  # hooks see every request
    assert Shortcut(http, TOKEN, enabled=False).prepare(Call("GET", "/x")) is None
    http.event_hooks = {"request": [], "response": []}
    http.close()
    assert s.prepare(Call("GET", "/v1/queues")) is None  # closed: httpx's own error
