"""Decommission under load, with real processes: 2,000 payloads at RF 2 over 4 data nodes,
one node decommissioned while a producer and workers run. Sampled all along: every payload
of the untouched queue is on at least 2 live nodes, byte for byte (read back from the
nodes themselves, not the master's bookkeeping). At the end the node is decommissioned
with zero blobs remaining, it is stopped and forgotten, and nothing was lost."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from squall.client import Client
from squall.client._tasks import NewTask
from squall.client.cli import app
from squall.common.security import tokens
from squall.common.wire.payload import OK
from tests.blobhttp import get_batch
from tests.helpers import DataNodeProcess, MasterProcess, master_auth, start_all, wait_for

KEY = "decommission-test-key-0123456789abcdef"
ENV = {"SQUALL_CLUSTER_KEY": KEY}
BEAT = ["--heartbeat-interval-s", "0.2"]
KEEP, WORK = "load#keep", "load#work"
N_KEEP, N_WORK, N_PRODUCED = 1500, 500, 300


def content(pid: str) -> bytes:
    return (pid.encode() + b"|") * (1 + sum(pid.encode()) % 40)


class Fleet:
    def __init__(self, tmp: Path) -> None:
        self.master = MasterProcess(str(tmp / "master"), env=ENV, extra=[
            *BEAT, "--replication-factor", "2", "--max-copies-per-node", "16",
            # 2 s without a beat: a node starved on a busy machine is not declared dead
            # (and re-replicated, then trimmed) every few seconds
            "--dead-after-beats", "10"])
        self.master.start(timeout=90)
        self.nodes = [DataNodeProcess(str(tmp / f"dn{i}"), env=ENV, extra=[
            "--master", self.master.url, *BEAT, "--node-id", f"dn{i}",
            "--full-report-every", "5", "--copies-max", "16"]) for i in range(4)]
        start_all(self.nodes, timeout=90)  # four at once on a busy machine
        self.http = httpx.Client(base_url=self.master.url, timeout=30,
                                 auth=master_auth(self.master.url))
        wait_for(lambda: sum(n["state"] == "alive" for n in self.info()["nodes"]) == 4,
                 what="4 data nodes alive")

    def info(self) -> dict[str, Any]:
        r = self.http.get("/v1/cluster")
        r.raise_for_status()
        return r.json()

    def node(self, node_id: str) -> dict[str, Any]:
        return self.http.get(f"/v1/nodes/{node_id}").json()

    def close(self) -> None:
        self.http.close()
        for p in [*self.nodes, self.master]:
            p.stop()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    f = Fleet(tmp_path)
    try:
        yield f
    finally:
        f.close()


def blob_ids(http: httpx.Client, queue: str) -> dict[str, str]:
    """blob id -> pid of every task of `queue` (paged through the master)."""
    group, name = queue.split("#")
    out: dict[str, str] = {}
    after = None
    while True:
        params = {"limit": "1000", **({"after": after} if after else {})}
        ans = http.get(f"/v1/groups/{group}/queues/{name}/tasks", params=params).json()
        for t in ans["tasks"]:
            out[t["payload"]["blob_id"]] = t["pid"]
        after = ans.get("next")
        if not after:
            return out


@functools.cache
def read_token(blob_id: str) -> str:
    return tokens.sign(KEY.encode(), "read", [blob_id], time.time() + 600)


def copies_on_nodes(http: httpx.Client, nodes: list[DataNodeProcess], blobs: dict[str, str]
                    ) -> dict[str, int]:
    """How many of `nodes` hold each blob with exactly the bytes written."""
    ids = sorted(blobs)
    toks = [read_token(b) for b in ids]
    count = dict.fromkeys(ids, 0)
    for n in nodes:
        for i in range(0, len(ids), 1000):
            frames = get_batch(http, n.url, ids[i:i + 1000], toks[i:i + 1000])
            for b, f in frames.items():
                if f.status == OK:
                    assert f.data == content(blobs[b]), f"{b} differs on {n.url}"
                    count[b] += 1
    return count


class Load:
    """A producer adding N_PRODUCED tasks to WORK once `go` is set (after the decommission
    was asked: its payloads must all avoid the draining node) and two workers consuming WORK
    (checking every payload), in threads, until stopped; errors are kept for the test."""

    def __init__(self, url: str, work_pids: list[str]) -> None:
        self.url, self.work_pids = url, work_pids
        self.stop, self.go = threading.Event(), threading.Event()
        self.consumed: list[str] = []
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._guard, args=(f,), daemon=True)
                        for f in (self.producer, self.worker, self.worker)]
        for t in self.threads:
            t.start()

    def _guard(self, fn: Any) -> None:
        try:
            fn()
        except BaseException as e:
            self.errors.append(e)

    def producer(self) -> None:
        if not self.go.wait(180):
            raise TimeoutError("the producer was never told to start")
        with Client(self.url) as pc:
            for i in range(N_WORK, N_WORK + N_PRODUCED, 20):
                if self.stop.is_set():
                    return
                pc.put_many(WORK, (NewTask(content(p), pid=p)
                                   for p in self.work_pids[i:i + 20]), batch_size=20)

    def worker(self) -> None:
        with Client(self.url) as wc:
            deadline = time.monotonic() + 120
            while not self.stop.is_set() and time.monotonic() < deadline:
                tasks = wc.lease(WORK, 10, lease_secs=60, wait_secs=0.2)  # long poll
                if not tasks:
                    continue
                for t in tasks:
                    assert t.payload() == content(t.pid), t.pid
                wc.done(tasks)
                self.consumed.extend(t.pid for t in tasks)

    def finish(self) -> None:
        self.stop.set()
        self.go.set()
        for t in self.threads:
            t.join(60)
        assert not self.errors, self.errors


def watch_drain(fleet: Fleet, node_id: str, keep: dict[str, str], load: Load
                ) -> dict[str, Any]:
    """Poll until the node is decommissioned; at every sample, every payload of `keep` is
    on at least 2 nodes. The draining node still serves reads, so it counts as a holder:
    the point is that no payload ever has fewer than RF copies while its copies move."""
    samples = 0

    def sample() -> dict[str, Any] | None:
        nonlocal samples
        state = fleet.node(node_id)
        count = copies_on_nodes(fleet.http, fleet.nodes, keep)
        low = {b: n for b, n in count.items() if n < 2}
        assert not low, f"below RF during decommission: {list(low.items())[:5]}"
        samples += 1
        assert not load.errors, load.errors
        if state["state"] == "decommissioned":
            return state
        assert state["state"] == "draining", state
        return None

    state = wait_for(sample, 180, interval=0.3, what=f"{node_id} decommissioned",
                     fatal=AssertionError)
    assert samples >= 2  # it took some time: the samples did watch the move
    return state


def squall(fleet: Fleet, *args: str, code: int = 0) -> str:
    """The `squall` CLI, in this process, against the fleet's master."""
    r = CliRunner().invoke(app, [*args, "--master", fleet.master.url])
    assert r.exit_code == code, (r.output, r.exception)
    return r.output


