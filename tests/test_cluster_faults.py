"""Cluster faults with real processes: the second holder dies during repair, dead nodes come
back, and a corrupted replica is dropped and repaired. Nothing that still had a good copy is
lost, losses are reported, and every byte read back is identical."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import httpx

from squall.common.security.tokens import sign
from tests.blobhttp import get_blob
from tests.dn_kit import data_file, flip_bytes_in_file
from tests.helpers import DataNodeProcess, wait_for
from tests.test_cluster import KEY, Cluster, enqueue

G = "/v1/groups/g"


def settled(c: Cluster) -> bool:
    i = c.info()
    return i["under_replicated"] == 0 and i["copies_in_flight"] == 0


def read_ok(c: Cluster, url: str, blob_id: str, want: bytes) -> bool:
    tok = sign(KEY.encode(), "read", [blob_id], 2e9)
    try:
        return get_blob(c.http, url, blob_id, tok) == want
    except Exception:
        return False


def load(c: Cluster, n: int, size: int) -> dict[str, bytes]:
    datas = {}
    for i in range(n):
        data = hashlib.sha256(str(i).encode()).digest() * (size // 32)
        ref = c.put(data)
        assert enqueue(c, f"b{i:03d}", ref).status_code == 200
        datas[ref["blob_id"]] = data
    return datas


def test_second_holder_dies_during_repair_then_nodes_return(tmp_path: Path) -> None:
    c = Cluster(tmp_path, nodes=4)
    try:
        datas = load(c, 40, 64 << 10)
        a, b = c.nodes[0], c.nodes[1]
        a.kill9()
        wait_for(lambda: any(n["state"] == "dead" for n in c.info()["nodes"]), timeout=10,
                 what="first death noticed")
        b.kill9()  # while copies of a's blobs are still being planned or in flight
        wait_for(lambda: sum(n["state"] == "dead" for n in c.info()["nodes"]) == 2,
                 timeout=10, what="second death noticed")
        wait_for(lambda: settled(c), timeout=60, interval=0.2, what="repair to settle")
        survivors = [n for n in c.nodes if n not in (a, b)]
        lost = 0
        for blob, data in datas.items():
            holders = [n.url for n in survivors if read_ok(c, n.url, blob, data)]
            assert len(holders) in (0, 2), (blob, holders)
            lost += not holders
        assert c.info()["lost"] == lost  # what had no surviving copy is reported, not hidden
        # the dead nodes come back with their data: everything is whole again, and extra
        # copies are trimmed back to the replication factor
        for n in (a, b):
            n.start()
        wait_for(lambda: c.alive() == 4 and c.info()["lost"] == 0 and settled(c)
                 and all(len(holders_of(c, blob)) == 2 for blob in datas),
                 timeout=60, interval=0.3, what="returning nodes to restore every blob")
        for blob, data in datas.items():
            assert all(read_ok(c, u, blob, data) for u in holders_of(c, blob))
    finally:
        c.close()


def holders_of(c: Cluster, blob: str) -> list[str]:
    tok = sign(KEY.encode(), "read", [blob], 2e9)
    return c.holders(blob, tok)


def test_corrupt_replica_is_dropped_and_repaired(tmp_path: Path) -> None:
    c = Cluster(tmp_path, nodes=3)
    try:
        data = b"".join(hashlib.sha256(b"corrupt-%d" % i).digest() for i in range(4096))
        ref = c.put(data)
        assert enqueue(c, "x", ref).status_code == 200
        bad: DataNodeProcess = c.node(ref["replicas"][0])
        assert flip_bytes_in_file(data_file(bad.data_dir), data[50_000:50_032]) >= 1
        task: Any = c.http.get(f"{G}/queues/q/tasks/x").json()["payload"]
        # the damaged replica fails loudly instead of returning wrong bytes
        try:
            got = get_blob(c.http, bad.url, ref["blob_id"], task["token"])
        except (httpx.HTTPError, Exception):
            got = None
        assert got is None
        # ...is dropped, reported, and the blob is copied back to two good replicas
        wait_for(lambda: settled(c) and len(holders_of(c, ref["blob_id"])) == 2
                 and all(read_ok(c, u, ref["blob_id"], data)
                         for u in holders_of(c, ref["blob_id"])),
                 timeout=30, interval=0.2, what="corrupt replica repaired")
    finally:
        c.close()
