"""Refused means not applied (docs/design.md): a request answered with an error left no trace.

In-process masters with injected disk errors (a WAL whose writes fail like a full disk, an
index commit that fails after the WAL was durable), and a real master process on a tiny
tmpfs that fills up under load and frees again.
"""

from __future__ import annotations

import asyncio
import errno
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import lmdb
import pytest

from squall.client import AsyncClient
from squall.client import Unavailable as ClientUnavailable
from squall.common.clock import ManualClock
from squall.common.errors import Unavailable
from squall.common.wire.models import LeaseRequest, Policy, TaskRef, TaskSpec, UpdateRequest
from squall.master.ha.quorum import QuorumLost
from squall.master.http.app import create_master_app
from squall.master.service import Master, MasterSettings
from tests.crashkit import dump_index, kill9
from tests.helpers import ADMIN, DISPATCH_ENV, MasterProcess, until, wait_for

G = "g"


def _full_disk(fd: int, data: Any) -> int:
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.fixture
def opened() -> Iterator[list[Master]]:
    ms: list[Master] = []
    yield ms
    for m in ms:
        if not m.wal._closed:
            m.close()


def open_master(tmp_path: Path, clock: ManualClock, opened: list[Master]) -> Master:
    m = Master(MasterSettings(data_dir=str(tmp_path / "m"), require_receipts=False), clock)
    opened.append(m)
    return m


def soft_state(m: Master) -> Any:
    qs = {k: (q.gen, q.available, q.leased, q.delayed, q.completed, q.enqueued_total)
          for k, q in m.index.queues.items()}
    ix = m.index
    return (qs, ix.lease_seq, ix.auto_pid, ix.next_qid, ix.enqueued_total, ix.completed_total,
            dict(ix.policies), list(ix.freed), list(ix.freed_pending))


async def test_a_failed_wal_write_refuses_the_whole_batch_and_changes_nothing(
        tmp_path: Path, clock: ManualClock, opened: list[Master]) -> None:
    m = open_master(tmp_path, clock, opened)
    await m.enqueue(G, "a", [TaskSpec(pid=f"p{i}") for i in range(10)])
    held = (await m.lease(G, "a", LeaseRequest(max_tasks=2, lease_secs=60), ""))["tasks"]
    before, soft = dump_index(m), soft_state(m)

    m.wal._os_write = _full_disk  # type: ignore[method-assign]
    # one batch of every kind of change, concurrently: all of it is refused
    answers = await asyncio.gather(
        m.enqueue(G, "a", [TaskSpec(pid="new1"), TaskSpec(pid="new2")]),
        m.enqueue(G, "b", [TaskSpec(pid="fresh")]),  # would create a queue
        m.lease(G, "a", LeaseRequest(max_tasks=3, lease_secs=3600), ""),
        m.update(G, UpdateRequest(dequeue=[TaskRef(queue="a", pid=held[0]["pid"],
                                                   token=held[0]["token"])])),
        m.delete_queue(G, "a"),
        m.set_policy(G, "a", Policy(max_attempts=1)),
        return_exceptions=True)
    assert all(isinstance(a, Unavailable) and "nothing was applied" in a.message
               for a in answers), answers
    assert dump_index(m) == before and soft_state(m) == soft
    assert "No space left" in (m.ready() or "")
    assert m.wal.failures == 1
    with pytest.raises(Unavailable, match="No space left"):  # refused at once while failed
        await m.enqueue(G, "a", [TaskSpec(pid="meanwhile")])
    await m.tick()  # the probe fails too: still refusing
    assert m.ready() is not None and dump_index(m) == before

    m.wal._os_write = os.write  # type: ignore[method-assign]
    await m.tick()  # resumes by itself: no restart
    assert m.ready() is None
    assert (await m.enqueue(G, "a", [TaskSpec(pid="after")]))["ticket"] > 0

    kill9(m)  # and a restart replays nothing that was refused
    m2 = open_master(tmp_path, clock, opened)
    q = m2.queue(G, "a")
    assert q is not None and (q.available, q.leased) == (9, 2) and m2.queue(G, "b") is None
    with m2.index.env.begin() as txn:
        pids = {t.pid for t in m2.index.iter_tasks(txn, q, limit=100)}
    assert pids == {f"p{i}" for i in range(10)} | {"after"}
    assert m2.index.policies.get((G, "a")) is None