def test_decommission_under_load(fleet: Fleet, request: pytest.FixtureRequest) -> None:
    c = Client(fleet.master.url)
    request.addfinalizer(c.close)  # a failure must not leave its socket to the next test
    c.put_many(KEEP, (NewTask(content(p), pid=p) for p in (f"k{i:05d}" for i in range(N_KEEP))),
               batch_size=100)
    work_pids = [f"w{i:05d}" for i in range(N_WORK + N_PRODUCED)]
    c.put_many(WORK, (NewTask(content(p), pid=p) for p in work_pids[:N_WORK]), batch_size=100)
    keep = blob_ids(fleet.http, KEEP)
    assert len(keep) == N_KEEP
    wait_for(lambda: fleet.info()["blobs"] >= N_KEEP + N_WORK, what="block reports")
    # the nodes' own counts come with their next heartbeats (the master knew the copies
    # from the write receipts already): every copy counted before the victim is chosen
    wait_for(lambda: sum(n["blob_count"] for n in fleet.info()["nodes"])
             >= 2 * (N_KEEP + N_WORK), what="the nodes' own blob counts")
    load = Load(fleet.master.url, work_pids)

    victim_id = max(fleet.info()["nodes"], key=lambda n: n["blob_count"])["node_id"]
    victim = fleet.nodes[int(victim_id[2:])]
    assert fleet.node(victim_id)["blob_count"] > N_KEEP // 3
    r = fleet.http.post(f"/v1/nodes/{victim_id}/decommission")
    assert r.status_code == 200 and r.json()["state"] == "draining", r.text
    load.go.set()  # a payload allocated before that could rightly go to the victim
    listing = squall(fleet, "nodes")
    assert victim_id in listing and "draining" in listing and "to move" in listing
    refused = squall(fleet, "nodes", "forget", victim_id, code=1)
    assert "still draining" in refused, refused
    state = watch_drain(fleet, victim_id, keep, load)
    assert state["decommission"]["blobs_remaining"] == 0

    # its blobs have RF copies on the other three nodes, right now
    others = [n for n in fleet.nodes if n is not victim]
    count = copies_on_nodes(fleet.http, others, keep)
    assert min(count.values()) >= 2, sorted(count.items(), key=lambda x: x[1])[:5]

    # no new blob went to it meanwhile: the produced payloads are elsewhere
    load.threads[0].join(60)
    produced = {b: p for b, p in blob_ids(fleet.http, WORK).items() if p >= f"w{N_WORK:05d}"}
    if produced:
        assert max(copies_on_nodes(fleet.http, [victim], produced).values()) == 0

    assert "decommissioned" in squall(fleet, "nodes", "decommission", victim_id, "--wait")
    victim.stop()
    assert f"forgot {victim_id}" in squall(fleet, "nodes", "forget", victim_id)
    assert victim_id not in [n["node_id"] for n in fleet.info()["nodes"]]

    load.finish()
    info = fleet.info()
    assert info["lost"] == 0 and len(info["nodes"]) == 3

    # nothing lost: every work task was consumed once or is still queued, byte-exact
    left = []
    while tasks := c.lease(WORK, 100, lease_secs=60):
        for t in tasks:
            assert t.payload() == content(t.pid)
        left.extend(t.pid for t in tasks)
        c.done(tasks)
    assert len(load.consumed) == len(set(load.consumed))
    assert sorted(load.consumed + left) == work_pids
    assert c.stats(KEEP).total == N_KEEP  # type: ignore[union-attr]
    assert min(copies_on_nodes(fleet.http, others, keep).values()) >= 2
    c.close()
