"""The data path of the client: payloads read in batches (one request per data
node), replica locations refreshed from the master, ack + lease in one update, and byte
identity through the client for every payload size class (0 B, 1 B, the front door's inline
limit ± 1, 4 MiB, 256 MiB) and source type; against a real local cluster (a master and data
nodes as subprocesses)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from squall.client import Client, NewTask, NotFound, _protocol
from squall.client._blobs import BATCH_BLOB_BYTES
from squall.client._frontdoor import MAX_BYTES as INLINE
from squall.client.cli.dev import DevCluster
from tests.helpers import cluster_fixture, start_cluster, wait_for


class Counting(httpx.HTTPTransport):
    """Counts requests by (method, last path segment)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter[tuple[str, str]] = Counter()
        self.batch_gets: list[dict[str, Any]] = []  # their bodies

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        kind = "blob" if path.startswith("/v1/blobs/") else path.rsplit("/", 1)[-1]
        self.seen[(request.method, kind)] += 1
        if kind == "blobs:batch-get":
            self.batch_gets.append(json.loads(request.read()))
        return super().handle_request(request)


cluster = cluster_fixture("datapath")


def test_lease_with_payloads_reads_one_batch_per_node(cluster: DevCluster) -> None:
    sizes = {"a0": 0, "a1": 1, "a2": 1000, "a3": BATCH_BLOB_BYTES - 1, "a4": BATCH_BLOB_BYTES,
             "a5": BATCH_BLOB_BYTES + 1, "a6": 4 << 20}
    blobs = {pid: os.urandom(n) for pid, n in sizes.items()}
    blobs |= {f"b{i:03d}": os.urandom(100 + i) for i in range(200)}
    t = Counting()
    with Client(cluster.master_url, transport=t) as c:
        c.put_many("dp#batch", (NewTask(v, pid=k) for k, v in blobs.items()))
        c.put("dp#batch", pid="none")
        t.seen.clear()
        tasks = c.lease("dp#batch", 1000, 60, payloads=True)
        assert len(tasks) == len(blobs) + 1
        nodes = {x.payload_ref.replicas[0] for x in tasks if x.payload_ref}
        # small payloads came in one batch read per data node; the large ones stay lazy
        assert t.seen[("POST", "blobs:batch-get")] <= len(nodes)
        assert t.seen[("GET", "blob")] == 0
        # ... each with the lease answer's one read token, sent once
        assert all("tokens" not in b and b["token"] for b in t.batch_gets)
        assert len({b["token"] for b in t.batch_gets}) == 1
        lazy = {x.pid for x in tasks if not x.payload_loaded}
        assert lazy == {"a5", "a6"}
        got = {x.pid: x.payload() for x in tasks}
        assert t.seen[("GET", "blob")] == 2  # only the lazy ones
        assert got.pop("none") == b""
        assert got == blobs
        c.release(tasks)
        # read_payloads on tasks leased without them: everything, in order
        again = c.lease("dp#batch", 1000, 60)
        t.seen.clear()
        data = c.read_payloads(again)
        assert data == [blobs.get(x.pid, b"") for x in again]
        assert t.seen[("POST", "blobs:batch-get")] <= len(nodes)
        assert all(x.payload_loaded for x in again)
        c.done(again)


def test_read_payloads_of_tasks_from_two_leases(cluster: DevCluster) -> None:
    """Each lease answer's read token covers its own payloads only, and one covering
    150 ids is too long for a batch-get's per-id `tokens` list: a batch read of tasks
    from two answers sends one batch-get per node and answer, each token once."""
    blobs = {f"r{i:03d}": os.urandom(200 + i) for i in range(300)}
    t = Counting()
    with Client(cluster.master_url, transport=t) as c:
        c.put_many("dp#two", (NewTask(v, pid=k) for k, v in blobs.items()))
        tasks = c.lease("dp#two", 150, 60) + c.lease("dp#two", 150, 60)
        assert len({x.payload_ref.token for x in tasks if x.payload_ref}) == 2
        assert all(len(x.payload_ref.token or "") > 4096 for x in tasks if x.payload_ref)
        t.seen.clear()
        assert c.read_payloads(tasks) == [blobs[x.pid] for x in tasks]
        assert t.seen[("GET", "blob")] == 0  # nothing fell back to single reads
        assert all("tokens" not in b for b in t.batch_gets)
        assert len({b["token"] for b in t.batch_gets}) == 2
        c.done(tasks)


