"""The data-node front door: small payloads enqueued in one client round trip,
byte identity around its size limit, and a front-door node SIGKILLed between storing and
committing (an orphan, collected) and between committing and answering (the client's retry
collapses: nothing enqueued twice)."""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time
from pathlib import Path

import httpx
import msgpack
import pytest

from squall.client import Client, NewTask
from squall.client._frontdoor import MAX_BYTES
from squall.client.cli.dev import DevCluster
from squall.common.checksum import crc32c
from squall.common.security import tokens
from squall.common.security.tokens import load_cluster_key
from squall.common.wire.payload import encode_frame
from squall.datanode.frontdoor import BLOCK_IDS, BLOCK_IDS_MAX, _Block, next_block_ids
from tests.helpers import ADMIN, cluster_fixture, start_cluster, wait_for

GRACE_S = 8.0  # the master's orphan grace in the crash test (blocks live a quarter of it)



cluster = cluster_fixture("frontdoor")


def test_small_payloads_take_the_front_door(cluster: DevCluster) -> None:
    sizes = {"s0": 0, "s1": 1, "s2": 1000, "s3": MAX_BYTES - 1, "s4": MAX_BYTES}
    blobs = {k: os.urandom(n) for k, n in sizes.items()}
    with Client(cluster.master_url) as c:
        for k, v in blobs.items():
            assert not c.put("fd#small", v, pid=k).collapsed
        assert c.put("fd#small", blobs["s2"], pid="s2").collapsed  # a resend collapses
        assert c._core.front is not None and c._core.front.used == 6
        assert c.put_many("fd#small", (NewTask(os.urandom(100), pid=f"m{i:03d}")
                                       for i in range(300))) == 300
        big = os.urandom(MAX_BYTES + 1)
        c.put("fd#small", big, pid="t-big")  # over the limit: the streamed path
        assert c._core.front.used == 9 and c._core.front.fallbacks == 0
        tasks = c.lease("fd#small", 1000, 60, payloads=True)
        got = {t.pid: t.payload() for t in tasks}
        assert len(got) == 306 and got["t-big"] == big
        assert {k: got[k] for k in blobs} == blobs
        for t in tasks:  # receipts from the write quorum: the master lists two holders
            assert t.payload_ref is not None and len(t.payload_ref.replicas) == 2
        c.done(tasks)


def test_a_busy_front_door_is_not_capped_by_its_blocks(cluster: DevCluster) -> None:
    """The master grants a node at most 8 unexpired blocks; 12,000 tasks through one node
    in one go needed 12 blocks of the first size (1000 ids): the node answered 429 and
    the client fell back to the three-request path. Blocks now grow while they run out
    fast: every batch takes the front door."""
    with Client(cluster.master_url) as c:
        fd = c._core.front
        assert fd is not None
        assert c.put("fd#busy", b"warm", pid="warm") is not None  # the node list is loaded
        one = fd.nodes.urls[0]
        fd.nodes.urls, fd.nodes.at = [one], time.monotonic() + 3600  # every batch to one node
        used = fd.used
        n = c.put_many("fd#busy", (b"%d" % i for i in range(12_000)), batch_size=100)
        assert n == 12_000
        assert fd.fallbacks == 0 and fd.used - used == 120
        assert c.stats("fd#busy").total == 12_001  # answered: logged (some may be pending)
        wait_for(lambda: c.stats("fd#busy").available == 12_001, 30,
                 what="every put confirmed (leasable)")


def test_block_sizes_follow_the_demand() -> None:
    size = BLOCK_IDS
    for _ in range(30):  # each block runs out at once: doubles, up to the bound
        b = _Block("p-", size, 1060.0, [], 1, 1000.0, used=size)
        size = next_block_ids(size, b, 100, now=1001.0)
    assert size == BLOCK_IDS_MAX
    idle = _Block("p-", size, 1060.0, [], 1, 1000.0, used=10)  # expired nearly unused
    assert next_block_ids(size, idle, 100, now=1060.0) == size // 2
    slow = _Block("p-", 4000, 1060.0, [], 1, 1000.0, used=3950)  # ran out late: kept
    assert next_block_ids(4000, slow, 100, now=1050.0) == 4000
    small = _Block("p-", BLOCK_IDS, 1060.0, [], 1, 1000.0, used=0)
    assert next_block_ids(BLOCK_IDS, small, 100, now=1060.0) == BLOCK_IDS  # the floor


def _first(c: Client, url: str, nodes: list[str]) -> None:
    """Make the client's front door try `url` first next."""
    fd = c._core.front
    assert fd is not None
    fd.nodes.urls, fd.nodes.at = [url, *(n for n in nodes if n != url)], time.monotonic() + 3600
    fd.nodes.turn = -1


