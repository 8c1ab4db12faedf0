from __future__ import annotations

import httpx

from squall.master.service import Master


async def test_enqueue_lease_ack_in_pid_order(api: tuple[httpx.AsyncClient, Master]) -> None:
    c, _ = api
    r = await c.post("/v1/groups/g/queues/q/tasks", json={"tasks": [{"pid": "b"}, {"pid": "a"}]})
    assert r.status_code == 200, r.text
    r = await c.post("/v1/groups/g/queues/q/lease", json={"max_tasks": 5})
    assert [t["pid"] for t in r.json()["tasks"]] == ["a", "b"]
