"""The master's side of the parallel put (master/tasks/pending.py), in process: a pending
task is counted, never leased, refuses a resend of its pid or key, survives a restart;
its node's confirmation makes it leasable; an abandon removes it and frees its key; past
its deadline the housekeeping removes one no node can hold, and leaves one whose replicas
it cannot hear from yet."""

from __future__ import annotations

from pathlib import Path

import pytest

from squall.common.clock import ManualClock
from squall.common.errors import Unavailable
from squall.common.wire.cluster import NodeSettle, SettleItem
from squall.common.wire.models import EnqueueItem, LeaseRequest, PayloadRef, TaskSpec
from squall.master.service import Master, MasterSettings
from tests.crashkit import kill9


def _settings(path: Path) -> MasterSettings:
    return MasterSettings(data_dir=str(path), require_receipts=False, pending_deadline_s=5.0,
                          pending_lease_wait_s=0.05)


def _item(pid: str, blob: str, key: str | None = None) -> EnqueueItem:
    return EnqueueItem(queue="q", pid=pid, idempotency_key=key,
                       payload=PayloadRef(blob_id=blob, size=3, crc32c=7))


def _settle(pid: str, blob: str, durable: bool) -> NodeSettle:
    return NodeSettle(group="g", durable=durable, replicas=["http://a", "http://b"],
                      items=[SettleItem(queue="q", pid=pid,
                                        payload=PayloadRef(blob_id=blob, size=3, crc32c=7))])


def _counts(m: Master) -> tuple[int, int, int]:
    q = m.queue("g", "q")
    assert q is not None
    return q.pending, q.available, q.size


async def _lease(m: Master) -> list[dict[str, object]]:
    res = await m.lease("g", "q", LeaseRequest(max_tasks=10, lease_secs=60), "")
    return list(res["tasks"])


async def test_pending_confirm_abandon_and_restart(tmp_path: Path) -> None:
    clock = ManualClock()
    m = Master(_settings(tmp_path / "m"), clock)
    try:
        res = await m.enqueue_pending("g", [_item("a", "b-a", key="k-a"),
                                            EnqueueItem(queue="q", pid="plain")],
                                      "n1", ["http://a", "http://b"])
        assert [e["collapsed"] for e in res["enqueued"]] == [False, False]
        assert _counts(m) == (1, 1, 2)  # the task without a payload is not pending
        # the same pid or key twice in one request: the second collapses into the first
        dup = await m.enqueue_pending("g", [_item("d", "b-d1", key="k-d"),
                                            _item("d", "b-d2"), _item("d2", "b-d3", "k-d")],
                                      "n1", [])
        assert [e["collapsed"] for e in dup["enqueued"]] == [False, True, True]
        assert (await m.settle("g", _settle("d", "b-d1", False)))["removed"] == 1
        assert [t["pid"] for t in await _lease(m)] == ["plain"]  # never the pending one
        with pytest.raises(Unavailable, match="not confirmed"):  # its pid, then its key
            await m.enqueue("g", "q", [TaskSpec(pid="a")])
        with pytest.raises(Unavailable, match="not confirmed"):
            await m.enqueue("g", "q", [TaskSpec(pid="other", idempotency_key="k-a")])
        info = m.task_info("g", "q", "a")
        assert info["state"] == "pending" and set(info["payload"]) >= {"blob_id", "replicas"}
        assert "key" not in info["payload"] and "node" not in info["payload"]
    finally:
        kill9(m)
    m = Master(_settings(tmp_path / "m"), clock)  # the pending record replays
    try:
        assert _counts(m) == (1, 0, 2)
        stale = await m.settle("g", _settle("a", "another-blob", True))
        assert stale["confirmed"] == 0 and _counts(m) == (1, 0, 2)  # not its blob: nothing
        done = await m.settle("g", _settle("a", "b-a", True))
        assert done["confirmed"] == 1 and _counts(m) == (0, 1, 2)
        [t] = await _lease(m)
        assert t["pid"] == "a" and t["payload"]["blob_id"] == "b-a"  # type: ignore[index]
        again = await m.settle("g", _settle("a", "b-a", True))  # settled already
        assert again["confirmed"] == 0
        # abandoned: removed, and its key may be used again
        await m.enqueue_pending("g", [_item("c", "b-c", key="k-c")], "n1", [])
        gone = await m.settle("g", _settle("c", "b-c", False))
        assert gone["removed"] == 1 and _counts(m) == (0, 0, 2)
        fresh = await m.enqueue("g", "q", [TaskSpec(pid="c2", idempotency_key="k-c")])
        assert fresh["enqueued"][0] == {"queue": "q", "pid": "c2", "collapsed": False}
    finally:
        kill9(m)


async def test_housekeeping_settles_pending_tasks_past_their_deadline(tmp_path: Path) -> None:
    clock = ManualClock()
    m = Master(_settings(tmp_path / "m"), clock)
    try:
        # no replica at all: nothing can hold the payload; replicas not heard of: undecided
        await m.enqueue_pending("g", [_item("x", "b-x")], "n1", [])
        await m.enqueue_pending("g", [_item("y", "b-y")], "n1",
                                ["http://unheard-of:1", "http://unheard-of:2"])
        await m.tick()
        assert _counts(m) == (2, 0, 2)  # before the deadline: untouched
        clock.advance(6.0)
        await m.tick()
        assert _counts(m) == (1, 0, 1)  # x removed; y waits for its replica
        assert m.task_info("g", "q", "y")["state"] == "pending"
        assert await _lease(m) == []
        clock.advance(6.0)
        await m.tick()
        assert _counts(m) == (1, 0, 1)  # still undecided: never leased, never removed
    finally:
        kill9(m)
