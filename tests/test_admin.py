"""Queue-management verbs through the REST API of an in-process master on an injected clock:
delete, reset leases, task lookup, policies and dead letters, redrive, schedules, stats."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from squall.common.clock import ManualClock
from squall.master.http.app import create_master_app
from squall.master.service import Master, MasterSettings
from tests.helpers import ADMIN
from tests.test_api import info, lease, put, update

Api = tuple[httpx.AsyncClient, Master]


async def ok(r: httpx.Response) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


async def test_delete_queue_is_instant_then_reaped(api: Api) -> None:
    c, m = api
    m.settings.reap_batch = 7
    await put(c, "q", *({"pid": f"{i:03d}"} for i in range(50)))
    held = (await lease(c, "q", 3))[0]
    res = await ok(await c.delete("/v1/groups/g/queues/q"))
    assert res["deleted"] == 50
    assert (await c.get("/v1/groups/g/queues/q/tasks/001")).status_code == 404
    s = await ok(await c.get("/v1/groups/g/queues/q"))
    assert (s["total"], s["completed"], s["enqueued_total"]) == (0, 0, 0)
    assert await lease(c, "q", 10) == []
    r = await update(c, dequeue=[{"queue": "q", "pid": "000", "token": held["token"]}])
    assert r.status_code == 404
    # the new generation starts empty and works; the same pid is new again
    res = await put(c, "q", {"pid": "001"})
    assert res["enqueued"][0]["collapsed"] is False
    reaped = 0
    for _ in range(20):
        reaped += (await m.tick())["reaped"]
    assert reaped == 50 and m.reaped == 50
    with m.index.env.begin() as txn:
        assert txn.stat(m.index.tasks)["entries"] == 1
        assert txn.stat(m.index.ready)["entries"] == 1
        assert txn.stat(m.index.avail)["entries"] == 1
    assert [t["pid"] for t in await lease(c, "q", 10)] == ["001"]
    assert (await c.delete("/v1/groups/g/queues/nope")).status_code == 404


async def test_reset_leases_makes_tokens_stale(api: Api) -> None:
    c, _ = api
    await put(c, "q", {"pid": "a"}, {"pid": "b"}, {"pid": "c"})
    a, _ = await lease(c, "q", 2, secs=1000)
    res = await ok(await c.post("/v1/groups/g/queues/q/reset-leases"))
    assert res["reset"] == 2
    r = await update(c, dequeue=[{"queue": "q", "pid": "a", "token": a["token"]}])
    assert r.status_code == 409
    again = await lease(c, "q", 5)
    assert [t["pid"] for t in again] == ["a", "b", "c"]
    assert again[0]["attempts"] == 2


async def test_task_lookup_states(api: Api, clock: ManualClock) -> None:
    c, _ = api
    await put(c, "q", {"pid": "a"}, {"pid": "d", "delay_secs": 10},
              {"pid": "p", "payload": {"blob_id": "b1", "size": 3, "crc32c": 7}})
    t = (await lease(c, "q", 1, secs=20, worker="w-1"))[0]
    i = await info(c, "q", "a")
    assert (i["state"], i["worker"], i["attempts"]) == ("leased", "w-1", 1)
    assert i["expires_at"] == t["expires_at"] and i["worker_addr"]
    i = await info(c, "q", "d")
    assert i["state"] == "delayed"
    assert i["not_before"] == pytest.approx(clock.now() + 10, abs=0.01)
    assert (await info(c, "q", "p"))["payload"]["blob_id"] == "b1"
    assert (await c.get("/v1/groups/g/queues/q/tasks/zzz")).status_code == 404


async def test_max_attempts_dead_letters_then_redrive(api: Api, clock: ManualClock) -> None:
    c, m = api
    await ok(await c.put("/v1/groups/g/queues/work/policy", json={"max_attempts": 2}))
    await put(c, "work", {"pid": "x", "payload": {"blob_id": "b", "size": 1, "crc32c": 1}},
              {"pid": "y"})
    # x: its lease expires twice; the third lease attempt dead-letters it
    for _ in range(2):
        got = await lease(c, "work", 1, secs=5, max_pid="x")
        assert [t["pid"] for t in got] == ["x"]
        clock.advance(6)
    assert await lease(c, "work", 1, max_pid="x") == []
    dead = await info_in(c, "work.dead", "x")
    assert dead["attempts"] == 2 and dead["origin"] == "work"
    assert "max_attempts 2" in dead["error"] and dead["payload"]["blob_id"] == "b"
    # y: released with an error on its last attempt goes straight to the dead letters
    for i in range(2):
        t = (await lease(c, "work", 1))[0]
        r = await update(c, release=[{"queue": "work", "pid": "y", "token": t["token"],
                                      "error": f"boom {i}", "delay_secs": 0}])
        assert r.status_code == 200
    assert "boom 1" in (await info_in(c, "work.dead", "y"))["error"]
    assert m.queue("g", "work").size == 0  # type: ignore[union-attr]
    res = await ok(await c.post("/v1/groups/g/queues/work/redrive", json={"max_tasks": 10}))
    assert res["moved"] == 2 and res["source"] == "g#work.dead"
    back = await lease(c, "work", 5)
    assert [(t["pid"], t["attempts"]) for t in back] == [("x", 1), ("y", 1)]
    assert m.queue("g", "work.dead").size == 0  # type: ignore[union-attr]


async def test_redrive_of_an_unknown_queue_is_a_404(api: Api) -> None:
    """A typo names no queue and no dead-letter queue: 404, and no queue is created."""
    c, m = api
    r = await c.post("/v1/groups/g/queues/wrok/redrive", json={"max_tasks": 10})
    assert r.status_code == 404, r.text
    assert "g#wrok does not exist" in r.json()["error"]["message"]
    assert m.queue("g", "wrok") is None
    # a queue that exists with no dead letters moves nothing (200)
    await put(c, "known", {"pid": "a"})
    res = await ok(await c.post("/v1/groups/g/queues/known/redrive", json={"max_tasks": 10}))
    assert res["moved"] == 0


async def test_a_release_of_an_unseen_task_is_not_an_attempt(api: Api) -> None:
    """``unseen`` (a batch read ahead, given back unread) takes the lease back out of
    `attempts`; a plain release keeps it counted, so at max_attempts the next lease
    dead-letters the task (SQS's receive count)."""
    c, _ = api
    await ok(await c.put("/v1/groups/g/queues/once/policy", json={"max_attempts": 1}))
    await put(c, "once", {"pid": "a"}, {"pid": "b"})
    for _ in range(3):
        t = (await lease(c, "once", 1, max_pid="a"))[0]
        assert t["attempts"] == 1
        await ok(await update(c, release=[{"queue": "once", "pid": "a", "token": t["token"],
                                           "unseen": True}]))
        assert (await info(c, "once", "a"))["attempts"] == 0
    t = (await lease(c, "once", 1))[0]
    await ok(await update(c, release=[{"queue": "once", "pid": "a", "token": t["token"]}]))
    assert [x["pid"] for x in await lease(c, "once", 2)] == ["b"]  # "a" dead-lettered
    assert (await info_in(c, "once.dead", "a"))["attempts"] == 1
    # a failed attempt was started: `unseen` with an `error` is refused, nothing applied
    await put(c, "once", {"pid": "c"})
    t = (await lease(c, "once", 1, max_pid="c"))[0]
    r = await update(c, release=[{"queue": "once", "pid": "c", "token": t["token"],
                                  "unseen": True, "error": "boom"}])
    assert r.status_code in (400, 422) and "cannot carry an `error`" in r.text
    assert (await info(c, "once", "c"))["state"] == "leased"


async def info_in(c: httpx.AsyncClient, q: str, pid: str) -> Any:
    return await ok(await c.get(f"/v1/groups/g/queues/{q}/tasks/{pid}"))


async def test_backoff_on_error_and_on_expiry(api: Api, clock: ManualClock) -> None:
    c, m = api
    pol = {"backoff": {"base_secs": 10, "factor": 3, "cap_secs": 60, "jitter": 0},
           "lease_secs": 5}
    await ok(await c.put("/v1/groups/g/policy", json=pol))  # group default
    assert (await ok(await c.get("/v1/groups/g/queues/q/policy")))["lease_secs"] == 5
    await put(c, "q", {"pid": "a"})
    t = (await lease(c, "q", secs=None))[0]
    assert t["expires_at"] == pytest.approx(clock.now() + 5, abs=0.01)  # the policy's default
    await update(c, release=[{"queue": "q", "pid": "a", "token": t["token"], "error": "e"}])
    assert (await info(c, "q", "a"))["state"] == "delayed"  # 10 s after attempt 1
    clock.advance(9.9)
    assert await lease(c, "q") == []
    clock.advance(0.2)
    t = (await lease(c, "q", secs=None))[0]
    assert t["attempts"] == 2
    clock.advance(5.1)  # lease expires; backoff after attempt 2 is 30 s from expiry
    m.sweep_once()
    i = await info(c, "q", "a")
    assert i["state"] == "delayed" and i["error"] == "lease expired"
    assert i["not_before"] == pytest.approx(t["expires_at"] + 30, abs=0.01)
    # the expired holder can still ack during the backoff
    r = await update(c, dequeue=[{"queue": "q", "pid": "a", "token": t["token"]}])
    assert r.status_code == 200


async def test_policy_validation(api: Api) -> None:
    c, _ = api
    r = await c.put("/v1/groups/g/queues/q/policy", json={"dead_letter_queue": "q"})
    assert r.status_code == 400
    r = await c.put("/v1/groups/g/queues/q/policy", json={"max_attempts": 0})
    assert r.status_code == 400
    r = await c.put("/v1/groups/g/queues/q/policy", json={"backoff": {"factor": 0.5}})
    assert r.status_code == 400


async def test_schedules_fire_once_per_slot(api: Api, clock: ManualClock) -> None:
    c, m = api
    clock.set(1_800_000_005.0)
    s = await ok(await c.put("/v1/groups/g/schedules/tick",
                             json={"queue": "jobs", "interval_secs": 60}))
    assert s["next_slot"] == 1_800_000_060.0
    assert (await m.tick())["fired"] == 0
    clock.advance(55)
    assert (await m.tick())["fired"] == 1
    assert (await m.tick())["fired"] == 0
    got = await lease(c, "jobs", 10)
    assert [t["pid"] for t in got] == ["tick@2027-01-15T08:01:00.000Z"]
    clock.advance(3600)  # one hour down: catch-up "one" enqueues only the latest slot
    assert (await m.tick())["fired"] == 1
    await ok(await c.put("/v1/groups/g/schedules/tick",
                         json={"queue": "jobs", "interval_secs": 60, "catch_up": "all"}))
    clock.advance(300)
    assert (await m.tick())["fired"] == 5
    listed = (await ok(await c.get("/v1/groups/g/schedules")))["schedules"]
    assert [x["name"] for x in listed] == ["tick"]
    r = await c.put("/v1/groups/g/schedules/bad", json={"queue": "j", "cron": "nope"})
    assert r.status_code == 400 and "cron" in r.json()["error"]["message"]
    r = await c.put("/v1/groups/g/schedules/bad", json={"queue": "j"})
    assert r.status_code == 400
    await ok(await c.put("/v1/groups/g/schedules/cr", json={"queue": "j", "cron": "0 * * * *"}))
    clock.set(1_800_003_600.0 + 7200)
    assert (await m.tick())["fired"] >= 1
    assert (await c.delete("/v1/groups/g/schedules/cr")).status_code == 200
    assert (await c.get("/v1/groups/g/schedules/cr")).status_code == 404


async def test_stats_rates_ages_and_sample(api: Api, clock: ManualClock) -> None:
    c, _ = api
    await put(c, "q", *({"pid": f"{i}"} for i in range(10)))
    clock.advance(4)
    ts = await lease(c, "q", 4, worker="w9")
    clock.advance(2)
    await update(c, dequeue=[{"queue": "q", "pid": t["pid"], "token": t["token"]}
                             for t in ts[:2]])
    s = await ok(await c.get("/v1/groups/g/queues/q"))
    assert (s["available"], s["leased"], s["completed"]) == (6, 2, 2)
    assert s["rates"]["enqueue_1m"] > 0 and s["rates"]["dequeue_5m"] > 0
    assert s["mean_lease_secs"] == pytest.approx(2.0)
    assert s["oldest_available_age_secs"] == pytest.approx(6.0)
    assert sorted(x["pid"] for x in s["leased_sample"]) == ["2", "3"]
    assert all(x["worker"] == "w9" and x["lease_age_secs"] == 2 for x in s["leased_sample"])
    tot = await ok(await c.get("/v1/cluster/stats"))
    assert (tot["queues"], tot["available"], tot["completed"]) == (1, 6, 2)


async def test_list_queues_paginates(api: Api) -> None:
    c, _ = api
    for g in ("a", "b"):
        for n in ("x", "y", "z"):
            await put(c, n, {"pid": "1"}, group=g)
    pages, after = [], None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"after": after} if after else {})}
        r = await ok(await c.get("/v1/queues", params=params))
        pages.append([f"{q['group']}#{q['queue']}" for q in r["queues"]])
        after = r["next"]
        if after is None:
            break
    assert pages == [["a#x", "a#y"], ["a#z", "b#x"], ["b#y", "b#z"]]
    r = await ok(await c.get("/v1/queues", params={"group": "b", "regex": "[yz]$"}))
    assert [q["queue"] for q in r["queues"]] == ["y", "z"]


