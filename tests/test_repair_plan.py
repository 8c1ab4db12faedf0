"""The master's re-replication planning and unreported-blob scan, in process with a manual
clock: batches of small blobs per (source, target), byte and count budgets per node,
fewest copies left first, per-blob outcomes, and the paced scan after a restart."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from squall.common.clock import ManualClock
from squall.common.security.tokens import verify
from squall.common.wire.cluster import (
    MAX_REPLICATE_BATCH,
    DeleteCommand,
    HeartbeatRequest,
    ReplicateBatchCommand,
    ReplicateCommand,
    ReplicationReport,
)
from squall.master.cluster import drain
from squall.master.cluster.placement import Placement
from squall.master.cluster.repair import BATCH_BYTES, PLAN_SCAN, Repair
from squall.master.cluster.state import CHECK_BATCH, Cluster, ClusterSettings

KEY = b"repair-plan-test-key-0123456789"
BEAT = 1.0


class World:
    """A Cluster with a manual clock, a set of referenced blobs and a sorted blob table."""

    def __init__(self, **settings: Any) -> None:
        self.clock = ManualClock()
        self.refs: set[str] = set()
        s = ClusterSettings(heartbeat_interval_s=BEAT, dead_after_beats=3, **settings)
        self.c = Cluster(self.clock, s, KEY, lambda ids: [b in self.refs for b in ids],
                         self.read_ids)
        self.started = {}  # node -> started_at

    def read_ids(self, after: str | None, limit: int) -> list[str]:
        return [b for b in sorted(self.refs) if after is None or b > after][:limit]

    def beat(self, node: str, *, full: list[str] | None = None, sizes: list[int] | None = None,
             replicated: list[ReplicationReport] | None = None, free: int = 1 << 40,
             used: int = 0, added: list[str] | None = None, deleted: list[str] | None = None
             ) -> list[Any]:
        self.started.setdefault(node, 1.0)
        req = HeartbeatRequest(
            node_id=node, address=f"http://{node}", started_at=self.started[node],
            seq=0, capacity_bytes=1 << 40, used_bytes=used, free_bytes=free, blob_count=0,
            full=full is not None, blob_ids=full or [], blob_sizes=sizes or [],
            added=added or [], deleted=deleted or [], replicated=replicated or [])
        return list(self.c.heartbeat(req).commands)

    def tick(self) -> dict[str, int]:
        return self.c.tick([])

    def two_copies(self, ids: list[str], size: int) -> None:
        """`ids` referenced, held by a and b; c empty; everything examined."""
        self.refs.update(ids)
        self.beat("a", full=ids, sizes=[size] * len(ids))
        self.beat("b", full=ids, sizes=[size] * len(ids))
        self.beat("c", full=[])
        self.settle()

    def settle(self) -> None:
        """Tick until no examination or planning is left over (each tick does a slice)."""
        for _ in range(1000):
            if not self.tick()["backlog"]:
                return
        raise AssertionError("the master's repair work never settled")


def copies(cmds: list[Any]) -> list[tuple[str, str]]:
    out = []
    for c in cmds:
        ids = c.blob_ids if isinstance(c, ReplicateBatchCommand) else [c.blob_id]
        out += [(b, c.target) for b in ids]
    return out


def live(w: World, blob: str) -> set[str]:
    return {n.node_id for n in w.c.live_holders(blob)}


def kill(w: World, node: str, others: list[str]) -> dict[str, list[Any]]:
    """Let `node` miss its beats while the others keep beating and the master ticks, until
    it is declared dead; the commands the others got meanwhile."""
    got: dict[str, list[Any]] = {o: [] for o in others}
    for _ in range(5):
        w.clock.advance(BEAT)
        for o in others:
            got[o] += w.beat(o)
        w.tick()
    assert w.c.state(w.c.nodes[node], w.clock.now()) == "dead"
    w.settle()
    return got


def test_small_blobs_travel_in_batches_within_the_budget() -> None:
    w = World(max_copies_per_node=5000, max_repair_bytes_per_node=64 << 20)
    ids = [f"b{i:05d}" for i in range(2500)]
    w.refs.update(ids)
    w.beat("a", full=ids, sizes=[1024] * len(ids))
    w.beat("b", full=ids, sizes=[1024] * len(ids))
    w.beat("c", full=[], sizes=[])
    w.tick()
    cmds = kill(w, "b", ["a", "c"])["a"] + w.beat("a")
    info = w.c.info()
    assert info["under_replicated"] == 2500
    assert all(isinstance(c, ReplicateBatchCommand) for c in cmds)
    # one command per plan slice and (source, target), each within MAX_REPLICATE_BATCH
    assert all(len(c.blob_ids) <= min(PLAN_SCAN, MAX_REPLICATE_BATCH) for c in cmds)
    assert sum(len(c.blob_ids) for c in cmds) == 2500
    assert sorted(b for b, _ in copies(cmds)) == ids
    assert {t for _, t in copies(cmds)} == {"http://c"}
    for c in cmds:  # the token covers exactly the batch, for the replicate op
        claims = verify(KEY, c.token, "replicate", c.blob_ids, w.clock.now())
        assert all(claims.covers(b) for b in c.blob_ids)
    assert w.c.info()["copies_in_flight"] == 2500
    # per-blob outcomes: one failure does not sink the rest of its batch
    reps = [ReplicationReport(blob_id=b, target="http://c", ok=b != ids[7],
                              receipt="r" if b != ids[7] else None,
                              error=None if b != ids[7] else "corrupt at source")
            for b in ids]
    again = w.beat("a", replicated=reps)
    w.settle()
    assert w.c.copies_done == 2499
    assert live(w, ids[0]) == {"a", "c"}
    assert live(w, ids[7]) == {"a"}
    replanned = copies(again + w.beat("a"))
    assert replanned == [(ids[7], "http://c")]


def test_budgets_are_bytes_and_count_per_node() -> None:
    w = World(max_copies_per_node=10, max_repair_bytes_per_node=10 << 20)
    big = [f"big{i}" for i in range(6)]
    small = [f"s{i}" for i in range(30)]
    w.refs.update(big + small)
    w.beat("a", full=big + small, sizes=[4 << 20] * 6 + [1000] * 30)
    w.beat("b", full=[])
    w.beat("c", full=[])
    w.tick()
    cmds = w.beat("a")  # every blob has its one copy on a
    planned = copies(cmds)
    # a is the source of every copy: at most 10 MiB and 10 blobs in flight through it
    assert w.c.repair.node_count["a"] <= 10
    assert w.c.repair.node_bytes["a"] <= 10 << 20
    assert sum(1 for b, _ in planned if b.startswith("big")) <= 2
    singles = [c for c in cmds if isinstance(c, ReplicateCommand)]
    assert all(c.blob_id.startswith("big") for c in singles)  # large blobs: one stream each
    # finishing copies frees budget, and the report's answer carries the next ones
    reps = [ReplicationReport(blob_id=b, target=t, ok=True, receipt="r") for b, t in planned]
    nxt = copies(w.beat("a", replicated=reps))
    assert nxt and not set(nxt) & set(planned)
    done = set(planned)
    for _ in range(20):
        reps = [ReplicationReport(blob_id=b, target=t, ok=True, receipt="r") for b, t in nxt]
        done |= set(nxt)
        nxt = copies(w.beat("a", replicated=reps))
        w.tick()
        nxt += copies(w.beat("a"))
        if not nxt:
            break
    assert {b for b, _ in done} == set(big + small)
    assert w.c.info()["under_replicated"] == 0


def test_a_large_blob_runs_alone_when_over_the_byte_budget() -> None:
    w = World(max_repair_bytes_per_node=1 << 20)
    w.refs.add("huge")
    w.beat("a", full=["huge"], sizes=[50 << 20])
    w.beat("b", full=[])
    w.tick()
    cmds = w.beat("a")
    assert [(type(c), c.blob_id) for c in cmds] == [(ReplicateCommand, "huge")]


def test_fewest_copies_left_first() -> None:
    w = World(replication_factor=3, max_copies_per_node=3)
    one = [f"one{i}" for i in range(3)]
    two = [f"two{i}" for i in range(3)]
    w.refs.update(one + two)
    w.beat("a", full=one + two, sizes=[100] * 6)
    w.beat("b", full=two, sizes=[100] * 3)
    w.beat("c", full=[])
    w.beat("d", full=[])
    w.tick()
    from_a = {b for b, _ in copies(w.beat("a"))}
    from_b = {b for b, _ in copies(w.beat("b"))}
    # a's budget (3 copies) went to the blobs with one copy left; b had room for others
    assert from_a and from_a <= set(one)
    assert from_b <= set(two)


def test_a_target_without_room_is_skipped() -> None:
    w = World()
    w.refs.update(["p", "q"])
    w.beat("a", full=["p", "q"], sizes=[6000, 6000])
    w.beat("b", full=[], free=8000)  # room for one of them, not both
    w.beat("c", full=[], free=1 << 30)
    w.tick()
    targets = sorted(t for _, t in copies(w.beat("a")))
    assert targets in (["http://b", "http://c"], ["http://c", "http://c"])


def test_batches_are_bounded_by_bytes() -> None:
    w = World()
    ids = [f"m{i:03d}" for i in range(40)]
    w.refs.update(ids)
    w.beat("a", full=ids, sizes=[512 << 10] * 40)  # 20 MiB in 512 KiB blobs
    w.beat("b", full=[])
    w.tick()
    cmds = w.beat("a")
    assert all(isinstance(c, ReplicateBatchCommand) for c in cmds)
    assert all(len(c.blob_ids) * (512 << 10) <= BATCH_BYTES for c in cmds)
    assert sorted(b for b, _ in copies(cmds)) == ids


def test_dead_target_releases_its_budget_and_copies_are_replanned() -> None:
    w = World(max_copies_per_node=100)
    ids = [f"x{i:02d}" for i in range(50)]
    w.refs.update(ids)
    w.beat("a", full=ids, sizes=[10] * 50)
    w.beat("b", full=[])
    w.tick()
    first = copies(w.beat("a"))
    assert {t for _, t in first} == {"http://b"}
    w.beat("c", full=[])
    got = kill(w, "b", ["a", "c"])
    assert "b" not in w.c.repair.node_count
    again = copies(got["a"] + w.beat("a"))
    assert sorted(b for b, _ in again) == ids and {t for _, t in again} == {"http://c"}


def test_scan_reports_referenced_blobs_no_live_node_holds(caplog: pytest.LogCaptureFixture
                                                          ) -> None:
    w = World(blob_scan_batch=7, blob_scan_interval_s=100.0)
    held = [f"h{i:02d}" for i in range(20)]
    gone = [f"g{i:02d}" for i in range(5)]
    w.refs.update(held + gone)
    w.beat("a", full=held, sizes=[5] * 20)
    w.beat("b", full=held, sizes=[5] * 20)
    for _ in range(3):  # within the grace period nothing is scanned
        w.tick()
        w.clock.advance(0.5)
    assert w.c.scan.passes == 0 and w.c.info()["lost"] == 0
    w.clock.advance(5 * BEAT)
    w.beat("a")
    w.beat("b")
    with caplog.at_level(logging.WARNING, "squall.master.cluster.blobscan"):
        for _ in range(10):
            w.tick()
    info = w.c.info()
    assert info["lost"] == 5 and info["under_replicated"] == 0
    assert info["blob_scan"]["passes"] == 1 and info["blob_scan"]["unreported_last_pass"] == 5
    assert info["blob_scan"]["scanned"] == 25
    assert "5 referenced blob(s) have no live replica" in caplog.text
    # a holder comes back with two of them: they are no longer lost, and get copies
    w.beat("c", full=gone[:2], sizes=[5, 5])
    w.tick()
    assert w.c.info()["lost"] == 3
    planned = copies(w.beat("c"))
    assert sorted(b for b, _ in planned) == gone[:2]
    # the next pass comes after the interval, paced like the first
    w.clock.advance(101)
    w.tick()
    assert w.c.scan.running


def test_repair_copies_are_paced_only_while_clients_use_the_node() -> None:
    """Unpaced while idle (repair first); at the busy rate within ``BUSY_S`` of a client
    request, each blob costing ``BLOB_CHARGE`` more than its bytes. A manual clock, and a
    sleep that moves it."""
    import asyncio

    from squall.datanode.replication.repairpace import BLOB_CHARGE, BUSY_S, RepairPace

    clock = ManualClock(start=100.0)
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        clock.advance(s)

    rate = 10 * BLOB_CHARGE  # ten empty blobs a second
    p = RepairPace(0.0, rate, clock=clock.now, sleep=sleep)

    async def copy(n: int, size: int = 0, clients: bool = False) -> float:
        t0 = clock.now()
        for _ in range(n):
            if clients:
                p.client_seen()  # a client request between two copies
            await p.take(size, 1)
        return clock.now() - t0

    assert asyncio.run(copy(50)) == 0 and not slept  # idle: unpaced
    assert asyncio.run(copy(21, clients=True)) == pytest.approx(2.0)  # first at once, 10/s
    # a blob of a second's bytes waits for the debt of the one before (0.1 s) ...
    assert asyncio.run(copy(1, size=rate, clients=True)) == pytest.approx(0.1)
    p.client_seen()
    assert asyncio.run(copy(1)) == pytest.approx(1.1)  # ... and the next for its (1 + 0.1 s)
    clock.advance(BUSY_S)  # no client since: idle again
    assert asyncio.run(copy(100, size=1 << 20)) == 0
    p2 = RepairPace(float(rate), 0.0, clock=clock.now, sleep=sleep)  # paced idle, not busy
    p2.client_seen()
    t0 = clock.now()
    asyncio.run(p2.take(rate * 5, 0))
    asyncio.run(p2.take(rate * 5, 0))
    assert clock.now() == t0  # busy and a busy rate of 0: unpaced
    clock.advance(BUSY_S)
    asyncio.run(p2.take(rate, 0))
    asyncio.run(p2.take(rate, 0))
    assert clock.now() - t0 - BUSY_S == pytest.approx(1.0)  # idle: at the idle rate


def test_a_source_declared_dead_and_back_at_once_gets_its_copies_again() -> None:
    w = World()
    ids = [f"r{i:02d}" for i in range(30)]
    w.refs.update(ids)
    w.beat("a", full=ids, sizes=[10] * 30)
    w.beat("b", full=[])
    w.tick()  # copies planned for a, not yet delivered
    assert w.c.info()["copies_in_flight"] == 30
    w.clock.advance(2.9 * BEAT)
    w.beat("b")
    w.tick()  # a is suspect; the copies in flight are looked at
    w.clock.advance(0.2 * BEAT)
    w.tick()  # a is declared dead: its undelivered commands are dropped ...
    assert w.c.info()["copies_in_flight"] == 0  # ... and so are their copies
    w.started["a"] = 2.0  # a comes back (restarted)
    w.beat("a", full=ids, sizes=[10] * 30)
    w.tick()
    assert sorted(b for b, _ in copies(w.beat("a"))) == ids


def test_the_scan_waits_for_every_live_node_s_full_report() -> None:
    w = World()  # grace: (3 + 2) beats = 5 s from the first tick
    w.refs.update(["u1", "u2"])
    w.tick()
    for t in range(14):  # z beats, but never with its full inventory
        w.clock.advance(1.0)
        w.beat("z")
        w.tick()
        assert w.c.scan.passes == 0, t  # held up while z's report is missing ...
    w.clock.advance(1.5)
    w.beat("z")
    w.tick()
    assert w.c.scan.passes == 1 and w.c.info()["lost"] == 2  # ... for three graces at most


def deletes(cmds: list[Any]) -> list[str]:
    return [b for c in cmds if isinstance(c, DeleteCommand) for b in c.blob_ids]


def drained(w: World) -> World:
    """k on a and on v, which is decommissioning; x and y hold nothing (x: the least used)."""
    w.refs.add("k")
    w.beat("a", full=["k"], sizes=[10], used=1)
    w.beat("v", full=["k"], sizes=[10], used=1)
    w.beat("x", full=[], used=1)
    w.beat("y", full=[], used=100)
    drain.start(w.c, "v", w.clock.now())
    w.tick()
    return w


def test_a_late_copy_report_does_not_count_a_trimmed_copy() -> None:
    """The race behind a decommission that ended with blobs on one node: the target's own
    report ends a copy, an extra copy gets trimmed there, and then the source's report of
    that copy comes in. It must not count the deleted copy again (a second trim would then
    delete a real one, and the drain would count a copy that is gone)."""
    w = drained(World())
    assert copies(w.beat("a") + w.beat("v")) == [("k", "http://x")]
    w.beat("x", added=["k"], used=500)  # landed; x reports it before the source does
    w.beat("y", added=["k"], used=100)  # another copy (an earlier one that timed out)
    w.c.verified["k"] = {"a", "x", "y"}  # receipts proved them: trims may touch them
    w.tick()  # three copies besides v's: the most used node's is trimmed
    assert deletes(w.beat("x", used=1)) == ["k"]  # delivered: x deletes it now
    w.beat("a", replicated=[ReplicationReport(blob_id="k", target="http://x", ok=True,
                                              receipt="r")])  # late
    w.tick()
    assert live(w, "k") == {"a", "y", "v"}
    assert not any(deletes(w.beat(n)) for n in ("a", "y"))  # no second trim
    w.beat("x", deleted=["k"])
    w.clock.advance(1.0)
    w.tick()
    assert live(w, "k") == {"a", "y", "v"} and w.c.nodes["v"].drain_remaining == 0


def test_a_full_report_made_before_a_copy_landed_does_not_drop_it() -> None:
    """The source's receipt proves the copy landed; the target's full report, made before
    that, lacks it: dropping it would plan an extra copy (and a trim later)."""
    w = drained(World())
    assert copies(w.beat("a") + w.beat("v")) == [("k", "http://x")]
    w.beat("a", replicated=[ReplicationReport(blob_id="k", target="http://x", ok=True,
                                              receipt="r")])
    w.beat("x", full=[])  # made before the copy landed
    w.tick()
    assert live(w, "k") == {"a", "x", "v"}
    assert not copies(w.beat("a") + w.beat("v")) and w.c.info()["copies_waiting"] == 0
    w.beat("x", full=[])  # made after it landed, and still without it: it is gone
    assert live(w, "k") == {"a", "v"}


def test_no_copy_goes_to_a_node_before_it_reported_on_a_delete_it_was_sent() -> None:
    """A delete delivered with a node's answer runs before its next report: until then a
    copy of that blob sent there could land first and be deleted after it was counted."""
    w = drained(World())
    assert copies(w.beat("a") + w.beat("v")) == [("k", "http://x")]
    w.beat("x", added=["k"], used=500)
    w.beat("y", added=["k"], used=100)
    w.c.verified["k"] = {"a", "x", "y"}  # receipts proved them: trims may touch them
    w.tick()  # a, x, y (and v): x's copy is trimmed
    assert deletes(w.beat("x", used=1)) == ["k"]  # delivered; x is now the least used
    w.beat("y", deleted=["k"], used=100)  # y lost its copy: k needs one more
    w.tick()
    # not to x, the least used node, which has yet to report on its delete
    assert copies(w.beat("a") + w.beat("v")) == [("k", "http://y")]


def test_a_copy_the_master_knows_of_is_not_examined_again() -> None:
    """A blob is examined when something about it changed: its holder's death, then the
    copy's report. The target's own report of that copy afterwards is old news."""
    w = World()
    ids = [f"k{i:02d}" for i in range(20)]
    w.two_copies(ids, 100)
    w.beat("b", added=ids, sizes=[100] * 20)  # reported again: nothing changed
    assert w.tick()["checked"] == 0
    cmds = kill(w, "b", ["a", "c"])["a"] + w.beat("a")
    assert sorted(b for b, _ in copies(cmds)) == ids
    w.beat("a", replicated=[ReplicationReport(blob_id=b, target="http://c", ok=True,
                                              receipt="r") for b in ids])
    assert w.tick()["checked"] == 20  # the copies' outcome: looked at once
    w.beat("c", added=ids, sizes=[100] * 20)
    assert w.tick()["checked"] == 0
    assert all(live(w, b) == {"a", "c"} for b in ids)
    assert w.c.info()["under_replicated"] == 0


def test_a_node_back_from_the_dead_has_its_blobs_examined() -> None:
    w = World()
    ids = [f"d{i:02d}" for i in range(10)]
    w.refs.update(ids)
    w.beat("a", full=ids, sizes=[100] * 10)
    w.beat("b", full=ids, sizes=[100] * 10)
    w.settle()
    kill(w, "b", ["a"])  # no third node: the blobs wait under their factor
    assert w.c.info()["under_replicated"] == 10
    w.beat("b")  # back, same process: its blobs count again, and are looked at again
    assert set(ids) <= w.c.check
    w.settle()
    assert w.c.info()["under_replicated"] == 0 and not w.c.repair.waiting


def test_orphans_in_their_grace_and_blobs_without_room_are_not_a_backlog() -> None:
    """The master ticks again at once while repair work is left (``backlog``); blobs that
    only wait (for their orphan grace, for room on a target) must not make that a busy
    loop."""
    w = World(orphan_grace_s=30.0)
    orphans = [f"o{i:04d}" for i in range(2500)]  # reported, never referenced
    stuck = [f"s{i:04d}" for i in range(1500)]  # referenced, no node has room for a copy
    w.refs.update(stuck)
    w.beat("a", full=orphans + stuck, sizes=[100] * 4000)
    w.beat("b", full=[], free=0)
    backlog = [w.tick()["backlog"] for _ in range(4000 // CHECK_BATCH + 4)]
    assert backlog[-3:] == [0, 0, 0], backlog
    assert w.c.info()["under_replicated"] == 1500
    w.clock.advance(31.0)
    w.beat("a")
    w.beat("b", free=0)
    w.settle()
    deleted = {b for c in w.beat("a") if isinstance(c, DeleteCommand) for b in c.blob_ids}
    assert deleted == set(orphans)  # still collected after their grace


@pytest.mark.parametrize("check_batch", [250, 5000])
def test_a_large_backlog_is_planned_slice_after_slice_without_waiting(
        check_batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Examining and planning go in slices of ``CHECK_BATCH`` / ``PLAN_SCAN`` blobs;
    the next slice follows at the next tick, not a second later (also when all of them were
    examined at once and wait to be planned)."""
    monkeypatch.setattr("squall.master.cluster.state.CHECK_BATCH", check_batch)
    w = World(max_copies_per_node=10_000, max_repair_bytes_per_node=1 << 30)
    ids = [f"g{i:05d}" for i in range(2500)]
    w.two_copies(ids, 100)
    w.clock.advance(4 * BEAT)  # b is dead by now
    w.beat("a")
    w.beat("c")
    ticks = 0
    while w.c.info()["copies_in_flight"] < 2500 and ticks < 2500 // PLAN_SCAN + 10:
        w.tick()  # the clock stands still
        ticks += 1
    assert w.c.info()["copies_in_flight"] == 2500, ticks
    assert 2500 // PLAN_SCAN <= ticks <= 2500 // PLAN_SCAN + 3  # slice after slice


