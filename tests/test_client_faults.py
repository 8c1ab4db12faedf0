"""Injected faults (httpx.MockTransport): which calls are retried, that a retried enqueue
never enqueues twice, that raw httpx errors never escape, and payload write / read
failover across replicas."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest

import squall.client as sc
from squall.client import AsyncClient, Client, NewTask
from squall.common.checksum import CRC_HEADER, crc32c
from squall.common.wire.models import LeasedTask as WireTask
from squall.common.wire.models import PayloadRef
from squall.common.wire.payload import decode_frames
from squall.master.http.app import create_master_app
from squall.master.service import MasterSettings
from tests.helpers import FAKE_TOKEN


class Faults:
    """Forwards requests to an in-process master, injecting the planned faults: `connect`
    (never sent), `lost` (applied, answer lost), `503` (refused, Retry-After)."""

    def __init__(self, app: Any) -> None:
        self.inner = httpx.ASGITransport(app=app)
        self.plan: list[tuple[str, str]] = []
        self.log: list[str] = []

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.log.append(f"{request.method} {path}")
        for i, (match, kind) in enumerate(self.plan):
            if match in path:
                del self.plan[i]
                if kind == "connect":
                    raise httpx.ConnectError("connection refused", request=request)
                if kind == "503":
                    return httpx.Response(503, headers={"Retry-After": "0"}, json={
                        "error": {"code": "unavailable", "message": "busy"}})
                resp = await self.inner.handle_async_request(request)
                await resp.aread()
                raise httpx.ReadError("connection reset by peer", request=request)
        return await self.inner.handle_async_request(request)

    def count(self, what: str) -> int:
        return sum(1 for x in self.log if what in x)


@pytest.fixture
async def faulty(tmp_path) -> AsyncIterator[tuple[AsyncClient, Faults]]:  # type: ignore[no-untyped-def]
    app = create_master_app(MasterSettings(data_dir=str(tmp_path / "m")), background=False)
    async with app.router.lifespan_context(app):
        f = Faults(app)
        retry = sc.Retry(attempts=3, base_s=0.001, max_s=0.002)
        async with AsyncClient("http://127.0.0.1", transport=httpx.MockTransport(f)) as c:
            c._core.retry = c._core.blobs.retry = retry
            yield c, f


async def total(c: AsyncClient, queue: str) -> int:
    try:
        return (await c.stats(queue)).total
    except sc.NotFound:
        return 0


async def test_lost_enqueue_answer_is_retried_without_duplicate(
        faulty: tuple[AsyncClient, Faults]) -> None:
    c, f = faulty
    f.plan = [("/tasks", "lost")]
    r = await c.put("g#q")  # FIFO: the client-made pid makes the resend collapse
    assert not r.collapsed and f.count("/tasks") == 2
    assert await total(c, "g#q") == 1
    f.plan = [("/tasks", "lost"), ("/tasks", "lost")]
    await c.put("g#q", pid="explicit")
    assert await total(c, "g#q") == 2 and f.count("/tasks") == 5
    f.plan = [("/tasks", "lost")] * 3
    assert await c.put_many("g#many", [None] * 250, batch_size=100) == 250
    assert await total(c, "g#many") == 250


async def test_lease_is_not_resent_after_an_ambiguous_failure(
        faulty: tuple[AsyncClient, Faults]) -> None:
    c, f = faulty
    await c.put("g#l", pid="a")
    f.plan = [("/lease", "lost")]
    with pytest.raises(sc.TransportError) as ei:
        await c.lease("g#l", 1)
    assert not isinstance(ei.value, sc.ConnectError)
    assert f.count("/lease") == 1
    assert (await c.stats("g#l")).leased == 1  # applied; it comes back when the lease ends
    await c.reset_leases("g#l")
    f.plan = [("/lease", "connect"), ("/lease", "503")]  # never applied: safe to resend
    [t] = await c.lease("g#l", 1)
    assert t.pid == "a" and f.count("/lease") == 4


async def test_dequeue_is_not_resent_but_renew_is(faulty: tuple[AsyncClient, Faults]) -> None:
    c, f = faulty
    await c.put("g#d", pid="a")
    [t] = await c.lease("g#d", 1)
    f.plan = [("/update", "lost")]
    await t.renew(30)  # renewing twice is harmless: resent
    assert f.count("/update") == 2
    f.plan = [("/update", "lost")]
    with pytest.raises(sc.TransportError):
        await t.done()
    assert f.count("/update") == 3
    assert await total(c, "g#d") == 0  # it was applied


async def test_a_refusal_after_a_lost_answer_is_not_reported_as_refused(
        faulty: tuple[AsyncClient, Faults]) -> None:
    """Refused means not applied: an enqueue whose first attempt was applied (its answer
    lost) and whose resends were all refused (503) raises OutcomeUnknown, not the 503 that
    would say nothing was applied. Refusals alone still raise as refusals."""
    c, f = faulty
    f.plan = [("/tasks", "lost")] + [("/tasks", "503")] * 3
    with pytest.raises(sc.OutcomeUnknown, match="earlier attempt may have been applied") as ei:
        await c.put("g#u", pid="a")
    assert sc.may_have_applied(ei.value) and isinstance(ei.value.__cause__, sc.Unavailable)
    assert f.count("/tasks") == 4 and await total(c, "g#u") == 1  # it was applied
    f.plan = [("/tasks", "503")] * 4
    with pytest.raises(sc.Unavailable) as ej:
        await c.put("g#u", pid="b")
    assert not sc.may_have_applied(ej.value) and await total(c, "g#u") == 1


async def test_retries_give_up_with_a_squall_error(faulty: tuple[AsyncClient, Faults]) -> None:
    c, f = faulty
    f.plan = [("/queues", "connect")] * 10
    with pytest.raises(sc.ConnectError):
        await c.queues()
    assert f.count("/v1/queues") == 4  # the first try and 3 resends


def test_sync_client_raw_httpx_errors_never_escape() -> None:
    def boom(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/lease"):
            raise httpx.ReadTimeout("slow", request=request)
        if request.url.path.endswith("/tasks"):
            return httpx.Response(200, content=b"<html>hi</html>")
        raise httpx.RemoteProtocolError("garbage", request=request)

    with Client("http://m", transport=httpx.MockTransport(boom), retries=0) as c:
        with pytest.raises(sc.TransportError, match="timed out"):
            c.lease("q")
        with pytest.raises(sc.ServerError, match="not JSON"):
            c.put("q", pid="x")
        with pytest.raises(sc.TransportError):
            c.queues()


@contextlib.contextmanager
def cycles_watched() -> Iterator[list[int]]:
    """Counts the httpx Responses the block leaves in reference cycles (freed only by the
    garbage collector, bodies and all: 4 MiB payloads piled up between collections)."""
    gc.collect()
    gc.disable()
    gc.freeze()  # the session's objects: the collection below looks at the block's only
    gc.set_debug(gc.DEBUG_SAVEALL)
    left: list[int] = []
    try:
        yield left
        gc.collect()
        left.append(sum(1 for o in gc.garbage if isinstance(o, httpx.Response)))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.unfreeze()
        gc.enable()


def answers(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith("/missing"):
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no"}})
    return httpx.Response(200, json={"queues": [], "next": None})


async def answers_async(request: httpx.Request) -> httpx.Response:
    return answers(request)


def test_sync_responses_are_freed_without_the_collector() -> None:
    with (Client("http://m", transport=httpx.MockTransport(answers), retries=0) as c,
          cycles_watched() as left):
        for _ in range(5):
            c.queues()
        with pytest.raises(sc.NotFound):
            c.task("g#q", "missing")
    assert left == [0]


async def test_async_responses_are_freed_without_the_collector() -> None:
    async with AsyncClient("http://m", transport=httpx.MockTransport(answers_async),
                           retries=0) as c:
        with cycles_watched() as left:
            for _ in range(5):
                await c.queues()
            with pytest.raises(sc.NotFound):
                await c.task("g#q", "missing")
    assert left == [0]


# -- payload placement and failover, against fake data nodes --------------------------------
Handler = Callable[[httpx.Request], Any]


class FakeCluster:
    """A fake master (allocate, enqueue) and data nodes n1..n3 with per-node behaviour."""

    def __init__(self) -> None:
        self.blobs: dict[str, bytes] = {}
        self.enqueued: list[dict[str, Any]] = []
        self.node: dict[str, Handler] = {}
        self.log: list[str] = []
        self.replica_sets: list[list[str]] = []  # the next allocations' replicas
        self.lookups = 0

    def stored(self, blob_id: str, data: bytes, nodes: list[str]) -> dict[str, Any]:
        self.blobs[blob_id] = data
        return {"blob_id": blob_id, "size": len(data), "crc32c": crc32c(data),
                "stored": [{"node_id": n, "address": f"http://{n}", "receipt": f"r-{n}"}
                           for n in nodes]}

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        self.log.append(f"{host} {request.method} {path} {request.url.query.decode()}")
        if host == "master" and path == "/v1/blobs/allocate":
            n = orjson.loads(request.content)["count"]
            reps = self.replica_sets.pop(0) if self.replica_sets else ["http://n1",
                                                                        "http://n2"]
            return httpx.Response(200, json={
                "blobs": [{"blob_id": f"b{len(self.blobs) + i}", "replicas": reps}
                          for i in range(n)],
                "token": "w", "expires_at": 0, "write_quorum": 2})
        if host == "master" and path.endswith("/tasks"):
            body = orjson.loads(request.content)
            self.enqueued += body["tasks"]
            return httpx.Response(200, json={"ticket": 1, "enqueued": [
                {"queue": "q", "pid": t["pid"], "collapsed": False} for t in body["tasks"]]})
        if host == "master" and "/tasks/" in path:  # a task lookup: the master knows
            self.lookups += 1                          # nothing newer than the lease
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "-"}})
        resp = self.node.get(host, lambda r: None)(request)
        if resp is not None:
            return resp  # type: ignore[no-any-return]
        if request.method == "PUT":
            peers = request.url.params.get("replicas", "").replace("http://", "").split(",")
            return httpx.Response(200, json=self.stored(path.rsplit("/", 1)[1],
                                                        request.content, [host, *peers]))
        if path.endswith(":batch-put"):
            peers = request.url.params.get("replicas", "").replace("http://", "").split(",")
            return httpx.Response(200, json={"blobs": [
                self.stored(fr.blob_id, fr.data, [host, *peers])
                for fr in decode_frames(request.content)]})
        data = self.blobs[path.rsplit("/", 1)[1]]
        rng = request.headers.get("range")
        start = int(rng.split("=")[1].rstrip("-")) if rng else 0
        return httpx.Response(206 if rng else 200, content=data[start:],
                              headers={CRC_HEADER: str(crc32c(data))})


def refused(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


@pytest.fixture
async def fake() -> AsyncIterator[tuple[AsyncClient, FakeCluster]]:
    cl = FakeCluster()
    async with AsyncClient("http://master", transport=httpx.MockTransport(cl), retries=1,
                           front_door=False) as c:  # the three-step write path
        c._core.retry.base_s = c._core.retry.max_s = 0.001
        yield c, cl


async def test_write_fails_over_to_the_next_replica(fake: tuple[AsyncClient, FakeCluster]
                                                    ) -> None:
    c, cl = fake
    cl.node["n1"] = refused
    await c.put("q", b"x" * 1000)
    [spec] = cl.enqueued
    ref = spec["payload"]
    assert ref["size"] == 1000 and ref["crc32c"] == crc32c(b"x" * 1000)
    assert ref["receipts"] == ["r-n2", "r-n1"]
    assert any(x.startswith("n2 PUT") and "replicas=http%3A%2F%2Fn1" in x for x in cl.log)
    # many small payloads: one batch write per replica set, one enqueue
    cl.log.clear()
    assert await c.put_many("q", [b"a", b"bb", NewTask(b"ccc", pid="p")]) == 3
    assert sum(":batch-put" in x for x in cl.log) == 1
    assert sum(x.endswith("/tasks ") for x in cl.log) == 1
    assert [t["payload"]["size"] for t in cl.enqueued[1:]] == [1, 2, 3]
    # an iterable is streamed once to the first replica (sync parts, async client)
    cl.node.pop("n1")
    await c.put("q", iter([b"ab", b"cd"]))
    assert cl.enqueued[-1]["payload"]["crc32c"] == crc32c(b"abcd")
    cl.node["n1"] = refused
    with pytest.raises(sc.ConnectError):
        await c.put("q", iter([b"no failover for streams"]))


async def test_write_allocates_again_when_no_replica_takes_it(
        fake: tuple[AsyncClient, FakeCluster]) -> None:
    c, cl = fake
    cl.node["n1"] = cl.node["n2"] = refused
    cl.replica_sets = [["http://n1", "http://n2"], ["http://n3", "http://n4"]]
    await c.put_many("q", [b"one", b"two"])
    assert [t["payload"]["receipts"] for t in cl.enqueued] == [["r-n3", "r-n4"]] * 2
    assert sum("/v1/blobs/allocate" in x for x in cl.log) == 2
    cl.replica_sets = [["http://n1", "http://n2"]] * 2
    with pytest.raises(sc.TransportError):
        await c.put("q", b"nowhere to go")


def leased(c: AsyncClient, data: bytes, replicas: list[str], blob_id: str = "b0") -> Any:
    ref = PayloadRef(blob_id=blob_id, size=len(data), crc32c=crc32c(data), replicas=replicas,
                     token="r")
    return c._task(WireTask(queue="q", pid="p", token=FAKE_TOKEN, expires_at=0, attempts=1,
                            enqueued_at=0, payload=ref), "default")


async def test_read_skips_dead_missing_and_corrupt_replicas(
        fake: tuple[AsyncClient, FakeCluster]) -> None:
    c, cl = fake
    data = bytes(range(256)) * 40
    cl.blobs["b0"] = data
    cl.node["n1"] = refused
    cl.node["n2"] = lambda r: httpx.Response(200, content=data[:-1] + b"!")
    cl.node["n3"] = lambda r: httpx.Response(404, json={"error": {"code": "not_found",
                                                                  "message": "gone"}})
    task = leased(c, data, ["http://n1", "http://n2", "http://n3", "http://n4"])
    assert await task.payload() == data
    assert [x.split()[0] for x in cl.log] == ["n1", "n2", "n3", "n4"]
    cl.log.clear()
    assert await task.payload() == data  # the healthy replica is tried first now
    assert [x.split()[0] for x in cl.log] == ["n4"]
    cl.node["n4"] = cl.node["n2"]
    with pytest.raises(sc.DataCorrupt, match="no replica"):
        await task.payload()
    assert cl.lookups == 0  # a corrupt copy is not a stale location
    with pytest.raises(sc.Unavailable, match="no live replica"):
        await leased(c, data, []).payload()
    assert cl.lookups == 1  # it asked the master where the copies are now


class Broken(httpx.AsyncByteStream):
    def __init__(self, data: bytes, cut: int) -> None:
        self.data, self.cut = data, cut

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.data[:self.cut]
        raise httpx.ReadError("connection reset mid-stream")


async def test_streamed_read_resumes_on_another_replica(
        fake: tuple[AsyncClient, FakeCluster]) -> None:
    c, cl = fake
    data = bytes(range(256)) * 4000
    cl.blobs["b0"] = data
    cl.node["n1"] = lambda r: httpx.Response(200, stream=Broken(data, 300_000),
                                             headers={CRC_HEADER: str(crc32c(data))})
    task = leased(c, data, ["http://n1", "http://n2"])
    parts = [p async for p in task.iter_payload(chunk_bytes=64 << 10)]
    assert b"".join(parts) == data and max(map(len, parts)) <= 64 << 10
    ranges = [x for x in cl.log if x.startswith("n2")]
    assert len(ranges) == 1
    # a replica that sends wrong bytes is caught at the end: the read fails loudly
    bad = leased(c, data[:-1] + b"?", ["http://n2"])
    with pytest.raises(sc.DataCorrupt):
        async for _ in bad.iter_payload():
            pass


@pytest.mark.parametrize("first", [502, 503])
async def test_front_door_lost_answer_then_refusals(first: int) -> None:
    """A front-door node that lost the master's answer (502 outcome_unknown) may have
    enqueued the batch: when every later attempt (the other nodes, then the three-step
    path) is refused, `put` raises OutcomeUnknown, not the last refusal. When every
    attempt was refused, the refusal is raised as such."""
    log: list[str] = []

    def h(request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        log.append(f"{host} {path}")
        if path == "/v1/cluster":
            return httpx.Response(200, json={"nodes": [
                {"address": f"http://n{i}", "state": "alive"} for i in (1, 2, 3)]})
        if host == "n1":
            code = "outcome_unknown" if first == 502 else "unavailable"
            return httpx.Response(first, json={"error": {"code": code, "message": "lost"}})
        return httpx.Response(503, headers={"Retry-After": "0"}, json={
            "error": {"code": "unavailable", "message": "busy"}})

    async with AsyncClient("http://master", transport=httpx.MockTransport(h),
                           retries=1) as c:
        c._core.retry.base_s = c._core.retry.max_s = 0.001
        with pytest.raises(sc.StatusError) as ei:
            await c.put("q", b"x" * 100, pid="p")
    assert sum("/tasks" in x for x in log) == 3  # each node once
    assert any(x == "master /v1/blobs/allocate" for x in log)  # then the three-step path
    if first == 502:
        assert isinstance(ei.value, sc.OutcomeUnknown) and sc.may_have_applied(ei.value)
        assert "earlier attempt may have been applied" in str(ei.value)
    else:
        assert type(ei.value) is sc.Unavailable and not sc.may_have_applied(ei.value)
