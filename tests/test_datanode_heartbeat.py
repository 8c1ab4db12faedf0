"""Heartbeats of real data node processes to a tiny fake master (in this process), the
commands it sends back, the scrubber's corrupt reports, and a master outage.
Compressed profile: 0.2 s beats, a full report every 5 beats, a scrub pass every 0.3 s."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from functools import partial

import httpx
import pytest

from squall.common.checksum import crc32c
from squall.common.errors import NotFound
from squall.common.security import tokens
from squall.common.wire.cluster import HeartbeatRequest, ReplicationReport
from tests import blobhttp
from tests.dn_kit import ENV, KEY, FakeMaster, data_file, flip_bytes_in_file, node_id_of, tok
from tests.helpers import ADMIN, DataNodeProcess, running_app, start_all, wait_for


@pytest.fixture(scope="module")
def fake() -> Iterator[tuple[FakeMaster, str]]:
    fm = FakeMaster()
    with running_app(fm.app) as url:
        yield fm, url


@pytest.fixture(scope="module")
def nodes(tmp_path_factory, fake: tuple[FakeMaster, str]  # type: ignore[no-untyped-def]
          ) -> Iterator[list[tuple[DataNodeProcess, str]]]:
    base = tmp_path_factory.mktemp("dnh")
    extra = ["--master", fake[1], "--heartbeat-interval-s", "0.2", "--full-report-every", "5",
             "--scrub-bytes-per-s", "1000000000", "--scrub-interval-s", "0.3"]
    ps = [DataNodeProcess(str(base / f"n{i}"), env=ENV, extra=extra) for i in range(2)]
    try:
        start_all(ps)
        yield [(p, node_id_of(p.url)) for p in ps]
    finally:
        for p in ps:
            p.stop()


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=30) as c:
        yield c


def put(client: httpx.Client, url: str, blob: str, data: bytes) -> None:
    blobhttp.put_blob(client, url, blob, data, tok("write", blob))


def test_heartbeats_reach_the_master(fake: tuple[FakeMaster, str],
                                     nodes: list[tuple[DataNodeProcess, str]]) -> None:
    fm, _ = fake
    for p, nid in nodes:
        beats = wait_for(partial(_beats, fm, nid, 7), what=f"beats of {nid}")
        assert beats
        first = beats[0]
        assert first.full and first.seq == 0 and first.address == p.url
        assert first.capacity_bytes >= first.free_bytes > 0
        assert [b.seq for b in beats] == list(range(len(beats)))
        assert [b.full for b in beats[:6]] == [True, False, False, False, False, True]
        assert len({b.started_at for b in beats}) == 1


def test_block_reports_follow_puts_and_deletes(fake: tuple[FakeMaster, str],
                                               nodes: list[tuple[DataNodeProcess, str]],
                                               client: httpx.Client) -> None:
    fm, _ = fake
    (p, nid), _ = nodes
    n0 = len(fm.beats_of(nid))
    ids = [f"hb-add-{i}" for i in range(5)]
    for b in ids:
        put(client, p.url, b, os.urandom(1000))
    wait_for(lambda: all(fm.holds(nid, b) for b in ids), what="adds reported")
    beats = fm.beats_of(nid)[n0:]
    assert any(set(ids) & set(b.added) for b in beats if not b.full) or any(
        b.full for b in beats)
    last = fm.beats_of(nid)[-1]
    assert last.blob_count >= 5 and last.used_bytes >= 5000
    blobhttp.delete_blob(client, p.url, ids[0], tok("delete", ids[0]))
    wait_for(lambda: not fm.holds(nid, ids[0]), what="delete reported")
    assert all(fm.holds(nid, b) for b in ids[1:])


def test_delete_and_replicate_commands_are_executed(
        fake: tuple[FakeMaster, str], nodes: list[tuple[DataNodeProcess, str]],
        client: httpx.Client) -> None:
    fm, _ = fake
    (a, aid), (b, bid) = nodes
    data = {f"hb-cmd-{i}": os.urandom(300_000 + i) for i in range(3)}
    for blob, d in data.items():
        put(client, a.url, blob, d)
    n0 = len(fm.beats_of(aid))
    master_token = tokens.sign(KEY, "replicate", ["hb-cmd-0"], time.time() + 60)
    fm.send(aid,
            {"op": "compact-everything", "why": "a command from a newer master"},
            {"op": "replicate", "blob_id": "hb-cmd-0", "target": b.url, "token": master_token},
            {"op": "replicate", "blob_id": "hb-cmd-1", "target": b.url},  # node signs it
            {"op": "replicate", "blob_id": "hb-not-here", "target": b.url},
            {"op": "delete", "blob_ids": ["hb-cmd-2", "hb-never-was"]})
    for blob in ("hb-cmd-0", "hb-cmd-1"):
        got = wait_for(partial(_try_get, client, b.url, blob), what=f"{blob} on B")
        assert got == data[blob]
        wait_for(partial(fm.holds, bid, blob), what=f"B reports {blob}")
    wait_for(lambda: not fm.holds(aid, "hb-cmd-2"), what="delete reported")
    with pytest.raises(NotFound):
        blobhttp.get_blob(client, a.url, "hb-cmd-2", tok("read", "hb-cmd-2"))
    reports = wait_for(lambda: _reports(fm, aid, n0, 3), what="replication reports")
    assert reports
    ok = {r.blob_id: r for r in reports if r.ok}
    assert set(ok) == {"hb-cmd-0", "hb-cmd-1"}
    for blob, r in ok.items():
        assert r.target == b.url and r.receipt is not None
        tokens.verify_receipt(KEY, r.receipt, blob, len(data[blob]), crc32c(data[blob]), bid)
    (bad,) = [r for r in reports if not r.ok]
    assert bad.blob_id == "hb-not-here" and "does not hold" in (bad.error or "")


def _try_get(client: httpx.Client, url: str, blob: str) -> bytes | None:
    try:
        return blobhttp.get_blob(client, url, blob, tok("read", blob))
    except NotFound:
        return None


def _beats(fm: FakeMaster, nid: str, n: int) -> list[HeartbeatRequest] | None:
    out = fm.beats_of(nid)
    return out if len(out) >= n else None


def _reports(fm: FakeMaster, nid: str, after: int, n: int) -> list[ReplicationReport] | None:
    out = [r for b in fm.beats_of(nid)[after:] for r in b.replicated]
    return out if len(out) >= n else None


def test_scrubber_drops_and_reports_a_corrupt_replica(
        fake: tuple[FakeMaster, str], nodes: list[tuple[DataNodeProcess, str]],
        client: httpx.Client) -> None:
    fm, _ = fake
    _, (b, bid) = nodes
    data = os.urandom(200_000)
    put(client, b.url, "hb-rot", data)
    wait_for(lambda: fm.holds(bid, "hb-rot"), what="blob reported")
    assert flip_bytes_in_file(data_file(b.data_dir), data[150_000:150_064], 3) == 1
    wait_for(lambda: fm.reported(bid, "corrupt", "hb-rot"), what="corrupt replica reported")
    assert not fm.holds(bid, "hb-rot")
    with pytest.raises(NotFound):
        blobhttp.get_blob(client, b.url, "hb-rot", tok("read", "hb-rot"))


def _heartbeat_failures(client: httpx.Client, url: str) -> float:
    text = client.get(url + "/metrics", headers=ADMIN).text
    m = re.search(r"^squall_datanode_heartbeat_failures_total (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def test_a_master_outage_does_not_stop_the_node(
        fake: tuple[FakeMaster, str], nodes: list[tuple[DataNodeProcess, str]],
        client: httpx.Client) -> None:
    fm, _ = fake
    (a, aid), _ = nodes
    before = _heartbeat_failures(client, a.url)
    fm.failing = True
    try:
        wait_for(lambda: _heartbeat_failures(client, a.url) >= before + 2,
                 what="failed heartbeats")
        put(client, a.url, "hb-during-outage", b"written while the master is down")
        assert client.get(a.url + "/readyz").status_code == 200
        n0 = len(fm.beats_of(aid))
    finally:
        fm.failing = False
    beats = wait_for(partial(_beats, fm, aid, n0 + 1), what="first beat after the outage")
    assert beats
    beat = beats[n0]
    assert beat.full and "hb-during-outage" in beat.blob_ids  # no delta was lost
    assert a.proc is not None and a.proc.poll() is None
