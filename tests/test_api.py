"""Task semantics through the REST API of an in-process master on an injected clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from squall.common.clock import ManualClock
from squall.master.service import Master, MasterSettings
from tests.helpers import ADMIN, asgi_master, lease_seq

Api = tuple[httpx.AsyncClient, Master]


@pytest.fixture
async def api(master_settings: MasterSettings, clock: ManualClock, fast_dispatch: bool
              ) -> AsyncIterator[Api]:
    """Every test here runs through the fast dispatcher and through FastAPI's stack."""
    async with asgi_master(master_settings, clock, fast_dispatch) as served:
        yield served


async def put(c: httpx.AsyncClient, q: str, *tasks: dict[str, Any], group: str = "g") -> Any:
    r = await c.post(f"/v1/groups/{group}/queues/{q}/tasks", json={"tasks": list(tasks)})
    assert r.status_code == 200, r.text
    return r.json()


async def lease(c: httpx.AsyncClient, q: str, n: int = 1, secs: float | None = 30, **kw: Any
                ) -> Any:
    body = {"max_tasks": n, **({"lease_secs": secs} if secs is not None else {}), **kw}
    r = await c.post(f"/v1/groups/g/queues/{q}/lease", json=body)
    assert r.status_code == 200, r.text
    return r.json()["tasks"]


async def update(c: httpx.AsyncClient, **body: Any) -> httpx.Response:
    return await c.post("/v1/groups/g/update", json=body)


async def info(c: httpx.AsyncClient, q: str, pid: str) -> Any:
    return (await c.get(f"/v1/groups/g/queues/{q}/tasks/{pid}")).json()


async def test_pid_order_and_collapse(api: Api) -> None:
    c, _ = api
    res = await put(c, "q", {"pid": "m"}, {"pid": "c"}, {"pid": "x"}, {"pid": "c"})
    assert [e["collapsed"] for e in res["enqueued"]] == [False, False, False, True]
    res = await put(c, "q", {"pid": "m"})
    assert res["enqueued"][0]["collapsed"] is True and res["ticket"] == 0
    tasks = await lease(c, "q", 10)
    assert [t["pid"] for t in tasks] == ["c", "m", "x"]
    assert len({t["token"] for t in tasks}) == 3


async def test_fifo_pids_sort_after_earlier_ones(api: Api, clock: ManualClock) -> None:
    c, _ = api
    pids = []
    for _ in range(5):
        pids += [e["pid"] for e in (await put(c, "f", {}, {}))["enqueued"]]
    clock.advance(-100)  # even if the wall clock steps back, FIFO order holds
    pids += [e["pid"] for e in (await put(c, "f", {}))["enqueued"]]
    assert pids == sorted(pids) and len(set(pids)) == len(pids)
    assert [t["pid"] for t in await lease(c, "f", 100)] == pids


async def test_max_pid_filters(api: Api) -> None:
    c, _ = api
    await put(c, "t", {"pid": "2026-01"}, {"pid": "2026-02"}, {"pid": "2026-03"})
    got = await lease(c, "t", 10, max_pid="2026-02")
    assert [t["pid"] for t in got] == ["2026-01", "2026-02"]


async def test_lease_is_exclusive_until_expiry_then_attempts_grow(api: Api, clock: ManualClock
                                                                  ) -> None:
    c, m = api
    await put(c, "q", {"pid": "a"})
    first = (await lease(c, "q", secs=10))[0]
    assert first["attempts"] == 1
    assert await lease(c, "q") == []
    clock.advance(9.9)
    assert await lease(c, "q") == []
    clock.advance(0.2)
    second = (await lease(c, "q", secs=10))[0]
    assert second["pid"] == "a" and second["attempts"] == 2
    assert lease_seq(second["token"]) > lease_seq(first["token"])
    r = await update(c, dequeue=[{"queue": "q", "pid": "a", "token": first["token"]}])
    assert r.status_code == 409 and r.json()["error"]["code"] == "lease_lost"
    assert str(first["token"]) in r.json()["error"]["message"]
    r = await update(c, dequeue=[{"queue": "q", "pid": "a", "token": second["token"]}])
    assert r.status_code == 200 and r.json()["dequeued"] == 1
    assert m.queue("g", "q").size == 0  # type: ignore[union-attr]


