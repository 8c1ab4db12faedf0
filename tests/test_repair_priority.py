"""Repair yields to clients on a data node: the LMDB writer takes client writes
before queued repair copies (never in one transaction with them, and repair is never
starved); copies sent with ``X-Squall-Repair: 1`` are such repair writes; client requests
make the node busy, so that the copies it sends are paced, and repair copies do not."""

from __future__ import annotations

import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import lmdb
import pytest

from squall.common.clock import ManualClock
from squall.common.security import tokens
from squall.common.wire import payload
from squall.common.wire.cluster import REPAIR_HEADER
from squall.datanode.config import DataNodeSettings
from squall.datanode.http.app import create_datanode_app
from squall.datanode.replication.repairpace import BUSY_S, RepairPace
from squall.datanode.store import lmdbenv
from squall.datanode.store.lmdbenv import Env
from tests.helpers import wait_for

KEY = b"repair-priority-test-key-0123456789"


@pytest.fixture
def env(tmp_path) -> Any:  # type: ignore[no-untyped-def]
    e = Env(str(tmp_path / "env"), (b"t",), 1 << 24, 1 << 26, prealloc_bytes=0)
    yield e
    e.close()


def blocked(env: Env) -> tuple[threading.Event, Any]:
    """The writer busy with a client op until the returned event is set."""
    gate, started = threading.Event(), threading.Event()

    def blocker(txn: lmdb.Transaction) -> str:
        started.set()
        gate.wait(30)
        return "blocker"

    fut = env.submit(blocker)
    assert started.wait(30)
    return gate, fut


def note(order: list[str], name: str) -> Callable[[lmdb.Transaction], str]:
    def op(txn: lmdb.Transaction) -> str:
        order.append(name)
        return name
    return op


def test_client_writes_go_before_queued_repair_copies(env: Env) -> None:
    order: list[str] = []
    gate, first = blocked(env)
    commits = env.commits
    bgs = [env.submit(note(order, f"bg{i}"), background=True, nbytes=1000) for i in range(3)]
    fg = env.submit(note(order, "fg"))
    gate.set()
    assert [f.result(30) for f in (first, fg, *bgs)] == ["blocker", "fg", "bg0", "bg1", "bg2"]
    assert order == ["fg", "bg0", "bg1", "bg2"]
    # three transactions: the blocker, the client op, the repair copies (never mixed)
    assert env.commits - commits == 3 and env.background_ops == 3


def test_a_repair_copy_waits_behind_clients_only_so_long(env: Env,
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    monkeypatch.setattr(lmdbenv, "BACKGROUND_MAX_WAIT_S", -1.0)  # every wait is too long
    order: list[str] = []
    gate, first = blocked(env)
    bg = env.submit(note(order, "bg"), background=True)
    fg = env.submit(note(order, "fg"))
    gate.set()
    fg.result(30), bg.result(30), first.result(30)
    assert order == ["bg", "fg"]


def test_closing_runs_the_queued_repair_copies(env: Env) -> None:
    order: list[str] = []
    gate, first = blocked(env)
    bgs = [env.submit(note(order, f"bg{i}"), background=True) for i in range(2)]
    closer = threading.Thread(target=env.close)
    closer.start()
    wait_for(lambda: env._closed, what="the store to start closing")
    gate.set()
    closer.join(30)
    assert not closer.is_alive()
    assert [f.result(0) for f in bgs] == ["bg0", "bg1"] and first.result(0) == "blocker"


# -- over HTTP -------------------------------------------------------------------------------
@pytest.fixture
async def node(tmp_path) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:  # type: ignore[no-untyped-def]
    app = create_datanode_app(DataNodeSettings(data_dir=str(tmp_path / "d"), cluster_key=KEY,
                                               advertise_url="http://127.0.0.1:1"),
                              background=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            yield c, app.state.node


def bearer(op: str, ids: list[str]) -> dict[str, str]:
    return {"Authorization": "Bearer " + tokens.sign(KEY, op, ids, time.time() + 60)}


async def test_copies_marked_as_repair_are_written_behind_client_writes(
        node: tuple[httpx.AsyncClient, Any]) -> None:
    c, n = node
    env = n.store.env
    r = await c.put("/v1/replicate/fwd-1", content=b"x" * 100,
                    headers=bearer("replicate", ["fwd-1"]))  # a peer's forward of a write
    assert r.status_code == 200, r.text
    assert env.background_ops == 0
    r = await c.put("/v1/replicate/copy-1", content=b"y" * 100,
                    headers={**bearer("replicate", ["copy-1"]), REPAIR_HEADER: "1"})
    assert r.status_code == 200, r.text
    assert env.background_ops == 1
    body = payload.encode_frames([("copy-2", b"a"), ("copy-3", b"b")])
    r = await c.post("/v1/replicate:batch-put", content=body,
                     headers={**bearer("replicate", ["copy-2", "copy-3"]), REPAIR_HEADER: "1"})
    assert r.status_code == 200, r.text
    assert env.background_ops == 2  # one op for the batch
    body = payload.encode_frames([("fwd-2", b"a")])
    r = await c.post("/v1/replicate:batch-put", content=body,
                     headers=bearer("replicate", ["fwd-2"]))
    assert r.status_code == 200, r.text
    assert env.background_ops == 2
    for blob in ("fwd-1", "copy-1", "copy-2", "copy-3", "fwd-2"):
        assert n.store.stat(blob) is not None


async def test_client_requests_make_the_node_busy_and_repair_copies_do_not(
        node: tuple[httpx.AsyncClient, Any]) -> None:
    c, n = node
    clock = ManualClock()
    n.repair_pacer = RepairPace(0.0, 1e6, clock=clock.now)
    r = await c.put("/v1/replicate/copy-9", content=b"z",
                    headers={**bearer("replicate", ["copy-9"]), REPAIR_HEADER: "1"})
    assert r.status_code == 200, r.text
    assert not n.repair_pacer.busy() and n.repair_pacer.rate() == 0  # idle: unpaced
    r = await c.get("/v1/blobs/copy-9", headers=bearer("read", ["copy-9"]))
    assert r.status_code == 200 and r.content == b"z"
    assert n.repair_pacer.busy() and n.repair_pacer.rate() == 1e6  # a client read
    clock.advance(BUSY_S)
    assert not n.repair_pacer.busy()
    r = await c.put("/v1/blobs/w-1", content=b"w", headers=bearer("write", ["w-1"]))
    assert r.status_code == 200, r.text
    assert n.repair_pacer.busy()  # a client write
