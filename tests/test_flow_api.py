"""Flow control through every front: REST (and its OpenAPI document), the sync and async
clients (the key on a leased task, pause and resume), the CLI, the Worker's handler and
the Spark writer's `key` column, against a real master process."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import httpx
import pytest
from typer.testing import CliRunner

from squall.client import AsyncClient, Client, NewTask, Worker
from squall.client.cli import app
from tests.helpers import ADMIN, MasterProcess, cluster_fixture

runner = CliRunner()
cluster = cluster_fixture("flowfd", nodes=2)


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    m = MasterProcess(str(tmp_path_factory.mktemp("flow") / "master")).start()
    try:
        yield m.url
    finally:
        m.stop()


def sq(master: str, *args: str, code: int = 0) -> str:
    r = runner.invoke(app, [*args, "--master", master])
    assert r.exit_code == code, (r.output, r.exception)
    return r.output


def test_rest_keys_limits_pause_and_openapi(master: str) -> None:
    with httpx.Client(base_url=master, headers=ADMIN) as h:
        q = "/v1/groups/r/queues/q"
        r = h.put(q + "/policy", json={"key_limit": 1, "key_weights": {"a": 2}})
        assert r.status_code == 200 and r.json()["key_limit"] == 1
        r = h.post(q + "/tasks", json={"tasks": [{"pid": f"p{i}", "key": f"k{i % 2}"}
                                                 for i in range(6)]})
        assert r.status_code == 200
        got = h.post(q + "/lease", json={"max_tasks": 10}).json()["tasks"]
        assert [(t["pid"], t["key"]) for t in got] == [("p0", "k0"), ("p1", "k1")]
        st = h.get(q).json()
        assert (st["blocked"], st["paused"], st["keys"]) == (4, 0, 2)
        assert h.get(q + "/tasks/p2").json()["key"] == "k0"
        # pause a key, then the queue; both are answered with the state
        assert h.post(q + "/pause", json={"key": "k1"}).json() == {
            "paused": False, "paused_keys": ["k1"]}
        assert h.post(q + "/pause", json={}).json()["paused"] is True
        assert h.get(q + "/pause").json() == {"paused": True, "paused_keys": ["k1"]}
        page = h.get("/v1/overview/queues/r/q").json()  # the dashboard's queue page
        assert (page["queue_paused"], page["paused_keys"], page["paused"]) == (
            True, ["k1"], 4)
        assert h.post(q + "/resume", json={}).json()["paused"] is False
        assert h.get("/v1/cluster/stats").json()["blocked"] >= 2
        # bad input: a 400 that says what is wrong, nothing applied
        for body in ({"tasks": [{"pid": "x", "key": "bad key"}]},
                     {"tasks": [{"pid": "x", "key": "k" * 129}]},
                     {"tasks": [{"pid": "x", "key": 5}]}):
            r = h.post(q + "/tasks", json=body)
            assert r.status_code in (400, 422), r.text
        for body in ({"key_limit": 0}, {"rate": -1}, {"key_weights": {"bad key": 1}},
                     {"key_weights": {"a": 0}}):
            assert h.put(q + "/policy", json=body).status_code in (400, 422), body
        assert h.post(q + "/pause", json={"key": "bad key"}).status_code in (400, 422)
        doc = h.get("/openapi.json").json()
        assert "/v1/groups/{group}/queues/{queue}/pause" in doc["paths"]
        assert "key" in doc["components"]["schemas"]["TaskSpec"]["properties"]
        assert "key_limit" in doc["components"]["schemas"]["Policy"]["properties"]
        metrics = h.get("/metrics").text
        assert "squall_queue_blocked" in metrics and "squall_queue_paused" in metrics


def test_clients_and_worker_see_the_key(master: str) -> None:
    with Client(master) as c:
        c.set_policy("c#q", key_limit=1)
        c.put("c#q", pid="a", key="tenant1")
        c.put_many("c#q", [NewTask(pid="b", key="tenant1"), NewTask(pid="c", key="t2")])
        [t1, t2] = c.lease("c#q", 10)
        assert (t1.key, t2.key) == ("tenant1", "t2")
        assert c.stats("c#q").blocked == 1
        c.done([t1, t2])
        assert c.pause("c#q", key="tenant1").paused_keys == ["tenant1"]
        assert c.lease("c#q", 10) == []
        assert c.resume("c#q", key="tenant1").paused_keys == []
        seen: list[tuple[str, str | None]] = []
        Worker(c, ["c#q"], lambda t: seen.append((t.pid, t.key)), burst=True).run()
        assert seen == [("b", "tenant1")]

    async def run() -> None:
        async with AsyncClient(master) as ac:
            await ac.put("c#aq", pid="x", key="k")
            assert (await ac.pause("c#aq")).paused is True
            assert await ac.lease("c#aq", 5) == []
            assert (await ac.pause_state("c#aq")).paused is True
            await ac.resume("c#aq")
            [t] = await ac.lease("c#aq", 5)
            assert t.key == "k"
            await ac.done(t)

    asyncio.run(run())


def test_cli_key_policy_and_pause(master: str) -> None:
    sq(master, "policy", "set", "cli#q", "--key-limit", "2", "--fair", "--weight", "a=3")
    out = sq(master, "policy", "show", "cli#q", "--json")
    assert json.loads(out)["key_limit"] == 2 and json.loads(out)["key_weights"] == {"a": 3}
    assert "leased per key" in sq(master, "policy", "show", "cli#q")
    assert "enqueued 5" in sq(master, "put", "cli#q", "--count", "5", "--key", "a")
    assert "paused" in sq(master, "pause", "cli#q", "--key", "a")
    out = sq(master, "stats", "cli#q")
    assert "PAUSED" in out and "keys a" in out
    assert "not paused" in sq(master, "resume", "cli#q", "--key", "a")
    rows = json.loads(sq(master, "lease", "cli#q", "-n", "5", "--json"))
    assert len(rows) == 2  # the key's limit
    assert "key" in sq(master, "task", "cli#q", rows[0]["pid"])
    assert " a " in sq(master, "tasks", "cli#q")
    sq(master, "policy", "set", "cli#q", "--weight", "nonsense", code=2)


def test_spark_writer_key_column() -> None:
    pa = pytest.importorskip("pyarrow")
    from squall.client.spark._write import WriteOptions, partition_rows

    opts = WriteOptions(None, "g#q", "p", None, "job", key_column="k")
    batch = pa.record_batch({"p": ["a", "b"], "k": ["tenant-1", None]})
    assert [(t.pid, t.key) for t in partition_rows([batch], opts, 0)] == [
        ("a", "tenant-1"), ("b", None)]
    with pytest.raises(ValueError, match="row 0 of partition 3: bad key"):
        list(partition_rows([pa.record_batch({"p": ["a"], "k": ["no spaces"]})], opts, 3))


def test_front_door_carries_the_key(cluster) -> None:  # type: ignore[no-untyped-def]
    """Small payloads go through a data node's front door: the key goes with them."""
    with Client(cluster.master_url) as c:
        c.set_policy("fd#q", key_limit=1)
        c.put_many("fd#q", [NewTask(b"one", pid="a", key="t1"),
                            NewTask(b"two", pid="b", key="t1"),
                            NewTask(b"three", pid="c", key="t2")])
        got = c.lease("fd#q", 10, payloads=True)
        assert [(t.pid, t.key, t.payload()) for t in got] == [("a", "t1", b"one"),
                                                              ("c", "t2", b"three")]
        c.done(got)