async def test_current_token_works_after_expiry_until_released(api: Api, clock: ManualClock
                                                                ) -> None:
    c, m = api
    await put(c, "q", {"pid": "a"}, {"pid": "b"})
    a, b = await lease(c, "q", 2, secs=5)
    clock.advance(6)
    m.sweep_once()  # the expired leases are ready again, tokens still valid
    assert (await info(c, "q", "a"))["state"] == "available"
    r = await update(c, renew=[{"queue": "q", "pid": "a", "token": a["token"], "lease_secs": 5}])
    assert r.status_code == 200
    assert r.json()["renewed"][0]["expires_at"] == pytest.approx(clock.now() + 5, abs=0.01)
    assert (await info(c, "q", "a"))["state"] == "leased"
    r = await update(c, dequeue=[{"queue": "q", "pid": "b", "token": b["token"]}])
    assert r.status_code == 200
    r = await update(c, release=[{"queue": "q", "pid": "a", "token": a["token"]}])
    assert r.status_code == 200
    r = await update(c, renew=[{"queue": "q", "pid": "a", "token": a["token"]}])
    assert r.status_code == 409 and "given up" in r.json()["error"]["message"]


async def test_release_with_delay_and_delayed_enqueue(api: Api, clock: ManualClock) -> None:
    c, _ = api
    await put(c, "d", {"pid": "later", "delay_secs": 60}, {"pid": "now"},
              {"pid": "abs", "not_before": clock.now() + 30})
    assert [t["pid"] for t in await lease(c, "d", 10, secs=1000)] == ["now"]
    assert (await info(c, "d", "later"))["state"] == "delayed"
    clock.advance(31)
    t = await lease(c, "d", 10, secs=1000)
    assert [x["pid"] for x in t] == ["abs"]
    r = await update(c, release=[{"queue": "d", "pid": "abs", "token": t[0]["token"],
                                  "delay_secs": 100}])
    assert r.status_code == 200
    clock.advance(30)
    assert [x["pid"] for x in await lease(c, "d", 10, secs=1000)] == ["later"]
    clock.advance(100)
    assert [x["pid"] for x in await lease(c, "d", 10)] == ["abs"]


async def test_atomic_update_moves_between_queues_all_or_nothing(api: Api) -> None:
    c, m = api
    await put(c, "a", {"pid": "1"}, {"pid": "2"})
    t1, t2 = await lease(c, "a", 2)
    ok = await update(c, dequeue=[{"queue": "a", "pid": "1", "token": t1["token"]}],
                      enqueue=[{"queue": "b", "pid": "1"}])
    assert ok.status_code == 200 and ok.json()["ticket"] > 0
    bad = await update(c, dequeue=[{"queue": "a", "pid": "2", "token": t2["token"]}],
                       enqueue=[{"queue": "b", "pid": "2"}, {"queue": "c", "pid": "x"}],
                       renew=[{"queue": "a", "pid": "1", "token": t1["token"]}])
    assert bad.status_code == 404  # "1" is gone: the whole update is refused
    assert (await info(c, "a", "2"))["state"] == "leased"
    assert (await c.get("/v1/groups/g/queues/b/tasks/2")).status_code == 404
    assert m.queue("g", "c") is None
    assert [t["pid"] for t in await lease(c, "b", 5)] == ["1"]


async def test_update_sees_its_own_changes(api: Api) -> None:
    c, _ = api
    await put(c, "a", {"pid": "x"})
    t = (await lease(c, "a"))[0]
    # dequeue x and re-enqueue the same pid in one update (a recurring task's next run)
    r = await update(c, dequeue=[{"queue": "a", "pid": "x", "token": t["token"]}],
                     enqueue=[{"queue": "a", "pid": "x"}])
    assert r.json()["enqueued"][0]["collapsed"] is False
    assert (await info(c, "a", "x"))["state"] == "available"
    # dequeuing twice in one update fails as a whole
    t = (await lease(c, "a"))[0]
    ref = {"queue": "a", "pid": "x", "token": t["token"]}
    r = await update(c, dequeue=[ref, ref])
    assert r.status_code == 404
    assert (await info(c, "a", "x"))["state"] == "leased"


