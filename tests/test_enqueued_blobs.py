"""A blob enqueued with its write receipts is examined right after the enqueue is durable
(``blobgc.enqueued``), without the index read of a tick slice; a refused enqueue's blobs
stay queued and are collected as orphans. In process, with a manual clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from squall.common.clock import ManualClock
from squall.common.security.tokens import sign_receipt
from squall.common.wire.cluster import DeleteCommand, HeartbeatRequest
from squall.master.cluster import blobgc
from squall.master.cluster.nodes import ClusterSettings
from squall.master.service import Master, MasterSettings
from tests.helpers import asgi_master
from tests.test_repair_plan import BEAT, World, copies, deletes

KEY = b"enqueued-blobs-test-key-0123456789"
G = "/v1/groups/g"
GRACE_S = 20.0


def world(ids: list[str], holders: tuple[str, ...] = ("a", "b")) -> World:
    """Nodes a, b and c; `ids` referenced and recorded on `holders` from receipts; index
    reads counted in ``w.reads``."""
    w = World()
    for n in ("a", "b", "c"):
        w.beat(n, full=[])
    w.settle()
    w.refs.update(ids)
    for b in ids:
        w.c.record_holders(b, list(holders), 100)
    read = w.c.referenced
    w.reads = 0  # type: ignore[attr-defined]

    def counted(blobs: list[str]) -> list[bool]:
        w.reads += len(blobs)  # type: ignore[attr-defined]
        return read(blobs)
    w.c.referenced = counted
    return w


def test_enqueued_blobs_are_examined_at_once_without_an_index_read() -> None:
    ids = [f"x{i}" for i in range(10)]
    w = world(ids)
    assert set(ids) <= w.c.check  # recorded from receipts: queued for a look
    blobgc.enqueued(w.c, ids)
    assert not set(ids) & w.c.check
    assert w.tick()["checked"] == 0
    assert w.reads == 0  # type: ignore[attr-defined]
    assert all(w.c.holders[b] == {"a", "b"} for b in ids)
    assert not w.c.under and not w.c.lost and not w.c.repair.waiting_count()


def test_the_examination_at_enqueue_does_its_work() -> None:
    # one copy at RF 2: under-replicated, copied to the third node
    w = world(["one"], holders=("a",))
    blobgc.enqueued(w.c, ["one"])
    assert "one" in w.c.under and "one" not in w.c.check
    w.tick()
    assert [b for b, _ in copies(w.beat("a"))] == ["one"]

    # three copies at RF 2: one is trimmed
    w = world(["three"], holders=("a", "b", "c"))
    blobgc.enqueued(w.c, ["three"])
    assert sum(len(deletes(w.beat(n))) for n in ("a", "b", "c")) == 1

    # a copy on a draining node does not count: a copy goes elsewhere
    w = world(["drain"])
    w.c.draining["a"] = w.clock.now()
    blobgc.enqueued(w.c, ["drain"])
    w.tick()
    assert [t for _, t in copies(w.beat("a") + w.beat("b"))] == ["http://c"]

    # a holder dead by now (not yet declared): the blob is under-replicated
    w = world(["dead"])
    w.clock.advance(BEAT * 5)
    w.beat("b")
    w.beat("c")
    blobgc.enqueued(w.c, ["dead"])
    assert "dead" in w.c.under and w.reads == 0  # type: ignore[attr-defined]
    w.tick()  # declares a dead: its blobs are examined again (read), as before
    assert copies(w.beat("b")) == [("dead", "http://c")]


# -- through the master's enqueue ------------------------------------------------------------
@pytest.fixture
async def env(tmp_path) -> AsyncIterator[tuple[httpx.AsyncClient, Master, ManualClock]]:  # type: ignore[no-untyped-def]
    clock = ManualClock()
    settings = MasterSettings(data_dir=str(tmp_path / "m"), cluster_key=KEY,
                              cluster=ClusterSettings(orphan_grace_s=GRACE_S))
    async with asgi_master(settings, clock) as (c, m):
        yield c, m, clock


def beat(m: Master, node: str) -> list[Any]:
    return list(m.cluster.heartbeat(HeartbeatRequest(
        node_id=node, address=f"http://{node}.test:7071", started_at=1.0, seq=1,
        capacity_bytes=1 << 30, used_bytes=0, free_bytes=1 << 29, blob_count=0,
        full=False)).commands)


def ref(clock: ManualClock, blob: str) -> dict[str, Any]:
    return {"blob_id": blob, "size": 1, "crc32c": 0,
            "receipts": [sign_receipt(KEY, n, blob, 1, 0, clock.now()) for n in ("n1", "n2")]}


async def test_an_enqueue_settles_its_blobs_a_refused_one_leaves_orphans(env) -> None:  # type: ignore[no-untyped-def]
    c, m, clock = env
    for n in ("n1", "n2", "n3"):
        beat(m, n)
    r = await c.post(f"{G}/queues/q/tasks", json={"tasks": [
        {"pid": "a", "payload": ref(clock, "kept")}]})
    assert r.status_code == 200, r.text
    assert m.cluster.holders["kept"] == {"n1", "n2"} and "kept" not in m.cluster.check

    # refused as a whole (the second task is bad): the first one's blob is an orphan
    r = await c.post(f"{G}/queues/q/tasks", json={"tasks": [
        {"pid": "b", "payload": ref(clock, "orphan")},
        {"pid": "c", "not_before": 5.0, "delay_secs": 1.0}]})
    assert r.status_code == 400, r.text
    assert m.cluster.holders["orphan"] == {"n1", "n2"} and "orphan" in m.cluster.check
    r = await c.post(f"{G}/update", json={"enqueue": [
        {"queue": "q", "pid": "d", "payload": ref(clock, "orphan2")},
        {"queue": "q", "pid": "e", "not_before": 5.0, "delay_secs": 1.0}]})
    assert r.status_code == 400, r.text
    assert "orphan2" in m.cluster.check

    got: dict[str, list[str]] = {"n1": [], "n2": [], "n3": []}
    for _ in range(int(GRACE_S / BEAT) + 3):
        clock.advance(BEAT)
        await m.tick()
        for n in got:
            got[n] += [b for cmd in beat(m, n) if isinstance(cmd, DeleteCommand)
                       for b in cmd.blob_ids]
    assert sorted(got["n1"]) == sorted(got["n2"]) == ["orphan", "orphan2"] and not got["n3"]
    assert m.cluster.holders["kept"] == {"n1", "n2"}


async def test_a_receipt_older_than_half_the_orphan_grace_is_refused(env) -> None:  # type: ignore[no-untyped-def]
    """A blob no task references is collected once it is `orphan_grace_s` old: an enqueue
    may reference it only while its receipts are younger than half that, or the task could
    point at a deleted payload. Older ones are refused (400: write the payload again)."""
    c, m, clock = env
    for n in ("n1", "n2", "n3"):
        beat(m, n)
    fresh, stale = ref(clock, "fresh"), ref(clock, "stale")
    clock.advance(GRACE_S / 2 - 1)
    r = await c.post(f"{G}/queues/q/tasks", json={"tasks": [{"pid": "a", "payload": fresh}]})
    assert r.status_code == 200, r.text
    clock.advance(2)
    r = await c.post(f"{G}/queues/q/tasks", json={"tasks": [{"pid": "b", "payload": stale}]})
    assert r.status_code == 400 and "too long before this enqueue" in r.text, r.text
