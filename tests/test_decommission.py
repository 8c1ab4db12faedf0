"""Decommission and forget, in-process (injected clock, heartbeats sent by the test): the
master moves a draining node's blobs away node to node, never counts its copies toward the
replication factor, places nothing new on it, declares it decommissioned only after a full
block report, keeps the request across a restart, and forgets only dead or decommissioned
nodes. The real-process version under load is in tests/test_decommission_load.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from squall.common.clock import ManualClock
from squall.common.wire.cluster import (
    HeartbeatRequest,
    ReplicateBatchCommand,
    ReplicateCommand,
    ReplicationReport,
)
from squall.master.cluster import blobgc
from squall.master.http.app import create_master_app
from squall.master.service import Master, MasterSettings
from tests.helpers import ADMIN, asgi_master

G = "/v1/groups/g"
NODES = ["n1", "n2", "n3", "n4"]


def addr(node: str) -> str:
    return f"http://{node}.test:7071"


class Fleet:
    """Heartbeats for fake data nodes that hold what the test says they hold."""

    def __init__(self, m: Master) -> None:
        self.m = m
        self.held: dict[str, set[str]] = {n: set() for n in NODES}
        self.commands: dict[str, list[object]] = {n: [] for n in NODES}

    def beat(self, node: str, full: bool = True,
             replicated: list[ReplicationReport] | None = None) -> None:
        ans = self.m.cluster.heartbeat(HeartbeatRequest(
            node_id=node, address=addr(node), started_at=1.0, seq=1, capacity_bytes=1 << 30,
            used_bytes=len(self.held[node]), free_bytes=1 << 29,
            blob_count=len(self.held[node]), full=full, blob_ids=sorted(self.held[node]),
            replicated=replicated or []))
        self.commands[node].extend(ans.commands)

    def beat_all(self, nodes: list[str] | None = None) -> None:
        for n in nodes or list(self.held):
            self.beat(n)

    def run_copies(self) -> int:
        """Every node carries out its replicate commands and reports them."""
        done = 0
        for node, cmds in self.commands.items():
            reports = []
            for c in cmds:
                if isinstance(c, ReplicateCommand | ReplicateBatchCommand):
                    ids = c.blob_ids if isinstance(c, ReplicateBatchCommand) else [c.blob_id]
                    target = next(n for n in NODES if addr(n) == c.target)
                    for b in ids:
                        assert b in self.held[node], "copy from a node that lacks the blob"
                        self.held[target].add(b)
                        reports.append(ReplicationReport(blob_id=b, target=c.target, ok=True))
                        done += 1
            cmds.clear()
            if node in self.held:
                self.beat(node, replicated=reports)
        return done


@pytest.fixture
async def env(tmp_path) -> AsyncIterator[tuple[httpx.AsyncClient, Master, ManualClock]]:  # type: ignore[no-untyped-def]
    clock = ManualClock()
    settings = MasterSettings(data_dir=str(tmp_path / "m"), require_receipts=False)
    async with asgi_master(settings, clock) as (c, m):
        yield c, m, clock


async def enqueue_blobs(c: httpx.AsyncClient, fleet: Fleet, count: int) -> list[str]:
    """`count` referenced blobs, each on two of n1..n3 (n4 stays empty)."""
    ids = [f"b{i}" for i in range(count)]
    tasks = [{"pid": b, "payload": {"blob_id": b, "size": 1, "crc32c": 0}} for b in ids]
    r = await c.post(f"{G}/queues/q/tasks", json={"tasks": tasks})
    assert r.status_code == 200, r.text
    for i, b in enumerate(ids):
        fleet.held[NODES[i % 3]].add(b)
        fleet.held[NODES[(i + 1) % 3]].add(b)
    return ids


def copies(m: Master, b: str) -> int:
    return len(m.cluster.live_holders(b))


async def test_decommission_moves_every_blob_then_forget(env) -> None:  # type: ignore[no-untyped-def]
    c, m, clock = env
    fleet = Fleet(m)
    ids = await enqueue_blobs(c, fleet, 60)
    fleet.beat_all()
    on_n1 = sorted(fleet.held["n1"])
    assert len(on_n1) == 40

    r = await c.post("/v1/nodes/n1/decommission")
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "draining"
    assert r.json()["decommission"]["requested_at"] == clock.now()
    again = await c.post("/v1/nodes/n1/decommission")  # idempotent: same request time
    assert again.json()["decommission"] == r.json()["decommission"]

    # no new blob goes to a draining node
    for _ in range(20):
        a = (await c.post("/v1/blobs/allocate", json={"count": 1})).json()
        assert addr("n1") not in a["blobs"][0]["replicas"]

    # it may not be forgotten while draining
    r = await c.delete("/v1/nodes/n1")
    assert r.status_code == 409 and "draining" in r.json()["error"]["message"]

    rounds = 0
    while True:
        clock.advance(1.0)
        await m.tick()
        state = (await c.get("/v1/nodes/n1")).json()
        if state["state"] == "decommissioned":
            break
        assert all(copies(m, b) >= 2 for b in ids), "a blob dropped below RF"
        moved = fleet.run_copies()
        rounds += 1
        assert rounds < 100, state
        assert moved or state["decommission"]["blobs_remaining"] != 0
    assert state["decommission"]["blobs_remaining"] == 0
    assert state["health"] == "alive"
    # every blob it held has RF copies on other nodes; it kept its own (reads still work)
    for b in on_n1:
        others = [h for h in m.cluster.holders[b] if h != "n1"]
        assert len(others) >= 2, (b, others)
        assert b in fleet.held["n1"]
    assert m.cluster.info()["under_replicated"] == 0

    r = await c.delete("/v1/nodes/n1")
    assert r.status_code == 200 and r.json() == {"forgotten": "n1"}
    assert "n1" not in [n["node_id"] for n in (await c.get("/v1/cluster")).json()["nodes"]]
    assert (await c.get("/v1/nodes/n1")).status_code == 404
    assert all(copies(m, b) >= 2 for b in ids)

    # a forgotten node that heartbeats again rejoins as a new node; its copies are extras
    fleet.beat("n1")
    clock.advance(1.0)
    await m.tick()
    assert (await c.get("/v1/nodes/n1")).json()["state"] == "alive"
    assert all(copies(m, b) <= 3 for b in ids)


async def test_forget_refuses_a_live_node_and_takes_a_dead_one(env) -> None:  # type: ignore[no-untyped-def]
    c, m, clock = env
    fleet = Fleet(m)
    ids = await enqueue_blobs(c, fleet, 9)
    fleet.beat_all()
    r = await c.delete("/v1/nodes/n2")
    assert r.status_code == 409
    err = r.json()["error"]
    assert err["code"] == "conflict" and "decommission it first" in err["message"]
    assert (await c.delete("/v1/nodes/nope")).status_code == 404
    # RF 2 over n1..n4: decommissioning three would leave one node to hold two copies
    for n in ("n1", "n3"):
        assert (await c.post(f"/v1/nodes/{n}/decommission")).status_code == 200
    r = await c.post("/v1/nodes/n4/decommission")
    assert r.status_code == 409 and "add a data node first" in r.json()["error"]["message"]
    for n in ("n1", "n3"):
        assert (await c.delete(f"/v1/nodes/{n}/decommission")).json()["state"] == "alive"
    assert (await c.post("/v1/nodes/nope/decommission")).status_code == 404

    clock.advance(10 * m.settings.cluster.heartbeat_interval_s)  # n2 stops beating
    fleet.beat_all(["n1", "n3", "n4"])
    await m.tick()
    assert (await c.get("/v1/nodes/n2")).json()["state"] == "dead"
    r = await c.delete("/v1/nodes/n2")
    assert r.status_code == 200
    assert sorted(n["node_id"] for n in (await c.get("/v1/cluster")).json()["nodes"]) == [
        "n1", "n3", "n4"]
    assert all(b in m.cluster.holders for b in ids)  # n1/n3 copies remain


async def test_decommissioned_needs_a_full_report_and_survives_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    clock = ManualClock()
    settings = MasterSettings(data_dir=str(tmp_path / "m"), require_receipts=False)
    app = create_master_app(settings, clock=clock, background=False)
    async with app.router.lifespan_context(app):
        m: Master = app.state.master
        fleet = Fleet(m)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1", headers=ADMIN) as c:
            await enqueue_blobs(c, fleet, 6)
            fleet.beat_all()
            assert (await c.post("/v1/nodes/n3/decommission")).status_code == 200
            # cancel and mark again: the mark is a persisted on/off switch
            r = await c.delete("/v1/nodes/n3/decommission")
            assert r.json()["state"] == "alive" and r.json()["decommission"] is None
            assert (await c.post("/v1/nodes/n3/decommission")).status_code == 200

    app = create_master_app(settings, clock=clock, background=False)
    async with app.router.lifespan_context(app):
        m = app.state.master
        fleet2 = Fleet(m)
        fleet2.held = fleet.held
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1", headers=ADMIN) as c:
            r = (await c.get("/v1/nodes/n3")).json()
            assert r["state"] == "draining" and r["health"] == "unknown"
            # an incremental beat (the node does not know the master restarted) proves
            # nothing: the node must not look empty, hence decommissioned
            fleet2.beat("n3", full=False)
            clock.advance(1.0)
            await m.tick()
            r = (await c.get("/v1/nodes/n3")).json()
            assert r["state"] == "draining" and r["decommission"]["blobs_remaining"] is None
            fleet2.beat_all()
            for _ in range(20):
                clock.advance(1.0)
                await m.tick()
                if (await c.get("/v1/nodes/n3")).json()["state"] == "decommissioned":
                    break
                fleet2.run_copies()
            else:
                raise AssertionError("n3 never became decommissioned")
            for _ in range(10):  # still no new blobs after the restart
                a = (await c.post("/v1/blobs/allocate", json={"count": 1})).json()
                assert addr("n3") not in a["blobs"][0]["replicas"]


async def test_a_pending_delete_is_neither_recounted_nor_copied_to(env) -> None:  # type: ignore[no-untyped-def]
    """Races of trims with block reports and copies that could leave a blob below RF: a
    report made before a delete arrived does not count the doomed copy again (which would
    trim a second, real one), and no copy goes to a node that has yet to get that delete."""
    c, m, clock = env
    fleet = Fleet(m)
    r = await c.post(f"{G}/queues/q/tasks", json={"tasks": [
        {"pid": "x", "payload": {"blob_id": "b", "size": 1, "crc32c": 0}}]})
    assert r.status_code == 200
    for n in ("n1", "n2", "n3"):
        fleet.held[n].add("b")
    fleet.beat_all()
    # copies proven by receipts (a write's, or copies' reports): only those are ever trimmed
    m.cluster.record_holders("b", ["n1", "n2", "n3"])
    await m.tick()  # three copies at RF 2: one is trimmed
    doomed = [n for n in NODES if m.cluster.commands.get(n)]
    assert len(doomed) == 1, m.cluster.commands
    [victim] = doomed
    # the doomed node's next (full) report still lists the blob: it must not count
    ans = m.cluster.heartbeat(HeartbeatRequest(
        node_id=victim, address=addr(victim), started_at=1.0, seq=2, capacity_bytes=1 << 30,
        used_bytes=1, free_bytes=1 << 29, blob_count=1, full=True, blob_ids=["b"]))
    assert [cmd.op for cmd in ans.commands] == ["delete"]  # delivered with this answer
    assert victim not in m.cluster.holders["b"]
    await m.tick()
    assert not any(m.cluster.commands.get(n) for n in NODES)  # no second trim
    assert len(m.cluster.holders["b"]) == 2

    # a trim queued for a node that has not beaten yet: no copy of that blob goes there,
    # even to the least used node
    src, pending = sorted(m.cluster.holders["b"])
    blobgc.delete(m.cluster, "b", [m.cluster.nodes[pending]])
    for n in m.cluster.nodes.values():
        n.used_bytes = 0 if n.node_id == pending else 100
    m.cluster.repair.want("b", 1)
    m.cluster._plan(clock.now())
    [copy] = [cmd for cmd in m.cluster.commands[src]
              if isinstance(cmd, ReplicateCommand | ReplicateBatchCommand)]
    ids = copy.blob_ids if isinstance(copy, ReplicateBatchCommand) else [copy.blob_id]
    assert copy.target != addr(pending) and ids == ["b"]


async def test_a_drain_says_what_uncommitted_uploads_it_waits_for(env) -> None:  # type: ignore[no-untyped-def]
    """An upload allocated on the draining node and not (yet) enqueued has nothing to copy:
    the drain waits for its enqueue or the end of its orphan grace, and says so (count and
    how long at most) instead of "1 blob(s) to move" with no copy in flight."""
    c, m, clock = env
    fleet = Fleet(m)
    fleet.beat_all()
    a = (await c.post("/v1/blobs/allocate", json={"count": 1})).json()["blobs"][0]
    holder = next(n for n in NODES if addr(n) in a["replicas"])
    fleet.held[holder].add(a["blob_id"])  # written, never enqueued
    fleet.beat(holder)
    r = await c.post(f"/v1/nodes/{holder}/decommission")
    assert r.status_code == 200, r.text
    clock.advance(m.cluster.s.heartbeat_interval_s + 1)
    fleet.beat_all()
    await m.tick()
    d = (await c.get(f"/v1/nodes/{holder}")).json()["decommission"]
    grace = m.cluster.s.orphan_grace_s
    assert d["blobs_remaining"] == 1 and d["uploads_uncommitted"] == 1, d
    assert 0 < d["uncommitted_wait_secs"] <= grace
    assert fleet.run_copies() == 0  # nothing to copy: no task refers to it
    # its grace ends: no longer waited for, the node is decommissioned
    clock.advance(grace + 1)
    fleet.beat_all()  # the nodes stay alive meanwhile
    await m.tick()
    clock.advance(m.cluster.s.heartbeat_interval_s + 1)  # the next recount of the drain
    fleet.beat_all()
    await m.tick()
    state = (await c.get(f"/v1/nodes/{holder}")).json()
    assert state["state"] == "decommissioned", state
    assert state["decommission"]["uploads_uncommitted"] == 0


def test_the_cli_says_what_a_drain_waits_for() -> None:
    from squall.client.cli.nodes import _uncommitted
    from squall.common.wire.models import NodeStatus

    base = {"node_id": "n1", "address": addr("n1"), "state": "draining",
            "last_beat_secs_ago": 0.5, "capacity_bytes": 1, "used_bytes": 0, "free_bytes": 1,
            "blob_count": 1}
    n = NodeStatus.model_validate({**base, "decommission": {
        "requested_at": 1.0, "blobs_remaining": 3, "uploads_uncommitted": 2,
        "uncommitted_wait_secs": 412.4}})
    assert _uncommitted(n) == "; 2 upload(s) not yet committed, waiting up to 412s"
    n = NodeStatus.model_validate({**base, "decommission": {"requested_at": 1.0,
                                                            "blobs_remaining": 3}})
    assert _uncommitted(n) == ""