class ReplicatedLog:
    """A master set's log as the group commit sees it (``append_group``, awaited on the
    loop; master/ha/role.py): the local WAL, and a majority that can be lost."""

    def __init__(self, wal: Any) -> None:
        self.wal, self.lost, self.groups = wal, False, 0

    @property
    def last_ticket(self) -> int:
        return int(self.wal.last_ticket)

    def failure(self) -> str | None:
        return self.wal.failure()  # type: ignore[no-any-return]

    async def append_group(self, records: list[tuple[int, bytes]]) -> None:
        if self.lost:  # no majority: refused (a real leader then steps down)
            raise QuorumLost("injected: 1 of 3 journals")
        await asyncio.to_thread(self.wal.write_group, records)  # the journals' stand-in
        self.groups += 1


async def test_a_replicated_log_without_a_majority_refuses_the_whole_batch(
        tmp_path: Path, clock: ManualClock, opened: list[Master]) -> None:
    """On a master set the group commit awaits the quorum append on the loop, then commits
    the index on its thread: a lost majority refuses the batch whole, in memory and in the
    index, as a failed local WAL does."""
    m = open_master(tmp_path, clock, opened)
    log = ReplicatedLog(m.wal)
    m.commit.wal = log  # type: ignore[assignment]
    await m.enqueue(G, "a", [TaskSpec(pid=f"p{i}") for i in range(4)])
    assert log.groups == 1 and m.queue(G, "a") is not None
    held = (await m.lease(G, "a", LeaseRequest(max_tasks=1, lease_secs=60), ""))["tasks"]
    before, soft = dump_index(m), soft_state(m)
    log.lost = True
    answers = await asyncio.gather(
        m.enqueue(G, "a", [TaskSpec(pid="new")], answer_when_durable=True),
        m.enqueue(G, "b", [TaskSpec(pid="fresh")]),
        m.lease(G, "a", LeaseRequest(max_tasks=3, lease_secs=3600), ""),
        m.update(G, UpdateRequest(dequeue=[TaskRef(queue="a", pid=held[0]["pid"],
                                                   token=held[0]["token"])])),
        return_exceptions=True)
    assert all(isinstance(a, Unavailable) and "nothing was applied" in a.message
               and "1 of 3 journals" in a.message for a in answers), answers
    assert dump_index(m) == before and soft_state(m) == soft
    log.lost = False
    res = await m.enqueue(G, "a", [TaskSpec(pid="after")], answer_when_durable=True)
    assert res["ticket"] > 0 and log.groups == 3
    await m.commit.settled()
    q = m.queue(G, "a")
    assert q is not None and (q.available, q.leased) == (4, 1) and m.queue(G, "b") is None
    kill9(m)  # a restart replays what the log made durable, nothing refused
    m2 = open_master(tmp_path, clock, opened)
    q2 = m2.queue(G, "a")
    assert q2 is not None and (q2.available, q2.leased) == (4, 1) and m2.queue(G, "b") is None


