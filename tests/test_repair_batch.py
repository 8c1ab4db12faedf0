"""Re-replication of many small blobs with real processes: batched node-to-node copies after
kill -9 of a holder, per-blob outcomes when a source blob is corrupt or missing, a source
that dies in the middle of a repair, and blobs no live node reports after a master restart.

Blobs are written where each test wants them (write tokens signed with the test cluster
key, the data nodes' batch form), then committed to the master with their receipts."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from squall.common.checksum import crc32c
from squall.common.errors import NotFound
from squall.common.security.tokens import sign, verify_receipt
from squall.common.wire.cluster import ReplicationReport
from squall.common.wire.payload import OK
from tests import blobhttp
from tests.dn_kit import ENV as DN_ENV
from tests.dn_kit import KEY as DN_KEY
from tests.dn_kit import FakeMaster, data_file, flip_bytes_in_file, node_id_of, tok
from tests.helpers import (
    ADMIN,
    DataNodeProcess,
    MasterProcess,
    master_auth,
    running_app,
    start_all,
    wait_for,
)

KEY = b"test-repair-cluster-key-0123456789"
ENV = {"SQUALL_CLUSTER_KEY": KEY.decode()}
BEAT = ["--heartbeat-interval-s", "0.2"]
Q = "/v1/groups/g/queues/q"


class Cluster:
    """A master and data nodes as real processes (0.2 s beats), written to directly."""

    def __init__(self, tmp: Path, nodes: int, master_extra: tuple[str, ...] = ()) -> None:
        self.tmp = tmp
        self.master = MasterProcess(str(tmp / "master"), env=ENV, extra=[
            *BEAT, "--dead-after-beats", "3", "--replication-factor", "2",
            *master_extra]).start()
        self.nodes = [DataNodeProcess(str(tmp / f"dn{i}"), env=ENV, extra=[
            "--master", self.master.url, *BEAT, "--scrub-bytes-per-s", "0"])
            for i in range(nodes)]
        start_all(self.nodes)
        self.http = httpx.Client(base_url=self.master.url, timeout=60,
                                 auth=master_auth(self.master.url))
        wait_for(lambda: self.alive() == nodes, what="data nodes alive")

    def info(self) -> Any:
        return self.http.get("/v1/cluster").json()

    def alive(self) -> int:
        return sum(n["state"] == "alive" for n in self.info()["nodes"])

    def dead(self) -> int:
        return sum(n["state"] == "dead" for n in self.info()["nodes"])

    def write(self, nodes: list[DataNodeProcess], blobs: dict[str, bytes]) -> None:
        """Store `blobs` on exactly `nodes` and commit one task per blob to the master."""
        items = list(blobs.items())
        for i in range(0, len(items), 1000):
            part = items[i:i + 1000]
            urls = [n.url for n in nodes]
            t = sign(KEY, "write", [b for b, _ in part], time.time() + 120, replicas=urls)
            res = blobhttp.put_batch(self.http, urls[0], part, t, replicas=urls[1:])
            tasks = [{"pid": r.blob_id, "payload": {
                "blob_id": r.blob_id, "size": r.size, "crc32c": r.crc32c,
                "replicas": [s.address for s in r.stored],
                "receipts": [s.receipt for s in r.stored]}} for r in res.blobs]
            r = self.http.post(f"{Q}/tasks", json={"tasks": tasks})
            assert r.status_code == 200, r.text

    def copies(self, blobs: dict[str, bytes]) -> dict[str, int]:
        """Good copies of each blob on the running nodes (read back and compared)."""
        out = dict.fromkeys(blobs, 0)
        ids = list(blobs)
        for n in self.nodes:
            if n.proc is None or n.proc.poll() is not None:
                continue
            for i in range(0, len(ids), 1000):
                part = ids[i:i + 1000]
                t = sign(KEY, "read", part, time.time() + 60)
                got = blobhttp.get_batch(self.http, n.url, part, t)
                for b, f in got.items():
                    if f.status == OK and f.data == blobs[b]:
                        out[b] += 1
        return out

    def settled(self) -> bool:
        i = self.info()
        return (i["under_replicated"] == 0 and i["copies_in_flight"] == 0
                and i["copies_waiting"] == 0 and i["lost"] == 0)

    def close(self) -> None:
        self.http.close()
        for p in [*self.nodes, self.master]:
            p.stop()


def tiny(n: int, tag: str, size: int = 1024) -> dict[str, bytes]:
    return {f"{tag}-{i:05d}": os.urandom(size) for i in range(n)}


def test_a_dead_node_with_2000_tiny_blobs_is_repaired_in_batches(tmp_path: Path) -> None:
    c = Cluster(tmp_path, nodes=3)
    try:
        a, b, _ = c.nodes
        blobs = tiny(2000, "t")
        c.write([a, b], blobs)
        wait_for(lambda: c.info()["blobs"] >= 2000 and c.settled(), what="written")
        b.kill9()
        wait_for(lambda: c.dead() == 1, timeout=15, what="death noticed")
        wait_for(lambda: c.info()["copies_done"] >= 2000 and c.settled(), timeout=90,
                 interval=0.1, what="every blob back at RF 2")
        counts = c.copies(blobs)
        assert all(v == 2 for v in counts.values()), {k: v for k, v in counts.items()
                                                      if v != 2}
        i = c.info()
        assert i["copies_done"] >= 2000 and i["lost"] == 0
        m = c.http.get("/metrics").text
        assert "squall_blobs_lost 0.0" in m and "squall_blobs_under_replicated 0.0" in m
        # the servers run tuned (common/server/runtime.py): the collection at start was timed
        node_m = httpx.get(a.url + "/metrics", headers=ADMIN, timeout=10).text
        for text in (m, node_m):
            assert re.search(r'^squall_gc_pause_seconds_count\{generation="2"\} [1-9]', text,
                             re.M), text[-2000:]
        assert re.search(r'^squall_master_cluster_work_seconds_count\{kind="heartbeat"\} '
                         r'[1-9]', m, re.M)
    finally:
        c.close()


def test_a_source_that_dies_mid_repair_is_replanned_from_a_returning_holder(
        tmp_path: Path) -> None:
    # a small budget paces the repair over many batches, so the kill lands in the middle
    c = Cluster(tmp_path, nodes=3, master_extra=(
        "--max-repair-bytes-per-node", str(16 << 10), "--max-copies-per-node", "8"))
    try:
        a, b, _ = c.nodes
        blobs = tiny(400, "s", 2048)
        c.write([a, b], blobs)
        wait_for(lambda: c.info()["blobs"] >= 400 and c.settled(), what="written")
        b.stop()  # b keeps its data; a is now the only source, `third` the only target
        wait_for(lambda: c.dead() == 1, timeout=15, what="b's death noticed")
        wait_for(lambda: c.info()["copies_done"] >= 8, timeout=30, what="repair under way")
        a.kill9()  # while copies from it are in flight: they end, the rest has no source
        wait_for(lambda: c.dead() == 2, timeout=15, what="a's death noticed")
        wait_for(lambda: c.info()["copies_in_flight"] == 0 and c.info()["lost"] > 0,
                 timeout=15, what="a's copies abandoned, the rest lost")
        i = c.info()
        assert 0 < i["lost"] < 400
        b.start()  # a holder comes back: what was lost is copied from it
        wait_for(c.settled, timeout=90, interval=0.2, what="every blob back at RF 2")
        counts = c.copies(blobs)
        assert all(v == 2 for v in counts.values()), {k: v for k, v in counts.items()
                                                      if v != 2}
    finally:
        c.close()


def test_blobs_no_live_node_reports_after_a_master_restart(tmp_path: Path) -> None:
    c = Cluster(tmp_path, nodes=3)
    try:
        a, b, _ = c.nodes
        kept = tiny(20, "k")
        gone = tiny(30, "g")
        c.write([a, c.nodes[2]], kept)
        c.write([a, b], gone)
        wait_for(lambda: c.info()["blobs"] >= 50 and c.settled(), what="written")
        # the master restarts while both holders of `gone` are down: no node reports them
        c.master.stop()
        a.stop()
        b.stop()
        c.master.fixed_port = True
        c.master.start()
        info = wait_for(lambda: (lambda i: i if i["blob_scan"]["passes"] >= 1 else None)(
            c.info()), timeout=30, what="a blob scan pass")
        assert info["lost"] == 30 and info["blob_scan"]["unreported_last_pass"] == 30
        m = c.http.get("/metrics").text
        assert "squall_blobs_lost 30.0" in m
        log = Path(c.master.log_path).read_text()
        assert "have no live replica" in log
        # one holder comes back: everything is copied back to RF 2
        a.start()
        wait_for(c.settled, timeout=60, interval=0.2, what="lost blobs back at RF 2")
        counts = c.copies({**kept, **gone})
        assert all(v == 2 for v in counts.values())
    finally:
        c.close()


# -- the data node's side, against a fake master --------------------------------------------
@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeMaster, str]]:
    fm = FakeMaster()
    with running_app(fm.app) as url:
        yield fm, url


@pytest.fixture(scope="module")
def pair(tmp_path_factory, fake: tuple[FakeMaster, str]  # type: ignore[no-untyped-def]
         ) -> Iterator[list[tuple[DataNodeProcess, str]]]:
    base = tmp_path_factory.mktemp("rb")
    extra = ["--master", fake[1], "--heartbeat-interval-s", "0.2", "--scrub-bytes-per-s", "0"]
    ps = [DataNodeProcess(str(base / f"n{i}"), env=DN_ENV, extra=extra) for i in range(2)]
    try:
        start_all(ps)
        yield [(p, node_id_of(p.url)) for p in ps]
    finally:
        for p in ps:
            p.stop()


def _reports(fm: FakeMaster, nid: str, after: int, n: int) -> list[ReplicationReport] | None:
    out = [r for b in fm.beats_of(nid)[after:] for r in b.replicated]
    return out if len(out) >= n else None


def test_a_batch_with_a_corrupt_and_a_missing_blob_reports_each_blob(
        fake: tuple[FakeMaster, str], pair: list[tuple[DataNodeProcess, str]]) -> None:
    fm, _ = fake
    (a, aid), (b, bid) = pair
    blobs = {f"cb-{i:03d}": os.urandom(3000 + i) for i in range(50)}
    blobs["cb-big"] = os.urandom(5 << 20)  # over the batch size: streamed on its own
    with httpx.Client(timeout=30) as http:
        items = list(blobs.items())
        blobhttp.put_batch(http, a.url, items[:50], tok("write", [k for k, _ in items[:50]]))
        blobhttp.put_blob(http, a.url, "cb-big", blobs["cb-big"], tok("write", "cb-big"))
        bad = "cb-017"
        assert flip_bytes_in_file(data_file(a.data_dir), blobs[bad][1000:1040], 5) == 1
        ids = [*blobs, "cb-not-here"]
        n0 = len(fm.beats_of(aid))
        fm.send(aid, {"op": "replicate_batch", "blob_ids": ids, "target": b.url,
                      "token": sign(DN_KEY, "replicate", ids, time.time() + 60)})
        reports = wait_for(partial(_reports, fm, aid, n0, len(ids)), timeout=30,
                           what="one report per blob")
        assert reports is not None
        by = {r.blob_id: r for r in reports}
        assert len(by) == len(ids) == len(reports)
        assert not by[bad].ok and "CRC32C" in (by[bad].error or "")
        assert not by["cb-not-here"].ok and "does not hold" in (by["cb-not-here"].error or "")
        for blob, data in blobs.items():
            if blob == bad:
                continue
            r = by[blob]
            assert r.ok and r.target == b.url and r.receipt, r
            verify_receipt(DN_KEY, r.receipt, blob, len(data), crc32c(data), bid)
            assert blobhttp.get_blob(http, b.url, blob, tok("read", blob)) == data
        # the corrupt source replica was dropped and reported; the target never got it
        wait_for(lambda: fm.reported(aid, "corrupt", bad), what="corrupt replica reported")
        with pytest.raises(NotFound):
            blobhttp.get_blob(http, b.url, bad, tok("read", bad))