def test_allocations_are_forgotten_oldest_first_after_their_grace() -> None:
    w = World(orphan_grace_s=10.0)
    t0 = w.clock.now()
    for i in range(3):
        w.c.allocated[f"al{i}"] = t0 + i
    w.clock.advance(11.5)
    w.tick()
    assert list(w.c.allocated) == ["al2"]
    w.clock.advance(1.0)
    w.tick()
    assert not w.c.allocated


def test_copies_in_flight_end_at_their_deadline_or_with_their_node() -> None:
    r = Repair(KEY, 1 << 30, 1000)
    r.start("b1", "a", "c", 10, 5.0)
    r.start("b2", "b", "c", 10, 6.0)
    r.start("b3", "a", "d", 10, 7.0)
    r.start("b4", "b", "d", 10, 8.0)
    r.start("b5", "a", "c", 10, 1.0)
    r.start("b5", "b", "c", 10, 9.0)  # started again: the new deadline counts
    assert r.expire(5.0, lambda n: False) == []
    assert r.expire(6.5, lambda n: False) == ["b1", "b2"]
    assert r.in_flight() == (3, 30)
    assert r.expire(6.5, lambda n: n == "a") == ["b3"]  # its source died
    assert sorted(r.abandon("d")) == ["b4"]  # a target restarted
    assert r.inflight == {"b5": {"c": r.inflight["b5"]["c"]}}
    assert r.expire(9.5, lambda n: False) == ["b5"]
    assert r.in_flight() == (0, 0) and r.inflight == {}
    assert r.node_bytes == {} and r.node_count == {}  # every budget given back