async def test_tasks_page(api: Api) -> None:
    c, _ = api
    await put(c, "q", *({"pid": f"{i:02d}"} for i in range(5)))
    r = await ok(await c.get("/v1/groups/g/queues/q/tasks", params={"limit": 3}))
    assert [t["pid"] for t in r["tasks"]] == ["00", "01", "02"] and r["next"] == "02"
    r = await ok(await c.get("/v1/groups/g/queues/q/tasks", params={"after": "02"}))
    assert [t["pid"] for t in r["tasks"]] == ["03", "04"] and r["next"] is None


async def test_config_and_counters_survive_restart(tmp_path: Any, clock: ManualClock) -> None:
    settings = MasterSettings(data_dir=str(tmp_path / "m"))
    clock.set(1_800_000_000.0)

    async def run(body: Any) -> Any:
        app = create_master_app(settings, clock=clock, background=False)
        async with app.router.lifespan_context(app):
            c = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                  base_url="http://127.0.0.1", headers=ADMIN)
            return await body(c, app.state.master)

    async def first(c: httpx.AsyncClient, m: Master) -> None:
        await ok(await c.put("/v1/groups/g/queues/q/policy", json={"max_attempts": 3}))
        await ok(await c.put("/v1/groups/g/schedules/s", json={"queue": "q",
                                                                "interval_secs": 10}))
        await put(c, "q", {"pid": "a"}, {"pid": "b"})
        await ok(await c.delete("/v1/groups/g/queues/q"))
        await put(c, "q", {"pid": "c"}, {"pid": "d"})
        t = (await lease(c, "q"))[0]
        await update(c, dequeue=[{"queue": "q", "pid": t["pid"], "token": t["token"]}])
        clock.advance(10)
        assert (await m.tick())["fired"] == 1

    async def second(c: httpx.AsyncClient, m: Master) -> None:
        s = await ok(await c.get("/v1/groups/g/queues/q"))
        assert (s["available"], s["completed"], s["enqueued_total"]) == (2, 1, 3)
        assert (await ok(await c.get("/v1/groups/g/queues/q/policy")))["max_attempts"] == 3
        assert (await m.tick())["fired"] == 0  # the slot is not enqueued again
        assert (await c.get("/v1/groups/g/queues/q/tasks/a")).status_code == 404

    await run(first)
    await run(second)


