"""Leases answered with their payloads by a data node (``datanode/leasing.py``), with real
processes: the node's answer is exactly what the master leased, with the payloads (those
it holds and those fetched from its peers); acknowledgements ride on it; the client, its
``batches()`` and a ``Worker`` take that path; a credential is needed (the node's and the
master's check); a node SIGKILLed after the master leased and before it answered: the
client leases elsewhere, the lost lease expires and its tasks come back, nothing lost."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx
import orjson
import pytest

from squall.client import Client, NewTask, Worker
from squall.client.cli.dev import DevCluster
from squall.common.checksum import crc32c
from squall.common.errors import Forbidden, Unauthorized
from squall.common.wire.payload import OK, decode_lease_answer
from tests.helpers import ADMIN, cluster_fixture, mint, start_cluster, wait_for

cluster = cluster_fixture("leasevianode")


def _node_lease(url: str, group: str, queue: str, body: dict[str, object],
                headers: dict[str, str] = ADMIN) -> httpx.Response:
    return httpx.post(f"{url}/v1/groups/{group}/queues/{queue}/lease", json=body,
                      headers=headers, timeout=30)


def test_a_node_answers_what_the_master_leased_with_the_payloads(cluster: DevCluster
                                                                 ) -> None:
    blobs = {f"p{i:03d}": os.urandom(100 + 37 * i) for i in range(60)}
    with Client(cluster.master_url, lease_via_node=False) as c:
        assert c.put_many("lvn#a", (NewTask(d, pid=p) for p, d in blobs.items())) == 60
        for i in (1, 2, 3):  # each node leases 20: it holds about two thirds of them
            r = _node_lease(cluster.node_url(i), "lvn", "a",
                            {"max_tasks": 20, "lease_secs": 600})
            assert r.status_code == 200, r.text
            raw, frames = decode_lease_answer(r.content)
            ans = orjson.loads(raw)
            tasks = ans["tasks"]
            assert len(tasks) == 20 and ans["read_token"]
            got = {f.blob_id: f for f in frames}
            for t in tasks:  # exactly the master's lease: it says these are leased
                assert c.task("lvn#a", t["pid"]).state == "leased"
                ref = t["payload"]
                f = got[ref["blob_id"]]  # every payload attached, from here or a peer
                assert f.status == OK and f.data == blobs[t["pid"]]
                assert crc32c(f.data) == ref["crc32c"] == f.crc32c
            assert len(frames) == 20
        s = c.stats("lvn#a")
        assert s.leased == 60 and s.available == 0

        # acknowledgements ride on it: one atomic update on the master
        more = {f"q{i}": os.urandom(64) for i in range(5)}
        c.put_many("lvn#a", (NewTask(d, pid=p) for p, d in more.items()))
        r = _node_lease(cluster.node_url(1), "lvn", "a", {"max_tasks": 5, "lease_secs": 600})
        first = orjson.loads(decode_lease_answer(r.content)[0])["tasks"]
        r = _node_lease(cluster.node_url(2), "lvn", "a", {
            "max_tasks": 5, "lease_secs": 600,
            "dequeue": [{"queue": "a", "pid": t["pid"], "token": t["token"]} for t in first]})
        assert r.status_code == 200, r.text
        ans = orjson.loads(decode_lease_answer(r.content)[0])
        assert ans["dequeued"] == len(first) and ans["leased"] == []
        assert c.stats("lvn#a").total == 60  # the 60 still leased; the others done
        c.reset_leases("lvn#a")
        c.done(c.lease("lvn#a", 100, 60))


def test_the_client_its_batches_and_a_worker_lease_through_nodes(cluster: DevCluster
                                                                  ) -> None:
    data = {f"t{i:04d}": os.urandom(500) for i in range(300)}
    with Client(cluster.master_url, lease_via_node=True) as c:
        nl = c._core.via_node
        assert nl is not None
        c.put_many("lvn#c", (NewTask(d, pid=p) for p, d in data.items()))
        tasks = c.lease("lvn#c", 50, 600, payloads=True)
        assert nl.used == 1 and len(tasks) == 50
        assert all(t.payload_loaded for t in tasks)  # payload() needs no request
        assert {t.pid: t.payload() for t in tasks} == {t.pid: data[t.pid] for t in tasks}
        nxt = c.lease("lvn#c", 50, 600, payloads=True, done=tasks)  # acks ride on it
        assert nl.used == 2 and all(t.finished for t in tasks)
        assert c.stats("lvn#c").total == 250
        seen = {t.pid: t.payload() for t in nxt}
        c.done(nxt)
        with c.batches("lvn#c", 40, 600) as batches:
            for batch in batches:
                seen.update((t.pid, t.payload()) for t in batch)
        assert nl.used > 2 and nl.fallbacks == 0
        assert seen == {p: data[p] for p in seen} and len(seen) == 300 - 50
        assert c.stats("lvn#c").total == 0

        c.put_many("lvn#w", (NewTask(d, pid=p) for p, d in data.items()))
        got: dict[str, bytes] = {}
        lock = threading.Lock()

        def handler(task: object) -> None:
            with lock:
                got[task.pid] = task.payload()  # type: ignore[attr-defined]

        before = _node_leases(cluster)
        w = Worker(c, "lvn#w", handler, concurrency=8, burst=True)
        stats = w.run()
        assert stats.done == 300 and got == data
        assert c.stats("lvn#w").total == 0
        assert _node_leases(cluster) > before  # the Worker's leases went through nodes


def _node_leases(cluster: DevCluster) -> float:
    """Leases the data nodes served (their request metrics)."""
    total = 0.0
    for i in (1, 2, 3):
        text = httpx.get(cluster.node_url(i) + "/metrics", headers=ADMIN, timeout=10).text
        for line in text.splitlines():
            if line.startswith("squall_datanode_http_request_duration_seconds_count") \
                    and "/lease" in line:
                total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_lease_through_a_node_needs_a_credential(cluster: DevCluster) -> None:
    url = cluster.node_url(1)
    r = httpx.post(f"{url}/v1/groups/lvn/queues/a/lease", json={"max_tasks": 1}, timeout=30)
    assert r.status_code == 401
    r = _node_lease(url, "lvn", "a", {"max_tasks": 1},
                    {"Authorization": "Bearer " + mint("producer")})
    assert r.status_code == 403  # the node's check: a producer does not lease
    other = mint("consumer", groups=["other"])
    r = _node_lease(url, "lvn", "a", {"max_tasks": 1}, {"Authorization": f"Bearer {other}"})
    assert r.status_code == 403  # nor a consumer of another group
    with Client(cluster.master_url, token=other, lease_via_node=True) as c, \
            pytest.raises(Forbidden):
        c.lease("lvn#a", 1, 60, payloads=True)
    with Client(cluster.master_url, token="not-a-credential", lease_via_node=True) as c, \
            pytest.raises(Unauthorized):
        c.lease("lvn#a", 1, 60, payloads=True)


def test_a_node_killed_mid_lease_loses_nothing(tmp_path: Path) -> None:
    cl = start_cluster(tmp_path / "cl", 3)
    try:
        crashing, good = cl.node_url(1), cl.node_url(2)
        cl.kill_node(1)  # node 1 comes back armed to SIGKILL itself once the master leased
        cl.env = {**cl.env, "SQUALL_TEST_CRASH": "lease_after_master"}
        cl.start_node(1)
        cl.wait_ready(crashing, cl.node_procs[1], "node-1", 60)
        cl.wait_alive(3)
        data = {f"k{i:03d}": os.urandom(300) for i in range(30)}
        with Client(cl.master_url, lease_via_node=True) as c:
            c.put_many("lvn#kill", (NewTask(d, pid=p) for p, d in data.items()))
            nl = c._core.via_node
            assert nl is not None
            c.cluster()
            nl.nodes.urls, nl.nodes.at = [crashing, good], 1e18  # the first lease to node 1
            nl.nodes.turn = -1
            tasks = c.lease("lvn#kill", 5, 2.0, payloads=True)  # node 1 dies; node 2 leases
            wait_for(lambda: cl.node_procs[1].poll() is not None, 10, what="node 1 died")
            assert len(tasks) == 5 and nl.used == 1
            assert {t.pid: t.payload() for t in tasks} == {t.pid: data[t.pid] for t in tasks}
            s = c.stats("lvn#kill")
            assert s.leased == 10  # node 1's lease and node 2's: the first one was lost
            c.done(tasks)
            seen = {t.pid for t in tasks}
            attempts: dict[str, int] = {}

            def drain() -> bool:
                got = c.lease("lvn#kill", 30, 60, payloads=True, wait_secs=1)
                for t in got:
                    assert t.payload() == data[t.pid]
                    seen.add(t.pid)
                    attempts[t.pid] = t.attempts
                c.done(got)
                return len(seen) == 30

            wait_for(drain, 60, interval=0.1, what="every task, the lost lease's too")
            assert seen == set(data) and c.stats("lvn#kill").total == 0
            assert sorted(attempts.values()).count(2) == 5  # the 5 of the lost lease, again
    finally:
        cl.stop()


def test_payloads_are_read_from_as_few_nodes_as_their_replicas_allow() -> None:
    from squall.common.wire.payload import fewest_nodes

    # RF 2 on three nodes: any two cover everything; here "a" holds most of them
    assert fewest_nodes([["a", "b"], ["b", "c"], ["a", "c"], ["c", "a"], ["b", "a"]]) == \
        ["a", "b", "a", "a", "a"]
    assert fewest_nodes([["x", "y"]] * 3) == ["x"] * 3  # ties: the best-ranked replica
    assert fewest_nodes([["a"], [], ["c"]]) == ["a", "", "c"]  # no replica: none