def test_done_and_lease_in_one_update(cluster: DevCluster) -> None:
    with Client(cluster.master_url) as c:
        c.put_many("dp#ack", [NewTask(b"x%d" % i, pid=f"p{i}") for i in range(5)])
        first = c.lease("dp#ack", 2, 60)
        ticket = c.stats().wal_ticket  # type: ignore[union-attr]
        nxt = c.lease("dp#ack", 2, 60, done=first, payloads=True)
        assert [x.pid for x in nxt] == ["p2", "p3"]
        assert all(x.finished for x in first) and [x.payload() for x in nxt] == [b"x2", b"x3"]
        assert c.stats().wal_ticket == ticket + 1  # type: ignore[union-attr]  # one record
        s = c.stats("dp#ack")
        assert (s.completed, s.leased, s.available) == (2, 2, 1)
        # all or nothing: a task in `done` already dequeued: nothing is leased either
        with pytest.raises(NotFound):
            c.lease("dp#ack", 1, 60, done=[first[0]])
        assert c.stats("dp#ack").available == 1
        # the same group only
        with pytest.raises(Exception, match="one group"):
            c.lease("other#ack", 1, 60, done=nxt)
        last = c.lease("dp#ack", 1, 60, done=None)  # None: nothing to dequeue (as ())
        assert [x.pid for x in last] == ["p4"]
        c.done([*nxt, *last])


def test_stale_replicas_are_refreshed_from_the_master(tmp_path: Path) -> None:
    cl = start_cluster(tmp_path / "cl", 3)
    try:
        with Client(cl.master_url) as c:
            data = os.urandom(3000)
            c.put("dp#moved", data, pid="x")
            [task] = c.lease("dp#moved", 1, 300)
            assert task.payload_ref is not None
            listed = list(task.payload_ref.replicas)
            port_of = {cl.node_url(i): i for i in cl.node_procs}
            a, b = (port_of[u] for u in listed)
            cl.kill_node(a)  # the master copies the blob to the third node ...
            wait_for(lambda: (i := c.task("dp#moved", "x").payload) is not None
                     and len([u for u in i.replicas if u not in listed]) == 1
                     and c.cluster().under_replicated == 0, 60, what="re-replication")
            cl.kill_node(b)  # ... and now both nodes the lease answer named are gone
            assert task.payload() == data
            assert set(task.payload_ref.replicas) - set(listed)  # the refreshed list
    finally:
        cl.stop()


def test_task_lookup_answers_group_and_name(cluster: DevCluster) -> None:
    with Client(cluster.master_url) as c:
        c.put("dp#look", pid="x")
        assert c.task("dp#look", "x").queue == "dp#look"
        assert [t.queue for t in c.tasks("dp#look")] == ["dp#look"]
        c.done(c.lease("dp#look", 1))