async def test_status_page_and_metrics(api: Api) -> None:
    c, _ = api
    await put(c, "shown", {"pid": "1"})
    r = await c.get("/")
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    o = (await c.get("/v1/overview")).json()
    assert [(q["queue"], q["available"]) for q in o["queues"]] == [("g#shown", 1)]
    r = await c.get("/metrics")
    assert 'squall_tasks{state="available"} 1.0' in r.text


def _counter(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith(name + " "))


async def test_task_counters_never_go_down_across_deletes_and_restarts(
        tmp_path: Any, clock: ManualClock) -> None:
    """Prometheus reads a counter that goes down as a reset: deleting a queue (or
    restarting the master) must not take enqueued or completed tasks back."""
    settings = MasterSettings(data_dir=str(tmp_path / "m"), require_receipts=False)
    seen: list[tuple[float, float]] = []

    async def scrape(c: httpx.AsyncClient) -> None:
        text = (await c.get("/metrics")).text
        seen.append((_counter(text, "squall_tasks_enqueued_total"),
                     _counter(text, "squall_tasks_completed_total")))

    for round_ in range(2):  # the second round runs on a restarted master
        app = create_master_app(settings, clock=clock, background=False)
        async with app.router.lifespan_context(app):
            c = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                  base_url="http://127.0.0.1", headers=ADMIN)
            await put(c, "q", *({"pid": f"{round_}-{i}"} for i in range(5)))
            for t in await lease(c, "q", max_tasks=3):
                await update(c, dequeue=[{"queue": "q", "pid": t["pid"], "token": t["token"]}])
            await scrape(c)
            await ok(await c.delete("/v1/groups/g/queues/q"))
            await scrape(c)
            await app.state.master.tick()  # reaping the deleted generation
            await scrape(c)
        app = create_master_app(settings, clock=clock, background=False)
        async with app.router.lifespan_context(app):
            await scrape(httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                           base_url="http://127.0.0.1", headers=ADMIN))
    assert seen == sorted(seen) and seen[-1] == (10.0, 6.0), seen
