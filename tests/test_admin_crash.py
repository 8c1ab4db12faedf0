"""Queue-management state across kill -9 of a real master process: exact counters, kept
policies and generations, and schedule slots that are never enqueued twice."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import ADMIN, MasterProcess, wait_for

G = "/v1/groups/g"


def ok(r: httpx.Response) -> Any:
    assert r.status_code == 200, r.text
    return r.json()


def test_admin_state_survives_kill9(tmp_path: Path) -> None:
    m = MasterProcess(str(tmp_path / "master")).start()
    try:
        with httpx.Client(base_url=m.url, timeout=10, headers=ADMIN) as c:
            ok(c.put(f"{G}/queues/work/policy", json={"max_attempts": 5, "lease_secs": 120}))
            ok(c.post(f"{G}/queues/old/tasks", json={"tasks": [{"pid": f"o{i}"}
                                                                for i in range(100)]}))
            ok(c.delete(f"{G}/queues/old"))
            ok(c.post(f"{G}/queues/old/tasks", json={"tasks": [{"pid": "o1"}]}))
            ok(c.post(f"{G}/queues/work/tasks", json={"tasks": [{"pid": f"w{i:02d}"}
                                                                 for i in range(30)]}))
            leased = ok(c.post(f"{G}/queues/work/lease", json={"max_tasks": 10}))["tasks"]
            ok(c.post(f"{G}/update", json={"dequeue": [
                {"queue": "work", "pid": t["pid"], "token": t["token"]} for t in leased[:4]]}))
            before = ok(c.get(f"{G}/queues/work"))
        m.kill9()
        m.start()
        with httpx.Client(base_url=m.url, timeout=10, headers=ADMIN) as c:
            after = ok(c.get(f"{G}/queues/work"))
            for k in ("available", "leased", "delayed", "completed", "enqueued_total"):
                assert after[k] == before[k], k
            assert ok(c.get(f"{G}/queues/work/policy"))["max_attempts"] == 5
            # held leases still held; the default lease length from the policy applies
            t = ok(c.post(f"{G}/queues/work/lease", json={"max_tasks": 100}))["tasks"]
            assert len(t) == 20 and t[0]["expires_at"] > leased[0]["expires_at"] - 1
            old = ok(c.get(f"{G}/queues/old"))
            assert (old["total"], old["enqueued_total"]) == (1, 1)
            assert c.get(f"{G}/queues/old/tasks/o2").status_code == 404
    finally:
        m.stop()


def test_schedule_slots_never_run_twice_across_kill9(tmp_path: Path) -> None:
    m = MasterProcess(str(tmp_path / "master")).start()
    acked: list[str] = []
    try:
        with httpx.Client(base_url=m.url, timeout=10, headers=ADMIN) as c:
            ok(c.put(f"{G}/schedules/beat", json={"queue": "beats", "interval_secs": 1,
                                                  "catch_up": "all"}))
        for _round in range(3):
            with httpx.Client(base_url=m.url, timeout=10, headers=ADMIN) as c:
                def consume(c: httpx.Client = c, want: int = 2 * (_round + 1)) -> bool:
                    ts = ok(c.post(f"{G}/queues/beats/lease", json={"max_tasks": 100}))["tasks"]
                    if ts:
                        ok(c.post(f"{G}/update", json={"dequeue": [
                            {"queue": "beats", "pid": t["pid"], "token": t["token"]}
                            for t in ts]}))
                        acked.extend(t["pid"] for t in ts)
                    return len(acked) >= want

                wait_for(consume, timeout=20, interval=0.2, what="schedule slots")
            m.kill9()
            m.start()
        with httpx.Client(base_url=m.url, timeout=10, headers=ADMIN) as c:
            def drained() -> bool:
                ts = ok(c.post(f"{G}/queues/beats/lease", json={"max_tasks": 100}))["tasks"]
                acked.extend(t["pid"] for t in ts)
                return bool(ts)

            wait_for(drained, timeout=20, interval=0.2, what="catch-up slots")
    finally:
        m.stop()
    assert len(acked) == len(set(acked)), "a schedule slot was enqueued twice"
    # catch_up=all: consecutive one-second slots, none missing across the kills
    secs = sorted(int(datetime.fromisoformat(p.split("@")[1].replace("Z", "+00:00")).timestamp())
                  for p in acked)
    assert secs == list(range(secs[0], secs[0] + len(secs)))