def _blobs(url: str) -> float:
    text = httpx.get(url + "/metrics", headers=ADMIN, timeout=5).text
    m = re.search(r"^squall_datanode_blobs (\S+)$", text, re.M)
    return float(m[1]) if m else -1


@pytest.mark.parametrize(("crash", "parallel"), [
    ("after_store", "0"), ("after_commit", "0"),  # the serial path: store, then commit
    ("after_commit", "1"),  # the parallel put: pending and stored, never confirmed
])
def test_front_door_node_killed(tmp_path: Path, crash: str, parallel: str) -> None:
    cl = start_cluster(tmp_path / "cl", 3, extra_env={"SQUALL_ORPHAN_GRACE_S": str(GRACE_S),
                                                      "SQUALL_PENDING_DEADLINE_S": "1"})
    try:
        nodes = [cl.node_url(i) for i in (1, 2, 3)]
        cl.kill_node(1)  # node 1 comes back armed to SIGKILL itself mid-request
        cl.env = {**cl.env, "SQUALL_TEST_CRASH": crash, "SQUALL_FRONT_DOOR_PARALLEL": parallel}
        cl.start_node(1)
        cl.wait_ready(nodes[0], cl.node_procs[1], "node-1", 60)
        cl.wait_alive(3)
        data = os.urandom(5000)
        with Client(cl.master_url) as c:
            _first(c, nodes[0], nodes)
            r = c.put("fd#crash", data)  # FIFO: the client makes the pid, resends carry it
            assert not r.collapsed  # (a resend that collapses into our own first attempt)
            wait_for(lambda: cl.node_procs[1].poll() is not None, 10, what="node 1 died")
            s = c.stats("fd#crash")
            assert s.total == 1  # once, whichever node's attempt the master applied
            [t] = c.lease("fd#crash", 10, 60)
            assert t.pid == r.pid and t.payload() == data
            c.done(t)
            if crash == "after_store":
                # node 1 stored and replicated, then died before committing: the copies
                # on the live nodes belong to no task, and the master collects them
                wait_for(lambda: sum(_blobs(u) for u in nodes[1:]) == 0, 60,
                         what="the orphan and the dequeued blob collected")
    finally:
        cl.stop()


class AnswerDropper:
    """A TCP proxy to the master that forwards everything, except that once armed it drops
    the master's answer to the next ``POST /v1/nodes/commit[.msgpack]`` it carries (the master
    applied the commit) and cuts that connection: a commit whose answer is lost."""

    def __init__(self, port: int) -> None:
        self.target, self.dropped = port, 0
        self.armed = threading.Event()
        self.writers: list[asyncio.StreamWriter] = []
        self.loop = asyncio.new_event_loop()
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._conn, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    async def _conn(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", self.target)
        self.writers += [cw, uw]
        drop = asyncio.Event()

        async def up() -> None:
            while data := await cr.read(1 << 16):
                if self.armed.is_set() and data.startswith(b"POST /v1/nodes/commit"):
                    self.armed.clear()
                    drop.set()
                uw.write(data)
                await uw.drain()
            uw.close()

        async def down() -> None:
            while data := await ur.read(1 << 16):
                if drop.is_set():  # the master answered: the answer never arrives
                    self.dropped += 1
                    cw.transport.abort()
                    uw.close()
                    return
                cw.write(data)
                await cw.drain()
            cw.close()

        await asyncio.gather(up(), down(), return_exceptions=True)

    def close(self) -> None:
        async def stop() -> None:
            self.server.close()
            for w in self.writers:
                w.transport.abort()
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in rest:
                t.cancel()
            await asyncio.gather(*rest, return_exceptions=True)
            await self.server.wait_closed()

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def test_a_commit_whose_answer_is_lost_is_not_refused(tmp_path: Path) -> None:
    """Refused means not applied: a front-door node that sent the commit to the master and
    lost the answer says the outcome is unknown (502 ``outcome_unknown``), never 503 — the
    master applied it. The client moves on to the next node, whose resend collapses."""
    cl = start_cluster(tmp_path / "cl", 3)
    proxy = AnswerDropper(cl.port)
    try:
        nodes = [cl.node_url(i) for i in (1, 2, 3)]
        cl.kill_node(1)  # node 1 comes back talking to the master through the proxy
        cl.start_node(1, master=proxy.url)
        cl.wait_ready(nodes[0], cl.node_procs[1], "node-1", 60)
        cl.wait_alive(3)
        proxy.armed.set()
        r = httpx.post(nodes[0] + "/v1/groups/fd/queues/lost/tasks", timeout=30,
                       content=msgpack.packb({"tasks": [{"pid": "a", "payload": b"abc"}]}),
                       headers={"Content-Type": "application/msgpack", **ADMIN})
        assert r.status_code == 502 and r.json()["error"]["code"] == "outcome_unknown", r.text
        assert "may have applied" in r.json()["error"]["message"] and proxy.dropped == 1
        with Client(cl.master_url) as c:
            assert c.stats("fd#lost").total == 1  # it was applied
            _first(c, nodes[0], nodes)
            proxy.armed.set()
            data = os.urandom(3000)
            got = c.put("fd#lost", data)  # node 1 loses the answer, node 2's resend collapses
            assert not got.collapsed and proxy.dropped == 2
            assert c.stats("fd#lost").total == 2
            tasks = {t.pid: t for t in c.lease("fd#lost", 10, 60)}
            assert tasks["a"].payload() == b"abc" and tasks[got.pid].payload() == data
    finally:
        proxy.close()
        cl.stop()


@pytest.mark.parametrize(("ctype", "body", "status"), [
    ("text/plain", msgpack.packb({"tasks": [{"pid": "a"}]}), 415),  # never a browser's
    ("application/msgpack", b"\xc1garbage", 400),
    ("application/msgpack", msgpack.packb([1, 2]), 400),
    ("application/msgpack", msgpack.packb({"tasks": []}), 400),
    ("application/msgpack", msgpack.packb({"tasks": [{"pid": 5}]}), 400),
    ("application/msgpack", msgpack.packb({"tasks": [{"pid": "a", "x": 1}]}), 400),
    ("application/msgpack", msgpack.packb({"tasks": [{"pid": "a", "payload": "str"}]}), 400),
    ("application/msgpack", msgpack.packb({"tasks": [{"pid": "a", "delay_secs": True}]}),
     400),
    ("application/msgpack", msgpack.packb({"tasks": [{"pid": "a" * 2000}]}), 413),
    ("application/msgpack", msgpack.packb({"tasks": [{"pid": "a",
                                                     "payload": b"x" * (MAX_BYTES + 1)}]}),
     413),
])
def test_front_door_bad_input(cluster: DevCluster, ctype: str, body: bytes,
                              status: int) -> None:
    r = httpx.post(cluster.node_url(1) + "/v1/groups/fd/queues/bad/tasks", content=body,
                   headers={"Content-Type": ctype, **ADMIN}, timeout=30)
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) >= {"code", "message"}


