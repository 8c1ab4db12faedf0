"""The cluster totals are kept as the queues change (``Index.totals``), never by walking every
queue on a request: after every kind of change (enqueue, lease, dequeue, release, dead
letter, expiry, reset, cancel, redrive, delete) and across restarts (checkpointed, and
replayed from the WAL after a kill), they equal a full recount and what
``GET /v1/cluster/stats`` answers."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

from squall.common.clock import ManualClock
from squall.common.wire.models import LeaseRequest, RedriveRequest, TaskSpec, UpdateRequest
from squall.master.service import Master, MasterSettings
from squall.master.storage.index import Totals
from tests.crashkit import kill9
from tests.test_admin import Api, ok
from tests.test_api import lease, put, update

QUEUES = ["a", "b", "c", "a.dead"]


def recount(m: Master) -> Totals:
    return Totals.of(m.index.queues.values())


async def check(c: Any, m: Master) -> None:
    want = recount(m)
    assert m.index.totals == want
    s = await ok(await c.get("/v1/cluster/stats"))
    assert (s["queues"], s["available"], s["leased"], s["delayed"], s["completed"]) == (
        want.holding, want.available, want.leased, want.delayed, want.completed)


async def admin_verb(c: Any, m: Master, rnd: random.Random, q: str) -> None:
    what = rnd.choice(["reset", "redrive", "cancel", "delete"])
    if what == "reset" and m.queue("g", q):
        await ok(await c.post(f"/v1/groups/g/queues/{q}/reset-leases"))
    elif what == "redrive" and m.queue("g", "a"):
        await ok(await c.post("/v1/groups/g/queues/a/redrive", json={"max_tasks": 5}))
    elif what == "cancel":
        page = await c.get(f"/v1/groups/g/queues/{q}/tasks?limit=1")
        if page.status_code == 200 and page.json()["tasks"]:
            pid = page.json()["tasks"][0]["pid"]
            r = await c.delete(f"/v1/groups/g/queues/{q}/tasks/{pid}")
            assert r.status_code in (200, 404, 409), r.text
    elif what == "delete" and rnd.random() < 0.3 and m.queue("g", q):
        await ok(await c.delete(f"/v1/groups/g/queues/{q}"))


async def test_totals_equal_a_recount_after_every_change(api: Api, clock: ManualClock) -> None:
    c, m = api
    rnd = random.Random(51)
    await ok(await c.put("/v1/groups/g/queues/a/policy", json={"max_attempts": 2}))
    held: list[tuple[str, dict[str, Any]]] = []
    n = 0
    for _ in range(250):
        q = rnd.choice(QUEUES[:3])
        step = rnd.randrange(10)
        if step < 3:
            n += 1
            await put(c, q, *({"pid": f"{n}-{i}", **({"delay_secs": 5} if i % 3 == 0 else {})}
                              for i in range(rnd.randint(1, 4))))
        elif step < 5:
            held += [(q, t) for t in await lease(c, q, rnd.randint(1, 3), secs=10)]
        elif step == 5 and held:
            q, t = held.pop(rnd.randrange(len(held)))
            r = await update(c, dequeue=[{"queue": q, "pid": t["pid"], "token": t["token"]}])
            assert r.status_code in (200, 404, 409), r.text  # its lease was taken back
        elif step == 6 and held:
            q, t = held.pop(rnd.randrange(len(held)))
            r = await update(c, release=[{"queue": q, "pid": t["pid"], "token": t["token"],
                                          "error": "ValueError: no", "delay_secs": 0}])
            assert r.status_code in (200, 404, 409), r.text
        elif step == 7:
            clock.advance(rnd.choice([1, 6, 11]))
            await m.tick()  # delays end, leases expire
        elif step == 8:
            await admin_verb(c, m, rnd, q)
        await check(c, m)
    t = m.index.totals
    assert t.queues == len(m.index.queues) and t.completed > 0 and t.holding > 0


async def test_totals_survive_restarts(tmp_path: Path) -> None:
    settings = MasterSettings(data_dir=str(tmp_path / "m"), require_receipts=False,
                              checkpoint_interval_s=3600)
    m = Master(settings)
    await m.enqueue("g", "x", [TaskSpec(pid=str(i)) for i in range(10)])
    await m.enqueue("h", "y", [TaskSpec(pid="1")])
    got = (await m.lease("g", "x", LeaseRequest(max_tasks=4, lease_secs=300), ""))["tasks"]
    await m.update("g", UpdateRequest.model_validate(
        {"dequeue": [{"queue": "x", "pid": t["pid"], "token": t["token"]} for t in got[:2]]}))
    before = m.index.totals
    assert (before.available, before.leased, before.completed, before.holding) == (7, 2, 2, 2)
    m.close()
    m = Master(settings)  # reopened: the totals are the records'
    assert m.index.totals == before == recount(m)
    index = tmp_path / "m" / "index"
    shutil.copytree(index, tmp_path / "disk")  # the index as a power loss will leave it
    await m.delete_queue("h", "y")
    await m.redrive("g", "x", RedriveRequest(max_tasks=1).max_tasks)
    after = m.index.totals
    assert after == recount(m) and after.holding == 1
    kill9(m)
    shutil.rmtree(index)
    shutil.copytree(tmp_path / "disk", index)  # the changes since are replayed from the WAL
    m = Master(settings)
    try:
        assert m.replayed >= 1 and m.index.totals == after == recount(m)
    finally:
        m.close()
