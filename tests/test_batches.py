"""``Client.batches`` / ``AsyncClient.batches``: the read-ahead batch loop (benchmark B.drain).

The loop's state machine (``client/_ahead.py``) is checked step by step against a scripted
core (which lease carries which acknowledgement, what the end and an early exit settle);
then both clients against a real local cluster: every task handed out once and
acknowledged, the batches read ahead visible as leased, an exception giving everything
back, and a lost lease raised."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from squall.client import AsyncClient, BadRequest, Client, LeaseLost, NewTask
from squall.client._ahead import ReadAhead
from squall.client._effects import Join, Spawn
from squall.client._protocol import held_wire
from squall.client._tasks import TaskBase
from squall.client.cli.dev import DevCluster
from tests.helpers import cluster_fixture, wait_for

# -- the state machine, against a scripted core ---------------------------------------------


def _task(pid: str) -> TaskBase:
    return TaskBase(None, *held_wire("g#q", pid, "tok"))


@dataclass
class Scripted:
    """A core whose leases answer `script` in the order they run (a Spawn runs at once:
    the master answers leases in the order they were sent); records every lease's
    acknowledgements and every other update."""

    script: list[list[str] | Exception]
    leases: list[list[str]] = field(default_factory=list)  # the pids each lease dequeued
    commits: list[tuple[list[str], list[str]]] = field(default_factory=list)  # (deq, rel)

    def lease(self, queue: str, size: int, lease_secs: float | None, max_pid: None,
              make: Any, payloads: bool, wait_secs: float | None, done: list[TaskBase]
              ) -> Generator[Any, Any, list[TaskBase]]:
        self.leases.append([t.pid for t in done])
        answer = self.script.pop(0) if self.script else []
        if isinstance(answer, Exception):
            raise answer
        return [_task(p) for p in answer]
        yield  # a generator, as the core's verbs are

    def done(self, tasks: list[TaskBase]) -> Generator[Any, Any, None]:
        if tasks:  # as the core's: no update for no tasks
            self.commits.append(([t.pid for t in tasks], []))
        return None
        yield

    def release(self, tasks: list[TaskBase], delay: None, error: None, unseen: bool = False
                ) -> Generator[Any, Any, None]:
        if tasks:
            self.commits.append(([], [t.pid for t in tasks]))
        return None
        yield


def drive(gen: Generator[Any, Any, Any]) -> Any:
    """Run a protocol generator: a Spawn runs its verb at once, a Join hands back its
    result or throws its failure."""
    try:
        eff = next(gen)
        while True:
            if isinstance(eff, Spawn):
                try:
                    handle: Any = ("ok", drive(eff.gen))
                except Exception as e:
                    handle = ("failed", e)
                eff = gen.send(handle)
            else:
                assert isinstance(eff, Join)
                kind, value = eff.handle
                eff = gen.throw(value) if kind == "failed" else gen.send(value)
    except StopIteration as stop:
        return stop.value


def loop(script: list[list[str] | Exception], ahead: int = 2
         ) -> tuple[ReadAhead[TaskBase], Scripted]:
    core = Scripted(script)
    return ReadAhead(core, "g#q", 100, 60, True, None, _task, ahead), core


def pids(batch: list[TaskBase]) -> list[str]:
    return [t.pid for t in batch]


def test_each_batch_is_acknowledged_by_a_lease_started_when_the_next_is_taken() -> None:
    ra, core = loop([["a"], ["b"], ["c"], ["d"]])
    got = []
    while batch := drive(ra.take()):
        got.append(pids(batch))
    assert got == [["a"], ["b"], ["c"], ["d"]]
    # two leases ahead from the start; then each take starts one carrying the batch before
    assert core.leases == [[], [], [], ["a"], ["b"], ["c"]]
    assert core.commits == [(["d"], [])]  # the last one, on its own at the end
    assert drive(ra.take()) == [] and len(core.commits) == 1  # ended: nothing more


def test_one_ahead_and_four_ahead() -> None:
    for ahead, leases in ((1, [[], [], ["a"], ["b"]]), (4, [[], [], [], [], [], ["a"], ["b"]])):
        ra, core = loop([["a"], ["b"], ["c"]], ahead)
        got = []
        while batch := drive(ra.take()):
            got.append(pids(batch))
        assert got == [["a"], ["b"], ["c"]]
        assert core.leases == leases and core.commits == [(["c"], [])]


def test_a_batch_after_an_empty_lease_is_handed_out_and_no_lease_started() -> None:
    ra, core = loop([["a"], [], ["b"]])  # a task arrived between two leases in flight
    assert pids(drive(ra.take())) == ["a"]
    assert pids(drive(ra.take())) == ["b"]
    assert core.leases == [[], [], []]  # nothing started after the empty answer
    assert core.commits == [(["a"], [])]  # so the batch in hand was acknowledged alone
    assert drive(ra.take()) == []
    assert core.commits == [(["a"], []), (["b"], [])]


@pytest.mark.parametrize("ok", [True, False])
def test_finish_gives_back_what_was_read_ahead(ok: bool) -> None:
    ra, core = loop([["a"], ["b"], ["c"], ["d"]])
    assert pids(drive(ra.take())) == ["a"]
    drive(ra.finish(ok))
    # the two batches in flight given back, then the one in hand acked or given back
    assert core.commits == [([], ["b", "c"]), (["a"], [])] if ok else [([], ["b", "c"]),
                                                                        ([], ["a"])]
    assert drive(ra.take()) == [] and len(core.leases) == 3


def test_a_failed_acknowledgement_is_raised_by_a_later_take_and_by_finish() -> None:
    lost = LeaseLost("lease of a lost")
    ra, core = loop([["a"], ["b"], ["c"], lost, ["e"]])
    assert pids(drive(ra.take())) == ["a"]
    assert pids(drive(ra.take())) == ["b"]  # starts the lease acking "a": it fails
    assert pids(drive(ra.take())) == ["c"]
    with pytest.raises(LeaseLost):
        drive(ra.take())
    assert core.leases[3] == ["a"]
    # the lease that acks "b" is still in flight and holds "e"; finishing with ok settles
    # both, and raises nothing more
    drive(ra.finish(True))
    assert core.commits == [([], ["e"]), (["c"], [])]

    ra, core = loop([["a"], lost, ["c"]])
    assert pids(drive(ra.take())) == ["a"]
    with pytest.raises(LeaseLost):  # ok: the failure of a lease in flight is raised
        drive(ra.finish(True))
    assert core.commits == [([], ["c"]), (["a"], [])]  # after everything else was settled
    ra, core = loop([["a"], lost, ["c"]])
    drive(ra.take())
    drive(ra.finish(False))  # leaving on an exception: that exception is what counts
    assert core.commits == [([], ["c"]), ([], ["a"])]


@pytest.mark.parametrize(("size", "ahead"), [(0, 2), (10_001, 2), (10, 0), (10, 5)])
def test_bad_sizes_are_refused_before_any_request(size: int, ahead: int) -> None:
    with pytest.raises(BadRequest, match=r"must be 1\.\."):
        ReadAhead(Scripted([]), "g#q", size, 60, True, None, _task, ahead)


# -- against a real cluster -----------------------------------------------------------------


cluster = cluster_fixture("batches")


def _fill(c: Client, queue: str, n: int) -> dict[str, bytes]:
    blobs = {f"t{i:04d}": b"%d." % i * (1 + i % 50) for i in range(n)}
    c.put_many(queue, (NewTask(v, pid=k) for k, v in blobs.items()))
    return blobs


def _counts(c: Client, queue: str) -> tuple[int, int, int]:
    s = c.stats(queue)
    return s.available, s.leased, s.completed  # type: ignore[union-attr]


def test_every_task_is_handed_out_once_with_its_payload(cluster: DevCluster) -> None:
    with Client(cluster.master_url) as c:
        blobs = _fill(c, "bt#all", 750)
        seen: dict[str, bytes] = {}
        with c.batches("bt#all", 100, 60) as batches:
            for batch in batches:
                assert all(t.payload_loaded for t in batch)
                assert [t.pid for t in batch] == sorted(t.pid for t in batch)
                for t in batch:
                    assert t.pid not in seen
                    seen[t.pid] = t.payload()
        assert seen == blobs
        assert _counts(c, "bt#all") == (0, 0, 750)


def test_the_next_batches_are_leased_while_one_is_held(cluster: DevCluster) -> None:
    with Client(cluster.master_url) as c:
        _fill(c, "bt#ahead", 500)
        with c.batches("bt#ahead", 100, 60) as batches:
            first = next(batches)
            # the batch in hand and two read ahead
            wait_for(lambda: _counts(c, "bt#ahead")[1] == 300, what="two batches ahead")
            second = next(batches)
            assert not {t.pid for t in first} & {t.pid for t in second}
        # leaving acknowledged the batch in hand (and the one before it), and gave back the
        # two read ahead at once (available, not leased, no attempt counted)
        assert _counts(c, "bt#ahead") == (300, 0, 200)
        again = c.lease("bt#ahead", 300, 60)
        assert len(again) == 300 and {t.attempts for t in again} == {1}
        c.done(again)


def test_an_exception_gives_everything_back(cluster: DevCluster) -> None:
    with Client(cluster.master_url) as c:
        _fill(c, "bt#raise", 400)
        with pytest.raises(ValueError, match="handler"), c.batches("bt#raise", 100, 60) as b:
            next(b)
            raise ValueError("handler failed")
        assert _counts(c, "bt#raise") == (400, 0, 0)


def test_a_lost_lease_is_raised(cluster: DevCluster) -> None:
    with Client(cluster.master_url) as c:
        _fill(c, "bt#lost", 600)
        with pytest.raises(LeaseLost), c.batches("bt#lost", 100, 60) as batches:
            next(batches)
            wait_for(lambda: _counts(c, "bt#lost")[1] == 300, what="two batches ahead")
            c.reset_leases("bt#lost")  # every token held is void: the next ack fails
            for _ in range(4):
                next(batches)
        assert _counts(c, "bt#lost") == (600, 0, 0)  # nothing acked, nothing kept


async def test_the_async_client(cluster: DevCluster) -> None:
    with Client(cluster.master_url) as c:
        blobs = _fill(c, "bt#async", 450)
        _fill(c, "bt#async-raise", 300)
    async with AsyncClient(cluster.master_url) as ac:
        seen: dict[str, bytes] = {}
        async with ac.batches("bt#async", 100, 60) as batches:
            async for batch in batches:
                seen |= {t.pid: await t.payload() for t in batch}
        assert seen == blobs
        with pytest.raises(ValueError, match="handler"):
            async with ac.batches("bt#async-raise", 100, 60) as b:
                await anext(b)
                raise ValueError("handler failed")
    with Client(cluster.master_url) as c:
        assert _counts(c, "bt#async") == (0, 0, 450)
        assert _counts(c, "bt#async-raise") == (300, 0, 0)


def test_an_empty_queue_ends_at_once(cluster: DevCluster, tmp_path: Path) -> None:
    with Client(cluster.master_url) as c, c.batches("bt#empty", 10) as batches:
        assert list(batches) == []