def test_batch_receipts_prove_exactly_their_set(cluster: DevCluster) -> None:
    """A front-door batch is proven by one receipt per node for the whole set of blobs; the
    master accepts it only on references that make up exactly that set (a subset, a
    superset, another size or a receipt of another node's are refused), and still needs
    the write quorum of distinct nodes."""
    key = load_cluster_key(cluster.env.get("SQUALL_CLUSTER_KEY_FILE"))
    http = httpx.Client(base_url=cluster.master_url, headers={
        "Authorization": f"Bearer {cluster.admin}"}, timeout=10)
    nodes = [n["node_id"] for n in http.get("/v1/cluster").json()["nodes"]]
    blobs = [(f"brx-{i}", 10 + i, 100 + i) for i in range(3)]
    now = time.time()
    r1, r2 = (tokens.sign_batch_receipt(key, n, blobs, now) for n in nodes[:2])

    def put(refs: list[tuple[str, int, int]], receipts: list[str], pid: str) -> httpx.Response:
        return http.post("/v1/groups/g/update", json={"enqueue": [
            {"queue": "brx", "pid": f"{pid}-{b}", "payload": {
                "blob_id": b, "size": s, "crc32c": c, "receipts": receipts}}
            for b, s, c in refs]})

    for refs, receipts, why in (
            (blobs[:2], [r1, r2], "covers 3 blob"),
            ([*blobs, ("brx-9", 1, 1)], [r1, r2], "covers 3 blob"),
            ([(blobs[0][0], 99, blobs[0][2]), *blobs[1:]], [r1, r2], "covers 3 blob"),
            (blobs, [r1, r1], "1 valid receipt"),
            (blobs, [r1, r2[:-3] + "AAA"], "signature")):
        r = put(refs, receipts, "bad")
        assert r.status_code == 400 and why in r.json()["error"]["message"], r.text
    st = http.get("/v1/groups/g/queues/brx")  # nothing was applied
    assert st.status_code == 404 or st.json()["total"] == 0, st.text
    r = put(blobs, [r1, r2], "good")
    assert r.status_code == 200, r.text
    assert [e["collapsed"] for e in r.json()["enqueued"]] == [False] * 3
    http.close()


