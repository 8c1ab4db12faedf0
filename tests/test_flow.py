"""Flow control in process (master/tasks/flow.py): keys, concurrency limits, fair leasing,
token buckets on an injected clock, pause and resume, and the per-key state after a
restart. The real-process checks are tests/test_flow_e2e.py."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from squall.common.errors import BadRequest
from squall.common.wire.models import (
    LeaseRequest,
    Policy,
    ReleaseItem,
    TaskRef,
    TaskSpec,
    UpdateRequest,
)
from tests.crashkit import InProcessMaster

G, Q = "g", "q"


class Harness(InProcessMaster):
    def __init__(self) -> None:
        super().__init__("squall-flow-")

    def enqueue(self, specs: list[TaskSpec], queue: str = Q) -> None:
        for i in range(0, len(specs), 1000):
            self.run(self.m.enqueue(G, queue, specs[i:i + 1000]))

    def lease(self, n: int, queue: str = Q, **kw: Any) -> list[dict[str, Any]]:
        return list(self.run(self.m.lease(G, queue, LeaseRequest(max_tasks=n, **kw), ""))
                    ["tasks"])

    def ack(self, tasks: list[dict[str, Any]], queue: str = Q) -> None:
        self.run(self.m.update(G, UpdateRequest(dequeue=[
            TaskRef(queue=queue, pid=t["pid"], token=t["token"]) for t in tasks])))


@pytest.fixture
def h() -> Iterator[Harness]:
    with contextlib.closing(Harness()) as x:
        yield x


def keyed(n: int, keys: int, prefix: str = "") -> list[TaskSpec]:
    return [TaskSpec(pid=f"{prefix}{i:06d}", key=f"k{i % keys}") for i in range(n)]


def per_key(tasks: list[dict[str, Any]]) -> collections.Counter[str]:
    return collections.Counter(t.get("key") or "" for t in tasks)


def test_key_limit_skips_blocked_keys_in_pid_order(h: Harness) -> None:
    h.run(h.m.set_policy(G, Q, Policy(key_limit=2)))
    h.enqueue([*keyed(30, 3), TaskSpec(pid="000000a"), TaskSpec(pid="zzz")])
    got = h.lease(100)
    # two of each key, keyless ones unlimited, all in pid order
    assert [t["pid"] for t in got] == ["000000", "000000a", "000001", "000002", "000003",
                                       "000004", "000005", "zzz"]
    assert per_key(got) == {"k0": 2, "k1": 2, "k2": 2, "": 2}
    assert h.lease(100) == []  # every key at its limit
    q = h.m.queue(G, Q)
    assert q is not None and h.m.engine.flow.held_back(q) == (0, 24)
    h.ack(got[:1])  # a k0 slot frees: the next k0 task
    assert [t["pid"] for t in h.lease(100)] == ["000006"]
    # a release frees the slot too, an expiry as well
    k1 = [t for t in got if t.get("key") == "k1"]
    h.run(h.m.update(G, UpdateRequest(release=[ReleaseItem(queue=Q, pid=k1[0]["pid"],
                                                           token=k1[0]["token"])])))
    assert [t["pid"] for t in h.lease(100)] == ["000001"]
    h.clock.advance(120)  # every lease expired
    assert per_key(h.lease(100)) == {"k0": 2, "k1": 2, "k2": 2, "": 2}


def test_queue_limit_counts_keyless_tasks_too(h: Harness) -> None:
    h.run(h.m.set_policy(G, Q, Policy(queue_limit=3)))
    h.enqueue([TaskSpec(pid=f"p{i}") for i in range(10)])
    assert len(h.lease(10)) == 3
    assert h.lease(10) == []
    q = h.m.queue(G, Q)
    assert q is not None and h.m.engine.flow.held_back(q) == (0, 7)


def test_limits_hold_across_restarts_and_replay(h: Harness) -> None:
    h.run(h.m.set_policy(G, "", Policy(key_limit=1)))  # the group's default
    h.enqueue(keyed(20, 4))
    assert per_key(h.lease(20)) == {"k0": 1, "k1": 1, "k2": 1, "k3": 1}
    h.restart()  # the counts come back from the index
    assert h.lease(20) == []
    h.clock.advance(61)
    assert per_key(h.lease(20)) == {"k0": 1, "k1": 1, "k2": 1, "k3": 1}


def test_fair_queue_small_keys_are_not_starved(h: Harness) -> None:
    h.run(h.m.set_policy(G, Q, Policy(fair=True)))
    h.enqueue(keyed(10_000, 1, prefix="a"))  # "k0": one big tenant, first in pid order
    h.enqueue([TaskSpec(pid=f"b{i:06d}", key=f"s{i % 9}") for i in range(900)])
    big = 0
    small_done = 0
    while small_done < 900:
        got = h.lease(500)
        assert got
        for t in got:
            if t["key"] == "k0":
                big += 1
            else:
                small_done += 1
        h.ack(got)
    assert big < 1000, big
    # within a key, pid order
    rest = h.lease(50)
    assert [t["pid"] for t in rest] == sorted(t["pid"] for t in rest)


def test_fair_weights(h: Harness) -> None:
    h.run(h.m.set_policy(G, Q, Policy(fair=True, key_weights={"k0": 3})))
    h.enqueue(keyed(400, 2))
    got = h.lease(200)
    c = per_key(got)
    assert c["k0"] == 150 and c["k1"] == 50, c


def test_fair_lease_honours_max_pid(h: Harness) -> None:
    h.run(h.m.set_policy(G, Q, Policy(fair=True)))
    h.enqueue([TaskSpec(pid=f"{band}-{i:03d}", key=f"k{i % 3}")
               for band in (1, 2) for i in range(30)])
    got = h.lease(100, max_pid="1~")
    assert len(got) == 30 and all(t["pid"].startswith("1-") for t in got)


def test_rate_limit_per_queue_on_the_master_clock(h: Harness) -> None:
    """50 tasks/s, burst 5, over 60 s of the injected clock: within one burst of 3000."""
    h.run(h.m.set_policy(G, Q, Policy(rate=50, burst=5)))
    h.enqueue([TaskSpec(pid=f"p{i:05d}") for i in range(5000)])
    taken = 0
    assert h.lease(100) == []  # a master starts with empty buckets
    for _ in range(600):
        h.clock.advance(0.1)
        got = h.lease(100)
        assert len(got) <= 5
        taken += len(got)
        h.ack(got)
    assert 3000 - 5 <= taken <= 3000 + 5, taken


def test_rate_limit_per_key_and_restart_starts_empty(h: Harness) -> None:
    h.run(h.m.set_policy(G, Q, Policy(key_rate=10, key_burst=10)))
    h.enqueue(keyed(1000, 2))
    h.clock.advance(5)  # buckets fill up to the burst
    assert per_key(h.lease(1000)) == {"k0": 10, "k1": 10}
    assert h.lease(1000) == []
    q = h.m.queue(G, Q)
    assert q is not None and h.m.engine.flow.held_back(q)[1] == q.available
    h.restart()
    assert h.lease(1000) == []  # not a fresh burst after a restart
    h.clock.advance(0.5)
    assert per_key(h.lease(1000)) == {"k0": 5, "k1": 5}


def test_pause_queue_and_key_survive_restart(h: Harness) -> None:
    h.enqueue([*keyed(10, 2), TaskSpec(pid="plain")])
    h.run(h.m.pause(G, Q, key="k0"))
    assert {t.get("key") for t in h.lease(100)} == {"k1", None}
    h.run(h.m.pause(G, Q))
    h.enqueue(keyed(4, 2, prefix="n"))  # enqueues go on
    assert h.lease(100) == []
    q = h.m.queue(G, Q)
    assert q is not None and h.m.engine.flow.held_back(q) == (q.available, 0)
    h.restart()
    assert h.m.pause_state(G, Q) == {"paused": True, "paused_keys": ["k0"]}
    assert h.lease(100) == []
    h.run(h.m.pause(G, Q, paused=False))
    assert {t["key"] for t in h.lease(100)} == {"k1"}
    h.run(h.m.pause(G, Q, key="k0", paused=False))
    assert {t["key"] for t in h.lease(100)} == {"k0"}
    assert h.m.pause_state(G, Q) == {"paused": False, "paused_keys": []}


def test_bad_keys_are_refused(h: Harness) -> None:
    with pytest.raises(BadRequest):
        h.run(h.m.enqueue(G, Q, [TaskSpec.model_construct(pid="x", key="bad key")]))
    with pytest.raises(BadRequest):
        h.run(h.m.pause(G, Q, key="bad key"))
    assert h.m.queue(G, Q) is None  # nothing applied


def test_keys_survive_dead_letters_and_redrive(h: Harness) -> None:
    h.run(h.m.set_policy(G, Q, Policy(max_attempts=1, key_limit=5)))
    h.enqueue(keyed(3, 3))
    got = h.lease(10)
    h.run(h.m.update(G, UpdateRequest(release=[
        ReleaseItem(queue=Q, pid=t["pid"], token=t["token"], error="boom") for t in got])))
    dead = h.lease(10, queue=Q + ".dead")
    assert sorted(t["key"] for t in dead) == ["k0", "k1", "k2"]
    h.run(h.m.update(G, UpdateRequest(release=[
        ReleaseItem(queue=Q + ".dead", pid=t["pid"], token=t["token"]) for t in dead])))
    assert h.run(h.m.redrive(G, Q, 10))["moved"] == 3
    assert sorted(t["key"] for t in h.lease(10)) == ["k0", "k1", "k2"]


def test_deleting_a_queue_forgets_its_keys(h: Harness) -> None:
    h.run(h.m.set_policy(G, Q, Policy(key_limit=1)))
    h.enqueue(keyed(4, 2))
    assert len(h.lease(10)) == 2
    h.run(h.m.delete_queue(G, Q))
    h.enqueue(keyed(4, 2))
    assert len(h.lease(10)) == 2  # the new generation's counts start at zero
    h.restart()
    assert h.lease(10) == []


def test_parked_lease_wakes_when_a_token_comes_or_a_slot_frees(h: Harness) -> None:
    h.run(h.m.set_policy(G, Q, Policy(rate=1, burst=1)))
    h.run(h.m.set_policy(G, "lim", Policy(key_limit=1)))
    h.enqueue([TaskSpec(pid="a"), TaskSpec(pid="b")])
    h.enqueue(keyed(2, 1), queue="lim")
    h.clock.advance(1)
    assert len(h.lease(5)) == 1  # the one token
    [held] = h.lease(5, queue="lim")

    async def parked(queue: str) -> list[dict[str, Any]]:
        res = await h.m.lease(G, queue, LeaseRequest(max_tasks=5, wait_secs=30), "")
        return list(res["tasks"])

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        rate = asyncio.ensure_future(parked(Q))
        limit = asyncio.ensure_future(parked("lim"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not rate.done() and not limit.done()
        h.clock.advance(1)
        await h.m.tick()  # the background tick: a token came due
        await asyncio.wait_for(asyncio.shield(rate), 10)
        assert not limit.done()
        await h.m.update(G, UpdateRequest(dequeue=[TaskRef(queue="lim", pid=held["pid"],
                                                           token=held["token"])]))
        return await asyncio.wait_for(rate, 10), await asyncio.wait_for(limit, 10)

    by_rate, by_limit = h.run(scenario())
    assert [t["pid"] for t in by_rate] == ["b"]
    assert [t["pid"] for t in by_limit] == ["000001"]


def test_a_lease_does_not_rescan_keys_it_cannot_take(h: Harness,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys whose next task is above max_pid are looked at once, then skipped for free."""
    h.run(h.m.set_policy(G, Q, Policy(key_limit=10)))
    h.enqueue([TaskSpec(pid=f"{band}-{i:04d}", key=f"k{i}") for band in "az"
               for i in range(500)])
    h.ack(h.lease(500, max_pid="m"))  # every key's first task: their bounds go stale
    flow = h.m.engine.flow
    calls = []
    real = flow._head
    monkeypatch.setattr(flow, "_head", lambda *a: calls.append(1) or real(*a))
    assert h.lease(10, max_pid="m") == []
    first = len(calls)
    assert first >= 500  # every stale bound looked at once
    assert h.lease(10, max_pid="m") == []
    assert len(calls) == first  # bounds were tightened: nothing looked at again
    assert len(h.lease(10)) == 10
