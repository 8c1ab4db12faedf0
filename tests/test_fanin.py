"""Batches, unique tasks, debounce and trace context in process (master/tasks/batches.py,
unique.py): callbacks after the last member, dead-lettered members, nesting, results,
restarts. Real processes: tests/test_fanin_e2e.py and test_fanin_fronts.py; the model:
tests/test_model_fanin.py."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from squall.common.errors import Conflict, NotFound
from squall.common.wire.models import (
    BatchRequest,
    EnqueueItem,
    LeaseRequest,
    Policy,
    ReleaseItem,
    TaskRef,
    TaskSpec,
    UpdateRequest,
)
from tests.crashkit import InProcessMaster

G = "g"
TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Harness(InProcessMaster):
    def __init__(self) -> None:
        super().__init__("squall-fanin-")

    def batch(self, **kw: Any) -> dict[str, Any]:
        return dict(self.run(self.m.create_batch(G, BatchRequest.model_validate(kw))))

    def enqueue(self, queue: str, *specs: dict[str, Any]) -> list[dict[str, Any]]:
        res = self.run(self.m.enqueue(G, queue, [TaskSpec.model_validate(s) for s in specs]))
        return list(res["enqueued"])

    def lease(self, queue: str, n: int = 1000) -> list[dict[str, Any]]:
        return list(self.run(self.m.lease(G, queue, LeaseRequest(max_tasks=n), ""))["tasks"])

    def ack(self, tasks: list[dict[str, Any]], result: str | None = None) -> None:
        self.run(self.m.update(G, UpdateRequest(dequeue=[
            TaskRef(queue=t["queue"], pid=t["pid"], token=t["token"], result=result)
            for t in tasks])))

    def fail(self, t: dict[str, Any]) -> None:
        self.run(self.m.update(G, UpdateRequest(release=[
            ReleaseItem(queue=t["queue"], pid=t["pid"], token=t["token"], error="boom")])))

    def info(self, bid: str) -> dict[str, Any]:
        return self.m.batch_info(G, bid)


@pytest.fixture
def h() -> Iterator[Harness]:
    with contextlib.closing(Harness()) as x:
        yield x


def members(n: int, queue: str = "work") -> list[dict[str, Any]]:
    return [{"queue": queue, "pid": f"m{i:04d}"} for i in range(n)]


def test_callback_after_the_last_member_in_its_record(h: Harness) -> None:
    res = h.batch(id="b1", tasks=members(5), callback={"queue": "merge", "pid": "cb"})
    assert res["batch"] == "b1" and len(res["enqueued"]) == 5
    assert h.info("b1")["pending"] == 5
    got = h.lease("work")
    assert {t["batch"] for t in got} == {"b1"}
    h.ack(got[:4], result='{"n": 1}')
    assert h.lease("merge") == []
    assert h.info("b1")["done"] == 4
    before = h.m.wal.last_ticket
    h.ack(got[4:])
    assert h.m.wal.last_ticket == before + 1  # the last ack and the callback: one record
    cb = h.lease("merge")
    assert [t["pid"] for t in cb] == ["cb"] and cb[0]["callback_of"] == "b1"
    assert h.info("b1")["state"] == "done"
    res = h.m.batch_results(G, "b1", None, 2)
    assert [r["result"] for r in res["results"]] == ['{"n": 1}'] * 2 and res["next"]
    rest = h.m.batch_results(G, "b1", res["next"], 10)
    assert len(rest["results"]) == 2 and rest["next"] is None
    h.restart()  # the done batch and its results survive
    assert h.info("b1")["results"] == 4
    cb = h.lease("merge", 1)
    assert cb == []  # still leased before the restart
    h.clock.advance(61)
    cb = h.lease("merge", 1)
    h.ack(cb)  # the callback is done: the batch goes
    with pytest.raises(NotFound):
        h.info("b1")


def test_dead_member_fails_or_is_ignored(h: Harness) -> None:
    for q in ("w1", "w2"):
        h.run(h.m.set_policy(G, q, Policy(max_attempts=1)))
    h.batch(id="f", tasks=members(2, "w1"), callback={"queue": "ok", "pid": "f"},
            error_callback={"queue": "err", "pid": "f"})
    h.batch(id="i", tasks=members(2, "w2"), callback={"queue": "ok", "pid": "i"},
            on_dead="ignore")
    for q in ("w1", "w2"):
        a, b = h.lease(q)
        h.fail(a)  # dead-lettered: max_attempts 1
        h.ack([b])
    assert h.info("f")["state"] == "failed" and h.info("f")["failed"] == 1
    assert [t["pid"] for t in h.lease("err")] == ["f"]
    assert [t["pid"] for t in h.lease("ok")] == ["i"]  # only the ignoring batch's callback
    dead = h.lease("w1.dead")
    assert dead and "batch" not in dead[0]  # a dead letter leaves its batch


def test_nested_batches(h: Harness) -> None:
    h.batch(id="parent", tasks=members(1, "p"), callback={"queue": "final", "pid": "all"})
    (m,) = h.lease("p")
    # the member fans out: a child batch whose callback joins the parent
    h.batch(id="child", tasks=members(3, "c"),
            callback={"queue": "p", "pid": "child-done", "batch": "parent"})
    assert h.info("parent")["total"] == 2
    h.ack([m])
    assert h.lease("final") == [] and h.info("parent")["state"] == "open"
    h.ack(h.lease("c"))
    (cd,) = h.lease("p")
    assert cd["pid"] == "child-done" and cd["batch"] == "parent"
    assert cd["callback_of"] == "child"
    h.restart()
    h.clock.advance(61)
    (cd,) = h.lease("p")
    h.ack([cd])
    assert [t["pid"] for t in h.lease("final")] == ["all"]
    with pytest.raises(NotFound):
        h.info("child")
    with pytest.raises(Conflict):
        h.batch(id="parent", tasks=[], callback={"queue": "x"})
    with pytest.raises(Conflict):  # a finished batch takes no members
        h.enqueue("p", {"batch": "parent"})


def test_empty_batch_and_join(h: Harness) -> None:
    res = h.batch(tasks=[], callback={"queue": "cb"})
    assert res["batch"].startswith("b")
    assert len(h.lease("cb")) == 1
    h.batch(id="j", tasks=members(1), callback={"queue": "cb", "pid": "j"})
    h.enqueue("work", {"pid": "late", "batch": "j"})
    assert h.info("j")["total"] == 2
    got = h.lease("work")
    h.ack([t for t in got if t["pid"] == "m0000"])
    assert h.lease("cb") == []
    h.ack([t for t in got if t["pid"] == "late"])
    assert [t["pid"] for t in h.lease("cb")] == ["j"]
    with pytest.raises(NotFound):
        h.enqueue("work", {"batch": "nope"})


def test_unique_queued_and_active(h: Harness) -> None:
    a = h.enqueue("u", {"key": "k", "unique": "queued"})[0]
    b = h.enqueue("u", {"key": "k", "unique": "queued"})[0]
    assert b["collapsed"] and b["pid"] == a["pid"]
    (t,) = h.lease("u")
    c = h.enqueue("u", {"key": "k", "unique": "queued"})[0]
    assert not c["collapsed"]  # the holder runs: a queued one may be added
    d = h.enqueue("u", {"key": "k", "unique": "active"})[0]
    assert d["collapsed"] and d["pid"] == c["pid"]
    h.ack([t])
    h.ack(h.lease("u"))
    h.restart()
    e = h.enqueue("u", {"key": "k", "unique": "active"})[0]
    assert not e["collapsed"]
    f = h.enqueue("u", {"key": "k", "unique": "active"})[0]
    assert f["collapsed"]
    (t,) = h.lease("u")
    h.restart()
    g = h.enqueue("u", {"key": "k", "unique": "active"})[0]  # leased before the restart
    assert g["collapsed"] and g["pid"] == t["pid"]


def test_debounce(h: Harness) -> None:
    a = h.enqueue("d", {"key": "k", "debounce_secs": 10, "debounce_max_secs": 25})[0]
    assert h.m.task_info(G, "d", a["pid"])["state"] == "delayed"
    for _ in range(3):
        h.clock.advance(8)
        b = h.enqueue("d", {"key": "k", "debounce_secs": 10, "debounce_max_secs": 25})[0]
        assert b["collapsed"] and b["pid"] == a["pid"]
    nb = h.m.task_info(G, "d", a["pid"])["not_before"]
    assert nb == pytest.approx(h.clock.now() - 24 + 25)  # capped: 25 s after the first
    h.restart()
    h.clock.advance(1.5)
    (t,) = h.lease("d")
    assert t["pid"] == a["pid"]
    c = h.enqueue("d", {"key": "k", "debounce_secs": 10})[0]  # the holder runs: a new one
    assert not c["collapsed"]


def test_trace_context_round_trip(h: Harness) -> None:
    h.enqueue("t", {"pid": "x", "traceparent": TP, "tracestate": "congo=t61rcWkgMzE,a@b=1"})
    (t,) = h.lease("t")
    assert t["traceparent"] == TP and t["tracestate"] == "congo=t61rcWkgMzE,a@b=1"
    assert h.m.task_info(G, "t", "x")["traceparent"] == TP
    for bad in ("00-" + "0" * 32 + "-b7ad6b7169203331-01", TP.upper(), TP + "-x",
                "01" + TP[2:], "00-0af7651916cd43dd8448eb211c80319c-" + "0" * 16 + "-01"):
        with pytest.raises(ValidationError):
            EnqueueItem(queue="t", traceparent=bad)
    for bad_ts in ("=x", "k=", "K=v", ",".join(f"k{i}=v" for i in range(33)), "k=v" * 200):
        with pytest.raises(ValidationError):
            EnqueueItem(queue="t", traceparent=TP, tracestate=bad_ts)