def test_node_commits_share_an_updates_receipts(cluster: DevCluster) -> None:
    """A node's commit names an update's replicas and batch receipts once: they prove the
    update's payloads that carry none of their own (as the front door sends them), only
    within that update; a payload's own receipts are kept, and without any receipt the
    write quorum is missing. Each update is refused or applied on its own."""
    key = load_cluster_key(cluster.env.get("SQUALL_CLUSTER_KEY_FILE"))
    http = httpx.Client(base_url=cluster.master_url, headers={
        "Authorization": f"Bearer {cluster.admin}"}, timeout=10)
    listed = http.get("/v1/cluster").json()["nodes"]
    nodes, addrs = [n["node_id"] for n in listed], [n["address"] for n in listed]
    now = time.time()
    sets = [[(f"nsr{k}-{i}", 10 + i, 100 + i) for i in range(3)] for k in range(2)]
    rs = [[tokens.sign_batch_receipt(key, n, blobs, now) for n in nodes[:2]] for blobs in sets]

    def update(k: int, receipts: list[str], own: dict[int, list[str]] | None = None
               ) -> dict[str, object]:
        return {"group": "g", "receipts": receipts, "replicas": addrs[:2], "enqueue": [
            {"queue": "nsr", "pid": f"{k}-{b}", "payload": {
                "blob_id": b, "size": s, "crc32c": c, "receipts": (own or {}).get(i, [])}}
            for i, (b, s, c) in enumerate(sets[k])]}

    token = tokens.sign(key, "heartbeat", [nodes[0]], now + 60)
    r = httpx.post(cluster.master_url + "/v1/nodes/commit", timeout=10, headers={
        "Authorization": f"Bearer {token}"}, json={"node_id": nodes[0], "updates": [
            update(0, rs[0]),  # proven by its own update's receipts
            update(1, rs[0]),  # another update's receipts: not its set
            update(1, rs[1], own={0: rs[1][:1]}),  # one payload's own: one node only
            update(1, [])]})  # no receipts at all
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [e["collapsed"] for e in results[0]["ok"]["enqueued"]] == [False] * 3
    assert [res["error"]["status"] for res in results[1:]] == [400] * 3, results
    for res, why in zip(results[1:], ("covers 3 blob", "1 valid receipt", "0 valid receipt"),
                        strict=True):
        assert why in res["error"]["message"], res
    st = http.get("/v1/groups/g/queues/nsr")
    assert st.status_code == 200 and st.json()["total"] == 3, st.text
    other = tokens.sign(key, "heartbeat", [nodes[1]], now + 60)  # a valid token, other node
    r = httpx.post(cluster.master_url + "/v1/nodes/commit", timeout=10, headers={
        "Authorization": f"Bearer {other}"}, json={"node_id": nodes[0],
                                                   "updates": [update(1, rs[1])]})
    assert r.status_code == 403 and "does not cover" in r.json()["error"]["message"], r.text
    assert http.get("/v1/groups/g/queues/nsr").json()["total"] == 3  # nothing applied
    http.close()


def test_replicate_batch_answers_one_batch_receipt(cluster: DevCluster) -> None:
    """`/v1/replicate:batch-put?receipt=batch` (the front door's forwards, served by the
    node's fast path) answers one receipt for the whole batch; without a credential it
    stores nothing; an unknown `receipt` value is refused (400) by the documented route."""
    key = load_cluster_key(cluster.env.get("SQUALL_CLUSTER_KEY_FILE"))
    datas = {f"rb-{i}": os.urandom(i * 100) for i in range(5)}
    body = b"".join(encode_frame(b, d) for b, d in datas.items())
    auth = {"Authorization": "Bearer " + tokens.sign(key, "replicate", list(datas),
                                                      time.time() + 60)}
    url = cluster.node_url(1) + "/v1/replicate:batch-put"
    assert httpx.post(url + "?receipt=batch", content=body, timeout=10).status_code == 401
    r = httpx.post(url + "?receipt=bogus", content=body, headers=auth, timeout=10)
    assert r.status_code == 400 and "receipt" in r.text
    r = httpx.post(url + "?receipt=batch", content=body, headers=auth, timeout=10)
    assert r.status_code == 200, r.text
    ans = r.json()
    triples = [(b, len(d), crc32c(d)) for b, d in datas.items()]
    assert tokens.verify_batch_receipt(key, ans["batch_receipt"], triples, ans["node_id"])
    r = httpx.post(url, content=body, headers=auth, timeout=10)  # per-blob receipts
    assert r.status_code == 200 and len(r.json()["blobs"]) == len(datas)
    # several client requests' forwards sharing one request: one batch receipt each
    for bad in ("2,2", "0,5", "x", ",".join(["1"] * 65) + ",0"):
        r = httpx.post(url + f"?receipt=batch&cuts={bad}", content=body, headers=auth,
                       timeout=10)
        assert r.status_code == 400 and "cuts" in r.text, r.text
    r = httpx.post(url + "?receipt=batch&cuts=2,3", content=body, headers=auth, timeout=10)
    assert r.status_code == 200, r.text
    ans = r.json()
    first, second = ans["batch_receipts"]
    assert tokens.verify_batch_receipt(key, first, triples[:2], ans["node_id"])
    assert tokens.verify_batch_receipt(key, second, triples[2:], ans["node_id"])