def test_lease_answers_and_frees_count_only_holders_not_dead() -> None:
    """A lease answer lists live (and suspect) holders first and a dead one only after
    them; a freed blob's deletes go to its holders not dead. Both take each node's state
    once per batch (Cluster.not_dead), which must agree with Cluster.state."""
    w = World()
    placement = Placement(w.c, KEY, require_receipts=False)
    w.refs.update(["x", "y"])
    w.beat("a", full=["x", "y"], sizes=[10, 10])
    w.beat("b", full=["x", "y"], sizes=[10, 10])
    w.beat("c", full=[])
    w.settle()
    kill(w, "a", ["b", "c"])
    w.clock.advance(2 * BEAT)  # b and c missed two beats: suspect, not dead
    now = w.clock.now()
    assert [w.c.state(w.c.nodes[n], now) for n in "abc"] == ["dead", "suspect", "suspect"]

    def answer(blob: str, listed: list[str]) -> list[str]:
        tasks = [{"expires_at": now + 60, "payload": {
            "blob_id": blob, "size": 10, "crc32c": 0, "replicas": listed}}]
        token = placement.for_lease(tasks)
        assert token is not None and verify(KEY, token, "read", blob, now).op == "read"
        return list(tasks[0]["payload"]["replicas"])

    assert "a" in w.c.holders["x"] and live(w, "x") == w.c.holders["x"] - {"a"}
    got = answer("x", ["http://a", "http://b"])
    assert got[-1] == "http://a" and set(got[:-1]) == {f"http://{n}" for n in live(w, "x")}
    assert placement.for_lease([{"expires_at": now, "payload": None}]) is None

    w.refs.discard("y")
    w.c.commands.clear()
    holders = set(w.c.holders["y"])
    assert "a" in holders and "b" in holders
    w.c.tick(["y"])
    sent = {n for n, cmds in w.c.commands.items()
            for c in cmds if isinstance(c, DeleteCommand) and "y" in c.blob_ids}
    assert sent == holders - {"a"}


def test_a_delete_the_master_sent_is_not_examined_again() -> None:
    """A freed blob leaves the master's map when its deletes are sent (B.drain frees two
    copies per acknowledged task); the nodes' reports of having run them are old news. A
    copy a node lost unasked is news: examined, and copied again."""
    w = World()
    ids = [f"k{i:02d}" for i in range(20)]
    w.two_copies(ids, 100)
    w.refs.clear()
    w.c.tick(ids)  # freed: every copy deleted at once, no orphan grace
    assert sorted(deletes(w.beat("a"))) == ids and sorted(deletes(w.beat("b"))) == ids
    w.beat("a", deleted=ids)
    w.beat("b", deleted=ids)
    assert w.tick()["checked"] == 0
    assert w.c.info()["blobs"] == 0
    w.refs.add("m")
    w.beat("a", added=["m"], sizes=[100])
    w.beat("b", added=["m"], sizes=[100])
    w.settle()
    w.beat("a", deleted=["m"])  # a lost its copy without being asked
    assert w.tick()["checked"] == 1
    assert [b for b, _ in copies(w.beat("b"))] == ["m"]