async def test_counters_and_listing(api: Api) -> None:
    c, _ = api
    await put(c, "a", {"pid": "1"}, {"pid": "2"}, {"pid": "3", "delay_secs": 5})
    await put(c, "b", {"pid": "1"}, group="other")
    t = (await lease(c, "a"))[0]
    await update(c, dequeue=[{"queue": "a", "pid": "1", "token": t["token"]}])
    s = (await c.get("/v1/groups/g/queues/a")).json()
    assert (s["available"], s["leased"], s["delayed"], s["completed"]) == (1, 0, 1, 1)
    names = [(q["group"], q["queue"]) for q in (await c.get("/v1/queues")).json()["queues"]]
    assert names == [("g", "a"), ("other", "b")]
    r = await c.get("/v1/queues", params={"regex": "^other#"})
    assert [q["queue"] for q in r.json()["queues"]] == ["b"]


async def test_long_pids_keep_order_and_identity(api: Api) -> None:
    c, _ = api
    base = "p" * 500
    pids = [base + "b", base + "a", "p" * 449, "q" * 1024, "é" * 512]
    await put(c, "long", *({"pid": p} for p in pids))
    res = await put(c, "long", {"pid": base + "a"})
    assert res["enqueued"][0]["collapsed"] is True
    got = [t["pid"] for t in await lease(c, "long", 10)]
    assert sorted(got) == sorted(pids)
    # exact order except between >448-byte pids sharing a 448-byte prefix (documented)
    assert got[0] == "p" * 449 and got[-2:] == ["q" * 1024, "é" * 512]


async def test_leases_survive_restart(master_settings: Any, clock: ManualClock) -> None:
    from squall.master.http.app import create_master_app

    async def session() -> Any:
        app = create_master_app(master_settings, clock=clock, background=False)
        return app, app.router.lifespan_context(app)

    app, ctx = await session()
    async with ctx:
        c = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                  base_url="http://127.0.0.1", headers=ADMIN)
        await put(c, "q", {"pid": "a"}, {"pid": "b"})
        held = (await lease(c, "q", secs=100))[0]
    app, ctx = await session()
    async with ctx:
        c = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                  base_url="http://127.0.0.1", headers=ADMIN)
        assert [t["pid"] for t in await lease(c, "q", 5, secs=500)] == ["b"]
        clock.advance(101)
        again = await lease(c, "q", 5)
        assert [t["pid"] for t in again] == ["a"]
        assert lease_seq(again[0]["token"]) > lease_seq(held["token"])


async def test_index_sync_mode_survives_a_power_loss(tmp_path: Any) -> None:
    """--index-sync: every LMDB commit is synced, so the index on disk is always a whole
    committed snapshot; the WAL replays onto it after a crash without any checkpoint."""
    import shutil

    from squall.common.wire.models import LeaseRequest, TaskSpec
    from squall.master.service import MasterSettings
    from tests.crashkit import kill9

    settings = MasterSettings(data_dir=str(tmp_path / "m"), index_sync=True,
                              checkpoint_interval_s=3600, require_receipts=False)
    m = Master(settings)
    await m.enqueue("g", "q", [TaskSpec(pid="a"), TaskSpec(pid="b")])
    held = (await m.lease("g", "q", LeaseRequest(lease_secs=300), ""))["tasks"][0]
    index = tmp_path / "m" / "index"
    shutil.copytree(index, tmp_path / "disk")  # a consistent snapshot, as the disk holds it
    await m.enqueue("g", "q", [TaskSpec(pid="c")])
    kill9(m)
    shutil.rmtree(index)
    shutil.copytree(tmp_path / "disk", index)  # the power loss: later commits are gone
    m = Master(settings)
    try:
        assert m.replayed >= 1
        got = (await m.lease("g", "q", LeaseRequest(max_tasks=5), ""))["tasks"]
        assert [t["pid"] for t in got] == ["b", "c"]  # "a" is still leased
        assert m.task_info("g", "q", "a")["attempts"] == held["attempts"]
    finally:
        m.close()
