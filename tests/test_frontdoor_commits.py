"""The front door's node-to-master commits: several in flight at once, batching beyond that,
and no request left waiting when the node stops, each told whether its commit may
have been applied; and its write-quorum check (datanode/frontdoor.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from squall.common.errors import OutcomeUnknown, Unavailable
from squall.common.wire.cluster import PeerError
from squall.datanode import frontdoor
from squall.datanode.config import parallel_mode
from squall.datanode.frontdoor import COMMITS_IN_FLIGHT, FrontDoor, _Block
from squall.datanode.store.layout import BlobMeta
from tests.helpers import until


class StuckMaster:
    """Stands in for ``FrontDoor._post``: records each commit; a commit answers once the
    test releases it."""

    def __init__(self) -> None:
        self.commits: list[list[dict[str, Any]]] = []
        self.release: list[asyncio.Event] = []
        self.arrived = asyncio.Event()

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert path == "/v1/nodes/commit"
        self.commits.append(body["updates"])
        gate = asyncio.Event()
        self.release.append(gate)
        self.arrived.set()
        await gate.wait()
        return {"results": [{"ok": {"n": u["n"]}} for u in body["updates"]]}

    async def wait_commits(self, n: int) -> None:
        async with asyncio.timeout(10):
            while len(self.commits) < n:
                self.arrived.clear()
                await self.arrived.wait()


@pytest.fixture
def door(monkeypatch: pytest.MonkeyPatch) -> tuple[FrontDoor, StuckMaster]:
    node: Any = SimpleNamespace(node_id="n1", clock=SimpleNamespace(now=lambda: 0.0),
                                settings=SimpleNamespace(master_url="http://127.0.0.1:1",
                                                         front_door_parallel="off"))
    d = FrontDoor(node)
    master = StuckMaster()
    monkeypatch.setattr(d, "_post", master.post)
    return d, master


async def test_a_request_does_not_wait_for_the_commit_in_flight(
        door: tuple[FrontDoor, StuckMaster]) -> None:
    d, master = door
    first = asyncio.create_task(d._commit({"n": 0}))
    await master.wait_commits(1)
    second = asyncio.create_task(d._commit({"n": 1}))
    await master.wait_commits(2)  # sent while the first one is still at the master
    master.release[1].set()
    assert await asyncio.wait_for(second, 10) == {"n": 1}
    assert not first.done()
    master.release[0].set()
    assert await asyncio.wait_for(first, 10) == {"n": 0}
    await d.aclose()


async def test_beyond_the_commits_in_flight_requests_batch_up(
        door: tuple[FrontDoor, StuckMaster]) -> None:
    d, master = door
    waiting = []
    for i in range(COMMITS_IN_FLIGHT):
        waiting.append(asyncio.create_task(d._commit({"n": i})))
        await master.wait_commits(i + 1)
    later = [asyncio.create_task(d._commit({"n": 100 + i})) for i in range(5)]
    await until(lambda: len(d._pending) == 5, what="the 5 requests queued")
    assert len(master.commits) == COMMITS_IN_FLIGHT  # no slot is free: no commit went
    master.release[0].set()  # one slot frees: everything waiting goes in one commit
    await master.wait_commits(COMMITS_IN_FLIGHT + 1)
    assert [u["n"] for u in master.commits[-1]] == [100, 101, 102, 103, 104]
    for gate in master.release:
        gate.set()
    assert [r["n"] for r in await asyncio.gather(*waiting, *later)] == [
        *range(COMMITS_IN_FLIGHT), 100, 101, 102, 103, 104]
    await d.aclose()


async def test_stopping_answers_every_waiting_request(
        door: tuple[FrontDoor, StuckMaster]) -> None:
    d, master = door
    d._slots = asyncio.Semaphore(1)  # one commit in flight: the second request waits
    sent = asyncio.create_task(d._commit({"n": 0}))
    await master.wait_commits(1)
    queued = asyncio.create_task(d._commit({"n": 1}))  # waits for the slot
    await until(lambda: len(d._pending) == 1, what="the second request queued")
    await d.aclose()
    with pytest.raises(OutcomeUnknown):  # at the master when the node stopped: maybe applied
        await asyncio.wait_for(sent, 10)
    with pytest.raises(Unavailable):  # never sent: refused, nothing applied
        await asyncio.wait_for(queued, 10)


async def test_a_commit_stopped_before_it_started_is_refused(
        door: tuple[FrontDoor, StuckMaster]) -> None:
    """The node stops in the instant after a commit task was created and before it first
    ran: the commit never reached the master, so its request is refused (503, nothing
    applied), not left waiting for its own timeout."""
    d, master = door
    req = asyncio.create_task(d._commit({"n": 0}))
    for _ in range(100):  # step the loop until the commit task exists
        if d._in_flight:
            break
        await asyncio.sleep(0)
    assert d._in_flight and master.commits == []  # created, and not started
    await d.aclose()
    with pytest.raises(Unavailable, match="before sending this to the master"):
        await asyncio.wait_for(req, 10)
    assert master.commits == []


async def test_an_answer_that_does_not_fit_is_an_unknown_outcome(
        door: tuple[FrontDoor, StuckMaster], monkeypatch: pytest.MonkeyPatch) -> None:
    """The master answered, but not with one result per update: it may have applied them,
    so every request of the commit gets OutcomeUnknown (502), not a refusal."""
    d, _ = door

    async def short(path: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"results": []}

    monkeypatch.setattr(d, "_post", short)
    with pytest.raises(OutcomeUnknown, match="0 results for 1 updates"):
        await asyncio.wait_for(d._commit({"n": 0}), 10)
    await d.aclose()


async def test_a_lost_block_grant_is_a_refusal(door: tuple[FrontDoor, StuckMaster],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A block request whose answer was lost enqueued nothing: the client request is
    refused (503, retry), not reported as an unknown outcome."""
    d, _ = door

    async def lost(path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert path == "/v1/nodes/blocks"
        raise OutcomeUnknown("the answer was lost")

    monkeypatch.setattr(d, "_post", lost)
    with pytest.raises(Unavailable, match="nothing was enqueued"):
        await d.take_ids(3)


async def test_requests_beyond_the_pending_bound_are_refused_and_never_sent(
        door: tuple[FrontDoor, StuckMaster], monkeypatch: pytest.MonkeyPatch) -> None:
    """At most COMMIT_PENDING_MAX requests wait for a commit slot: the next is refused at
    once (503, nothing applied), and the waiting ones go when a slot frees."""
    d, master = door
    monkeypatch.setattr(frontdoor, "COMMIT_PENDING_MAX", 3)
    d._slots = asyncio.Semaphore(1)
    sent = asyncio.create_task(d._commit({"n": 0}))
    await master.wait_commits(1)
    queued = [asyncio.create_task(d._commit({"n": i})) for i in (1, 2, 3)]
    await until(lambda: len(d._pending) == 3, what="three requests queued")
    with pytest.raises(Unavailable, match="3 front-door requests wait"):
        await asyncio.wait_for(d._commit({"n": 4}), 10)
    master.release[0].set()
    await master.wait_commits(2)
    master.release[1].set()
    assert [r["n"] for r in await asyncio.gather(sent, *queued)] == [0, 1, 2, 3]
    assert [u["n"] for c in master.commits for u in c] == [0, 1, 2, 3]  # 4 never went
    await d.aclose()


async def test_a_commit_carries_at_most_commit_updates_max_requests(
        door: tuple[FrontDoor, StuckMaster], monkeypatch: pytest.MonkeyPatch) -> None:
    d, master = door
    monkeypatch.setattr(frontdoor, "COMMIT_UPDATES_MAX", 2)
    d._slots = asyncio.Semaphore(1)
    first = asyncio.create_task(d._commit({"n": 0}))
    await master.wait_commits(1)
    later = [asyncio.create_task(d._commit({"n": i})) for i in range(1, 6)]
    await until(lambda: len(d._pending) == 5, what="five requests queued")
    for k in range(1, 4):  # each freed slot sends the next two waiting, in order
        master.release[k - 1].set()
        await master.wait_commits(k + 1)
    master.release[3].set()
    assert [[u["n"] for u in c] for c in master.commits] == [[0], [1, 2], [3, 4], [5]]
    assert [r["n"] for r in await asyncio.gather(first, *later)] == list(range(6))
    await d.aclose()


async def _stored(items: list[tuple[str, bytes, int]]) -> list[tuple[BlobMeta, bool]]:
    """A store's put_batch that keeps every blob."""
    return [(BlobMeta(b, 0, len(data), crc, 0, 0, 0), True) for b, data, crc in items]


async def _peers_full(node: Any, body: bytes, metas: list[BlobMeta], peers: list[str],
                      batch_receipt: bool = False) -> list[PeerError]:
    """forward_batch refused by every peer: disk full."""
    return [PeerError(address=p, status=507, code="insufficient_storage",
                      message="disk full") for p in peers]


async def test_a_batch_short_of_its_write_quorum_is_refused_before_any_commit(
        door: tuple[FrontDoor, StuckMaster], monkeypatch: pytest.MonkeyPatch) -> None:
    """Stored here but refused by the block's only peer: 1 of 2 copies, quorum 2. The client
    is told 503 (retry: nothing was enqueued), the master is never asked, and the block is
    dropped so that the retry gets a new placement."""
    d, master = door

    d.node.store = SimpleNamespace(put_batch=_stored)
    d.node.puts = d.node.peer_errors = 0
    d.node.batch_receipt = lambda metas: "receipt"
    d._block = _Block("b", 1000, expires_at=1e12, replicas=["http://peer"], quorum=2,
                      granted_at=0.0)
    monkeypatch.setattr(frontdoor, "forward_batch", _peers_full)
    d.coalescer = None  # forwards one by one, through forward_batch
    with pytest.raises(Unavailable, match=r"write quorum not met .* durable on 1 of 2 "
                                          r"replicas, 2 needed; failed: http://peer: disk full"):
        await asyncio.wait_for(d.enqueue("g", "q", [{"pid": "a", "payload": b"x"}]), 10)
    assert master.commits == [] and d._block is None and d.node.peer_errors == 1
    await d.aclose()


async def test_a_parallel_put_short_of_its_quorum_is_withdrawn_before_the_refusal(
        door: tuple[FrontDoor, StuckMaster], monkeypatch: pytest.MonkeyPatch) -> None:
    """The parallel put: the enqueue went to the master (pending) while the payload missed
    its write quorum. The pending task is withdrawn (a settle that removes it) before the
    client is told 503; if the withdrawal cannot be committed, the outcome is unknown."""
    d, _ = door
    d.node.settings.front_door_parallel = "on"
    d.node.address = "http://me"
    sent: list[dict[str, Any]] = []
    withdraw_fails = False

    async def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert path == "/v1/nodes/commit"
        sent.append(body)
        if body["settles"] and withdraw_fails:
            raise Unavailable("master down")
        return {"results": [{"ok": {"enqueued": [{"queue": "q", "pid": "a",
                                                  "collapsed": False}]}}
                            for _ in body["updates"]],
                "settled": [{"ok": {"confirmed": 0, "removed": 1}} for _ in body["settles"]]}

    monkeypatch.setattr(d, "_post", post)
    monkeypatch.setattr(frontdoor, "forward_batch", _peers_full)
    d.coalescer = None
    d.node.store = SimpleNamespace(put_batch=_stored)
    d.node.puts = d.node.peer_errors = 0
    d.node.batch_receipt = lambda metas: "receipt"
    for fails in (False, True):
        withdraw_fails, sent[:] = fails, []
        d._block = _Block("b", 1000, expires_at=1e12, replicas=["http://peer"], quorum=2,
                          granted_at=0.0)
        with pytest.raises(OutcomeUnknown if fails else Unavailable,
                           match="withdrawn" if fails else "write quorum not met"):
            await asyncio.wait_for(d.enqueue("g", "q", [{"pid": "a", "payload": b"x"}]), 10)
        [update] = [u for b in sent for u in b["updates"]]
        assert update["pending"] and update["replicas"] == ["http://me", "http://peer"]
        [settle] = [x for b in sent for x in b["settles"]]
        assert settle["durable"] is False and [i["pid"] for i in settle["items"]] == ["a"]
    assert d.abandoned == 1
    await d.aclose()


async def test_a_block_is_not_used_in_its_last_margin_before_it_expires(
        door: tuple[FrontDoor, StuckMaster], monkeypatch: pytest.MonkeyPatch) -> None:
    """Blob ids of a block are written only until BLOCK_MARGIN_S before it expires (the
    master refuses its ids after expiry, and a payload's store and commit take time): from
    then on the next request asks for a new block."""
    d, _ = door
    now = [100.0]
    d.node.clock = SimpleNamespace(now=lambda: now[0])
    grants: list[dict[str, Any]] = []

    async def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        assert path == "/v1/nodes/blocks"
        grants.append(body)
        return {"prefix": f"b{len(grants)}-", "count": body["count"],
                "expires_at": now[0] + 60, "replicas": ["http://peer"], "write_quorum": 2}

    monkeypatch.setattr(d, "_post", post)
    assert (await d.take_ids(2))[0] == ["b1-0", "b1-1"]
    now[0] = 160 - frontdoor.BLOCK_MARGIN_S - 0.5  # inside the block's usable life
    assert (await d.take_ids(1))[0] == ["b1-2"]
    now[0] = 160 - frontdoor.BLOCK_MARGIN_S + 0.5  # in the margin: a new block
    assert (await d.take_ids(1))[0] == ["b2-0"] and len(grants) == 2
    await d.aclose()


async def test_auto_takes_the_parallel_put_only_for_a_request_alone_on_its_node(
        door: tuple[FrontDoor, StuckMaster], monkeypatch: pytest.MonkeyPatch) -> None:
    """SQUALL_FRONT_DOOR_PARALLEL=auto: a put that finds no other front-door request in
    progress sends its enqueue pending while its payload is stored; one that arrives while
    another is in progress takes the serial path (store, then a plain enqueue)."""
    d, _ = door
    d.node.settings.front_door_parallel = "auto"
    d.node.address = "http://me"
    sent: list[dict[str, Any]] = []
    arrived, hold = asyncio.Event(), asyncio.Event()

    async def post(path: str, body: dict[str, Any]) -> dict[str, Any]:
        sent.append(body)
        arrived.set()
        if len(sent) == 1:
            await hold.wait()  # the first put's pending enqueue stays at the master
        return {"results": [{"ok": {"enqueued": [{"queue": "q", "pid": e["pid"],
                                                  "collapsed": False}
                                                 for e in u["enqueue"]]}}
                            for u in body["updates"]],
                "settled": [{"ok": {"confirmed": 1, "removed": 0}} for _ in body["settles"]]}

    async def stored(frames: Any, peers: Any, quorum: int) -> tuple[list[str], list[str]]:
        return ["http://me", "http://peer"], ["r1", "r2"]

    monkeypatch.setattr(d, "_post", post)
    monkeypatch.setattr(d, "_store_frames", stored)
    d._block = _Block("b", 1000, expires_at=1e12, replicas=["http://peer"], quorum=2,
                      granted_at=0.0)
    first = asyncio.create_task(d.enqueue("g", "q", [{"pid": "a", "payload": b"x"}]))
    await asyncio.wait_for(arrived.wait(), 10)
    assert d.puts_in_progress == 1
    second = asyncio.create_task(d.enqueue("g", "q", [{"pid": "b", "payload": b"y"}]))
    await until(lambda: len(sent) == 2, what="the second put's commit")
    hold.set()
    await asyncio.wait_for(asyncio.gather(first, second), 10)
    [alone], [beside] = sent[0]["updates"], sent[1]["updates"]
    assert alone.get("pending") is True and alone["enqueue"][0]["pid"] == "a"
    assert "pending" not in beside and beside["receipts"] == ["r1", "r2"]
    assert beside["enqueue"][0]["pid"] == "b" and d.puts_in_progress == 0
    # alone again: parallel; "on" always, "off" never
    d.puts_in_progress = 0
    assert d._parallel_now()
    d.puts_in_progress = 1
    assert not d._parallel_now()
    d.node.settings.front_door_parallel = "on"
    assert d._parallel_now()
    d.node.settings.front_door_parallel = "off"
    d.puts_in_progress = 0
    assert not d._parallel_now()
    await d.aclose()


def test_the_parallel_mode_is_read_from_the_environment() -> None:
    assert [parallel_mode(v) for v in (None, "", "auto", "1", "on", "0", "off", " AUTO ")] \
        == ["off", "off", "auto", "on", "on", "off", "off", "auto"]
    with pytest.raises(ValueError, match="SQUALL_FRONT_DOOR_PARALLEL='yes': use auto"):
        parallel_mode("yes")