@pytest.mark.parametrize("early", [False, True], ids=["in_process", "answered_when_durable"])
async def test_an_index_commit_failure_after_a_durable_wal_acknowledges_and_catches_up(
        tmp_path: Path, clock: ManualClock, opened: list[Master], early: bool) -> None:
    """`early`: answered once the WAL is durable, as over HTTP (before the commit fails)."""
    m = open_master(tmp_path, clock, opened)
    calls = {"n": 0}
    real = m.commit._commit_txn

    def fail_once(txn: lmdb.Transaction) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            txn.abort()
            raise lmdb.DiskError("injected: no space left")
        real(txn)

    m.commit._commit_txn = fail_once  # type: ignore[method-assign]
    res = await m.enqueue(G, "a", [TaskSpec(pid="x"), TaskSpec(pid="y")],
                          answer_when_durable=early)
    assert res["ticket"] > 0  # durable in the WAL: acknowledged
    with pytest.raises(Unavailable, match="reads wait"):  # the index lacks "x" and "y"
        await m.commit.settled()  # (answered early: waits for the failed commit first)
    assert "cannot be written" in (m.ready() or "")
    with pytest.raises(Unavailable, match="cannot be written"):
        await m.enqueue(G, "a", [TaskSpec(pid="z")])
    m.commit.lag._reapply = lambda recs: (_ for _ in ()).throw(lmdb.DiskError("still full"))  # type: ignore[assignment]
    assert not await m.commit.catch_up()
    with pytest.raises(Unavailable, match="reads wait"):
        await m.commit.settled()
    m.commit.lag._reapply = m._reapply  # type: ignore[method-assign]
    await m.tick()
    assert m.ready() is None
    await m.commit.settled()  # whole again: reads are served
    assert m.task_info(G, "a", "x")["state"] == "available"
    q = m.queue(G, "a")
    assert q is not None and q.available == 2
    kill9(m)
    m2 = open_master(tmp_path, clock, opened)
    q2 = m2.queue(G, "a")
    assert q2 is not None and q2.available == 2 and m2.index.enqueued_total == 2


async def test_a_request_waiting_for_a_flush_whose_index_commit_fails_is_refused(
        tmp_path: Path, clock: ManualClock, opened: list[Master]) -> None:
    """A request that arrives while a batch is on the commit thread waits for that flush.
    When the flush's index commit fails after its WAL group was durable, the batch is
    acknowledged but the index is reloaded without it: the waiting request must be refused,
    not planned on that index (there it leased a task whose done was acknowledged again, as
    the chaos soak found once a full disk let WAL groups into zeros laid ahead)."""
    m = open_master(tmp_path, clock, opened)
    await m.enqueue(G, "a", [TaskSpec(pid="x")])
    (held,) = (await m.lease(G, "a", LeaseRequest(max_tasks=1, lease_secs=60), ""))["tasks"]
    real, gate = m.commit._commit_txn, threading.Event()

    def fail_when_let(txn: lmdb.Transaction) -> None:
        m.commit._commit_txn = real  # type: ignore[method-assign]
        assert gate.wait(30)
        txn.abort()
        raise lmdb.DiskError("injected: no space left")

    m.commit._commit_txn = fail_when_let  # type: ignore[method-assign]
    done = asyncio.ensure_future(m.update(G, UpdateRequest(
        dequeue=[TaskRef(queue="a", pid="x", token=held["token"])])))
    await until(lambda: m.commit._flushing is not None)  # on the commit thread
    checks, healthy = [0], m.commit.refuse_if_unhealthy

    def counted() -> None:  # the lease's check comes right before it waits for the flush
        checks[0] += 1
        healthy()

    m.commit.refuse_if_unhealthy = counted  # type: ignore[method-assign]
    lease = asyncio.ensure_future(m.lease(G, "a", LeaseRequest(max_tasks=1), ""))
    await until(lambda: checks[0] >= 1)
    assert not lease.done()  # it waits for the flush in progress
    gate.set()
    assert (await done)["ticket"] > 0  # durable in the WAL: acknowledged
    with pytest.raises(Unavailable, match="cannot be written"):
        await lease
    await m.tick()  # the index catches up: the acknowledged done stands
    assert m.ready() is None
    assert (await m.lease(G, "a", LeaseRequest(max_tasks=1), ""))["tasks"] == []
    q = m.queue(G, "a")
    assert q is not None and (q.available, q.leased, q.completed) == (0, 0, 1)