@pytest.mark.parametrize(("role", "args", "why"), [
    ("master", ["--replication-factor", "2", "--write-quorum", "3"], "write_quorum 3"),
    ("master", ["--heartbeat-interval-s", "0"], "heartbeat_interval_s"),
    ("datanode", ["--heartbeat-interval-s", "0", "--advertise", "http://127.0.0.1:1"],
     "heartbeat-interval-s"),
])
def test_bad_cluster_settings_are_refused(tmp_path: Path, role: str, args: list[str],
                                          why: str) -> None:
    r = subprocess.run([sys.executable, "-m", f"squall.{role}", "--data-dir",
                        str(tmp_path / role), "--port", "1", *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and why in r.stderr + r.stdout


def _front(c: Client) -> tuple[int, int]:
    """(batches the front door took, fallbacks to the classic path) of this client."""
    fd = c._core.front
    assert fd is not None
    return fd.used, fd.fallbacks


def test_byte_identity_across_the_inline_limit(cluster: DevCluster) -> None:
    """put -> lease(payloads=True) / read_payloads / iter_payload give back exactly the
    bytes put, on both sides of the front door's limit, from bytes, a file, a stream and an
    iterable of parts; <= the limit goes through the front door, above it the streamed
    path."""
    rng = random.Random(9)
    sizes = [0, 1, INLINE - 1, INLINE, INLINE + 1, 4 << 20]
    want = {f"s{n:08d}": rng.randbytes(n) for n in sizes}
    with Client(cluster.master_url) as c:
        for pid, data in want.items():
            before = _front(c)
            c.put("dp#ident", data, pid=pid)
            took = _front(c)[0] - before[0]
            assert took == (1 if len(data) <= INLINE else 0), (len(data), took)
        assert _front(c)[1] == 0  # no fallback: the front door answered every time
        tasks = c.lease("dp#ident", 100, 120, payloads=True)
        assert sorted(x.pid for x in tasks) == sorted(want)
        for x in tasks:
            assert x.payload() == want[x.pid], x.pid
            assert b"".join(x.iter_payload(chunk_bytes=7919)) == want[x.pid], x.pid
        assert c.read_payloads(tasks) == [want[x.pid] for x in tasks]
        c.done(tasks)
        # the other source types, on both sides of the limit
        sources = {"io-small": io.BytesIO(want[f"s{INLINE:08d}"]),
                   "io-big": io.BytesIO(want[f"s{4 << 20:08d}"]),
                   "parts": iter([b"ab", b"", b"c" * (INLINE + 1)])}
        expect = {"io-small": want[f"s{INLINE:08d}"], "io-big": want[f"s{4 << 20:08d}"],
                  "parts": b"ab" + b"c" * (INLINE + 1)}
        c.put_many("dp#ident2", [NewTask(v, pid=k) for k, v in sources.items()])
        got = c.lease("dp#ident2", 10, 120, payloads=True)
        assert {x.pid: x.payload() for x in got} == expect
        c.done(got)


def test_byte_identity_256_mib_from_a_file(cluster: DevCluster, tmp_path: Path) -> None:
    """A 256 MiB payload put from a file (streamed, never whole in the client's memory)
    reads back identical, whole and streamed."""
    src, digest, size = tmp_path / "big.bin", hashlib.sha256(), 256 << 20
    rng = random.Random(256)
    with open(src, "wb") as f:
        for _ in range(size >> 22):
            part = rng.randbytes(4 << 20)
            digest.update(part)
            f.write(part)
    with Client(cluster.master_url) as c:
        c.put("dp#huge", src, pid="big")
        [t] = c.lease("dp#huge", 1, 600, payloads=True)
        assert not t.payload_loaded  # large payloads stay lazy
        assert t.payload_ref is not None and t.payload_ref.size == size
        h, n = hashlib.sha256(), 0
        for part in t.iter_payload():
            h.update(part)
            n += len(part)
        assert (n, h.hexdigest()) == (size, digest.hexdigest())
        whole = t.payload()
        assert len(whole) == size and hashlib.sha256(whole).digest() == digest.digest()
        del whole
        t.done()


def test_the_sync_client_sends_small_requests_without_nagle_delay(cluster: DevCluster) -> None:
    """TCP_NODELAY on the sync client's connections (asyncio sets it for the async one)."""
    with Client(cluster.master_url) as c:
        c.stats()
        idle = c._http._transport.pool._idle  # type: ignore[attr-defined]
        conns = [conn for pool in idle.values() for conn in pool]
        assert conns
        assert conns[0].sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


@pytest.mark.parametrize("in_flight", [1, 4, 16])
def test_put_many_in_flight_keeps_order_and_stops_at_a_failure(cluster: DevCluster,
                                                               in_flight: int) -> None:
    """Batches sent at once still give pid-less tasks pids in the order of the items (front
    door and master-only alike); a failing batch stops the sending: nothing after its round
    is enqueued, and the call raises."""
    q = f"pm#order{in_flight}"
    with Client(cluster.master_url) as c:
        items: list[bytes | None] = [i.to_bytes(4, "big") if i % 3 else None
                                     for i in range(1000)]
        assert c.put_many(q, items, batch_size=50, in_flight=in_flight) == 1000
        got = []
        while batch := c.lease(q, 500, 60, payloads=True):
            got += batch
            c.done(batch)
        assert [t.pid for t in got] == sorted(t.pid for t in got)
        assert [t.payload() or None for t in got] == items  # the order of the items

        bad = [NewTask(None, pid=f"p{i:04d}") for i in range(400)]
        bad[130] = NewTask(None, pid="")  # an empty pid: refused (400)
        with pytest.raises(Exception, match="pid"):
            c.put_many(q + "x", bad, batch_size=50, in_flight=in_flight)
        st = c.stats(q + "x")
        # batches 0-1 went before the failing one (batch 2); with 4 in flight its round
        # (batches 0-3) was sent at once, with 16 batches 0-7 (the 400 tasks); no later
        # round was
        assert st.total == {1: 100, 4: 150, 16: 350}[in_flight]


def test_put_many_holds_at_most_a_wave_of_payload_bytes(cluster: DevCluster, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """A round of put_many batches stops taking items once it holds WAVE_BYTES of payload
    bytes (at least one batch), so many batches in flight never hold many large payloads.
    Files and paths the client reads whole count; payloads it streams count nothing."""
    monkeypatch.setattr(_protocol, "WAVE_BYTES", 100_000)
    taken: list[int] = []
    seen: list[int] = []
    f = tmp_path / "30k"
    f.write_bytes(os.urandom(30_000))

    def items(make: Any) -> Iterator[Any]:
        for i in range(40):
            taken.append(i)
            yield make(i)

    # batches of two 30 KB payloads: the second batch takes the round past 100 KB
    held = [lambda i: os.urandom(30_000), lambda i: memoryview(os.urandom(30_000)),
            lambda i: f, lambda i: opened.enter_context(f.open("rb"))]
    # an iterable, and a file object of unknown size
    streamed = [lambda i: iter([os.urandom(30_000)]), lambda i: io.BytesIO(os.urandom(30_000))]
    with Client(cluster.master_url) as c, contextlib.ExitStack() as opened:
        for make, first in [(m, 4) for m in held] + [(m, 32) for m in streamed]:
            taken.clear()
            seen.clear()
            c.put_many("pm#wave", items(make), batch_size=2,
                       progress=lambda res: seen.append(len(taken)))
            assert seen[:2] == [first, first] and len(seen) == 20  # 32: rounds of 16
        assert c.stats("pm#wave").total == 240
