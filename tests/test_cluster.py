"""A master and three data nodes as real processes: payloads written with receipts, leased
with read tokens, re-replicated after kill -9 of a holder, collected after dequeue, and
orphans collected after their grace period. The master never touches payload bytes."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from squall.common.errors import Forbidden
from tests.blobhttp import get_blob, put_blob
from tests.helpers import ADMIN, DataNodeProcess, MasterProcess, wait_for

KEY = "test-cluster-key-0123456789abcdef"
ENV = {"SQUALL_CLUSTER_KEY": KEY}
BEAT = ["--heartbeat-interval-s", "0.2"]
G = "/v1/groups/g"


class Cluster:
    def __init__(self, tmp: Path, nodes: int = 3) -> None:
        self.master = MasterProcess(str(tmp / "master"), env=ENV, extra=[
            *BEAT, "--dead-after-beats", "3", "--orphan-grace-s", "3",
            "--replication-factor", "2"]).start()
        self.nodes = [DataNodeProcess(str(tmp / f"dn{i}"), env=ENV, extra=[
            "--master", self.master.url, *BEAT, "--full-report-every", "5"]).start()
            for i in range(nodes)]
        self.http = httpx.Client(base_url=self.master.url, timeout=30, headers=ADMIN)
        wait_for(lambda: self.alive() == nodes, what="data nodes alive")

    def info(self) -> Any:
        return self.http.get("/v1/cluster").json()

    def alive(self) -> int:
        return sum(n["state"] == "alive" for n in self.info()["nodes"])

    def node(self, url: str) -> DataNodeProcess:
        return next(n for n in self.nodes if n.url == url.rstrip("/"))

    def put(self, data: bytes) -> dict[str, Any]:
        """Allocate, write through the data nodes, and return the payload reference."""
        a = self.http.post("/v1/blobs/allocate", json={"count": 1,
                                                       "size_bytes": len(data)}).json()
        b = a["blobs"][0]
        res = put_blob(self.http, b["replicas"][0], b["blob_id"], data, a["token"],
                       replicas=b["replicas"][1:])
        assert len(res.stored) == 2, res
        return {"blob_id": b["blob_id"], "size": res.size, "crc32c": res.crc32c,
                "replicas": [s.address for s in res.stored],
                "receipts": [s.receipt for s in res.stored]}

    def holders(self, blob_id: str, token: str) -> list[str]:
        out = []
        for n in self.nodes:
            if n.proc is None or n.proc.poll() is not None:
                continue
            r = self.http.head(f"{n.url}/v1/blobs/{blob_id}",
                               headers={"Authorization": f"Bearer {token}"})
            if r.status_code == 200:
                out.append(n.url)
        return out

    def close(self) -> None:
        self.http.close()
        for p in [*self.nodes, self.master]:
            p.stop()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


def enqueue(c: Cluster, pid: str, payload: dict[str, Any]) -> httpx.Response:
    return c.http.post(f"{G}/queues/q/tasks", json={"tasks": [{"pid": pid,
                                                               "payload": payload}]})


def test_payloads_replicate_repair_and_collect(cluster: Cluster) -> None:
    c = cluster
    rng = random.Random(7)
    datas = {f"t{i}": rng.randbytes(n) for i, n in enumerate([0, 1, 1 << 20, 4096, 777])}
    refs = {pid: c.put(d) for pid, d in datas.items()}
    # the master accepts a reference only with a write quorum of valid receipts
    bad = dict(refs["t1"], receipts=refs["t1"]["receipts"][:1])
    assert enqueue(c, "x", bad).status_code == 400
    forged = dict(refs["t1"], receipts=[r[:-4] + "AAAA" for r in refs["t1"]["receipts"]])
    assert enqueue(c, "x", forged).status_code == 400
    wrong_size = dict(refs["t1"], size=2)
    assert enqueue(c, "x", wrong_size).status_code == 400
    for pid, ref in refs.items():
        assert enqueue(c, pid, ref).status_code == 200

    other = c.put(b"not in the lease answer")
    ans = c.http.post(f"{G}/queues/q/lease", json={"max_tasks": 10, "lease_secs": 300}).json()
    leased, read_token = ans["tasks"], ans["read_token"]
    assert len(leased) == 5
    for t in leased:  # one read token for the answer, none per payload
        p = t["payload"]
        assert len(p["replicas"]) == 2 and "token" not in p
        p["token"] = read_token
        assert get_blob(c.http, p["replicas"][0], p["blob_id"], read_token) == datas[t["pid"]]
    with pytest.raises(Forbidden, match="does not cover"):  # only the answer's payloads
        get_blob(c.http, other["replicas"][0], other["blob_id"], read_token)

    # kill -9 a node holding replicas: every blob is copied back to 2 live replicas
    victim = c.node(leased[2]["payload"]["replicas"][0])
    victim.kill9()
    wait_for(lambda: any(n["state"] == "dead" for n in c.info()["nodes"]), timeout=10,
             what="the master to see the dead node")

    def repaired() -> bool:
        return all(len(c.holders(t["payload"]["blob_id"], t["payload"]["token"])) == 2
                   for t in leased) and c.info()["under_replicated"] == 0

    wait_for(repaired, timeout=30, interval=0.2, what="re-replication")
    for t in leased:  # every byte still identical, read from the new replicas
        p = c.http.get(f"{G}/queues/q/tasks/{t['pid']}").json()["payload"]
        live = [u for u in p["replicas"] if u != victim.url]
        assert get_blob(c.http, live[-1], p["blob_id"], p["token"]) == datas[t["pid"]]

    # dequeued tasks' payloads are deleted from the data nodes
    done = leased[:2]
    r = c.http.post(f"{G}/update", json={"dequeue": [
        {"queue": "q", "pid": t["pid"], "token": t["token"]} for t in done]})
    assert r.status_code == 200
    wait_for(lambda: all(not c.holders(t["payload"]["blob_id"], t["payload"]["token"])
                         for t in done), timeout=20, interval=0.2, what="blob GC")
    assert all(c.holders(t["payload"]["blob_id"], t["payload"]["token"]) for t in leased[2:])


def test_orphans_are_collected_and_dead_nodes_avoided(cluster: Cluster) -> None:
    c = cluster
    orphan = c.put(b"never committed")
    tok = c.http.post(f"{G}/queues/o/tasks", json={"tasks": [{"pid": "keep",
                                                              "payload": c.put(b"kept")}]})
    assert tok.status_code == 200
    kept = c.http.get(f"{G}/queues/o/tasks/keep").json()["payload"]
    read = dict(kept)
    from squall.common.security.tokens import sign

    read_tok = sign(KEY.encode(), "read", [orphan["blob_id"]], 2e9)
    assert c.holders(orphan["blob_id"], read_tok)
    wait_for(lambda: not c.holders(orphan["blob_id"], read_tok), timeout=30, interval=0.3,
             what="orphan collection")
    assert len(c.holders(read["blob_id"], read["token"])) == 2
    # a dead node gets no new blobs once the master has noticed
    c.nodes[0].kill9()
    wait_for(lambda: c.alive() == 2, timeout=10, what="dead node noticed")
    for _ in range(5):
        a = c.http.post("/v1/blobs/allocate", json={"count": 3}).json()
        assert c.nodes[0].url not in a["blobs"][0]["replicas"]
    c.nodes[1].kill9()
    wait_for(lambda: c.alive() == 1, timeout=10, what="second dead node noticed")
    r = c.http.post("/v1/blobs/allocate", json={"count": 1})
    assert r.status_code == 503 and "data node" in r.json()["error"]["message"]
    assert os.path.exists(c.nodes[0].data_dir)