def _fail_next_index_commit(m: Master) -> None:
    """The master's next index commit fails as on a full disk, after its WAL group."""
    real = m.commit._commit_txn

    def fail_once(txn: lmdb.Transaction) -> None:
        m.commit._commit_txn = real  # type: ignore[method-assign]
        txn.abort()
        raise lmdb.DiskError("injected: no space left")

    m.commit._commit_txn = fail_once  # type: ignore[method-assign]


async def test_reads_of_an_index_behind_the_wal_are_refused_over_http(
        tmp_path: Path, fast_dispatch: bool) -> None:
    """While the index lacks acknowledged records (its commit failed, the WAL has them), a
    read must not answer from it (it would say 404 for a task whose enqueue was answered):
    503 with the reason, until the index caught up (the write through both dispatch paths)."""
    settings = MasterSettings(data_dir=str(tmp_path / "m"), require_receipts=False)
    app = create_master_app(settings, clock=ManualClock(), background=False,
                            fast_dispatch=fast_dispatch)
    async with app.router.lifespan_context(app), \
            AsyncClient("http://127.0.0.1", transport=httpx.ASGITransport(app=app),
                        retries=0) as c:
        m: Master = app.state.master
        _fail_next_index_commit(m)
        await c.put("g#a", pid="x")  # answered: durable in the WAL
        for read in (lambda: c.task("g#a", "x"), lambda: c.stats("g#a"),
                     lambda: c.tasks("g#a"), lambda: c.queues(), lambda: c.stats()):
            with pytest.raises(ClientUnavailable, match="reads wait"):
                await read()
        await m.tick()  # the index catches up
        assert (await c.task("g#a", "x")).state == "available"
        assert (await c.stats("g#a")).available == 1
        assert [q.queue for q in await c.queues()] == ["a"]


async def test_configuration_reads_of_an_index_behind_the_wal_are_refused(tmp_path: Path
                                                                         ) -> None:
    """Policies and schedules are read from the index's in-memory maps, which are reloaded
    without the acknowledged batch while the index is behind: those reads are refused as
    the others are, and show the acknowledged write once the index caught up."""
    settings = MasterSettings(data_dir=str(tmp_path / "m"), require_receipts=False)
    app = create_master_app(settings, clock=ManualClock(), background=False)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), \
            AsyncClient("http://127.0.0.1", transport=transport, retries=0) as c, \
            httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1",
                              headers=ADMIN) as raw:
        m: Master = app.state.master
        await c.set_schedule("g#s", queue="a", interval_secs=60)
        _fail_next_index_commit(m)
        assert (await c.set_policy("g#a", max_attempts=3)).max_attempts == 3  # in the WAL
        for read in (lambda: c.policy("g#a"), lambda: c.policy("g#"),
                     lambda: c.schedules("g")):
            with pytest.raises(ClientUnavailable, match="reads wait"):
                await read()
        one = await raw.get("/v1/groups/g/schedules/s")
        assert one.status_code == 503 and "reads wait" in one.text
        await m.tick()  # the index catches up
        assert (await c.policy("g#a")).max_attempts == 3
        assert [s.name for s in await c.schedules("g")] == ["s"]
        assert (await raw.get("/v1/groups/g/schedules/s")).status_code == 200


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                       capture_output=True)
    return r.returncode == 0


@pytest.mark.parametrize("dispatch", sorted(DISPATCH_ENV))
def test_a_master_on_a_full_disk_refuses_cleanly_and_resumes(tmp_path: Path, dispatch: str
                                                             ) -> None:
    """A real master on a 24 MB tmpfs: producers and leasers run while a filler file eats
    the space. Every answered request survives a kill -9; every refused one left nothing;
    /readyz says why while full; freeing space resumes writes without a restart."""
    mnt = tmp_path / "disk"
    if not _mount_tmpfs(mnt, "24m"):
        pytest.skip("cannot mount a tmpfs here (needs root): the in-process tests above "
                    "cover the same paths with injected errors")
    master = MasterProcess(str(mnt / "master"), env=DISPATCH_ENV[dispatch],
                           extra=["--checkpoint-interval-s", "0.5"])
    master.log_path = str(tmp_path / "master.log")  # not on the disk that fills up
    try:
        _fill_and_check(master, mnt)
    finally:
        master.stop()
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill_and_check(master: MasterProcess, mnt: Path) -> None:
    # made before the master writes anything: on a slow machine the master may fill the
    # disk by itself before the test fills it, and then creating a file fails (ENOSPC);
    # its first 4 MiB, freed at the end, leave the master room to resume
    filler = mnt / "filler"
    filler.write_bytes(b"\0" * (4 << 20))
    master.start()
    acked: set[str] = set()
    refused: set[str] = set()
    held: dict[str, int] = {}
    stop = threading.Event()
    url = master.url + "/v1/groups/g/queues/q"

    def produce(wid: int) -> None:
        with httpx.Client(timeout=30, headers=ADMIN) as c:
            for n in range(100_000):
                if stop.is_set():
                    return
                pids = [f"w{wid}-{n}-{i}-" + "x" * 200 for i in range(50)]
                r = c.post(url + "/tasks", json={"tasks": [{"pid": p} for p in pids]})
                (acked if r.status_code == 200 else refused).update(pids)
                if r.status_code not in (200, 503):
                    raise AssertionError(r.text)
                rl = c.post(url + "/lease", json={"max_tasks": 5, "lease_secs": 3600})
                if rl.status_code == 200:
                    held.update({t["pid"]: t["token"] for t in rl.json()["tasks"]})

    threads = [threading.Thread(target=produce, args=(w,), daemon=True) for w in range(3)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: len(acked) >= 1000, 60, what="a first thousand acknowledged tasks")
        # eat the rest of the disk, unbuffered: a buffered file keeps what a partial write
        # left and flushes it again on close, which then raises ENOSPC a second time
        # (depending on where the free space ends)
        with open(filler, "ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * (256 << 10))
            except OSError as e:
                assert e.errno == errno.ENOSPC
        wait_for(lambda: len(refused) >= 200, 60, what="refusals on the full disk")
        ready = httpx.get(master.url + "/readyz", timeout=5, headers=ADMIN)
        assert ready.status_code == 503 and ready.json()["reason"]
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    filler.unlink()
    wait_for(lambda: httpx.get(master.url + "/readyz", timeout=5,
                               headers=ADMIN).status_code == 200,
             30, what="the master to resume by itself")
    r = httpx.post(url + "/tasks", json={"tasks": [{"pid": "after-space-returned"}]},
                   timeout=30, headers=ADMIN)
    assert r.status_code == 200
    master.kill9()
    master.start()
    present, leased = _read_back(master.url + "/v1/groups/g/queues/q")  # port may differ
    assert acked <= present, f"{len(acked - present)} acknowledged tasks lost"
    assert not (refused & present), f"{len(refused & present)} refused tasks applied"
    assert "after-space-returned" in present
    # every lease that stands was answered: none comes from a refused lease
    assert leased <= set(held), f"{len(leased - set(held))} leases from refused requests"


def _read_back(url: str) -> tuple[set[str], set[str]]:
    """Every task of the queue, and those of them leased, page by page."""
    present: set[str] = set()
    leased: set[str] = set()
    after = ""
    with httpx.Client(timeout=30, headers=ADMIN) as c:
        for _ in range(10_000):
            params: dict[str, Any] = {"limit": 1000, **({"after": after} if after else {})}
            page = c.get(url + "/tasks", params=params).json()
            present.update(t["pid"] for t in page["tasks"])
            leased.update(t["pid"] for t in page["tasks"] if t["state"] == "leased")
            if not page.get("next"):
                break
            after = page["next"]
    return present, leased
