"""Client loops of the admin benchmark (bench/admin_bench.py): filling many queues through
the group update, timed GETs, single-task enqueues until told to stop, and polling the
master's reap counter. Every loop is bounded in count and in time.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import httpx
import orjson

from bench.harness import AUTH, Run, metered, metric
from bench.master_load import JSON_H, enqueue_body, tasks_path

REAPED_HTML = re.compile(r"tasks reaped</td><td>(\d+)<")


def metered_run(pid: int, fn: Any, *args: Any) -> Run:
    m = Run()
    with metered(m, pid):
        run: Run = fn(*args)
    run.server_cpu_s, run.client_cpu_s = m.server_cpu_s, m.client_cpu_s
    return run


def qname(i: int) -> str:
    return f"q{i:06d}"


def gname(i: int, per_group: int) -> str:
    """Queue i is in group g<i // per_group> (two digits: up to 100 groups sort in order)."""
    return f"g{i // per_group:02d}"


def fill_queues(c: httpx.Client, queues: int, per_group: int, per_queue: int, batch: int,
                limit_s: float) -> Run:
    """`queues` queues of `per_queue` tasks, `batch` enqueues per update request."""
    per_req = batch // per_queue
    assert per_group % per_req == 0, "a request must stay inside one group"
    run = Run()
    t0 = time.perf_counter()
    for first in range(0, queues, per_req):
        items = [{"queue": qname(i), "pid": f"p{j:02d}"}
                 for i in range(first, min(first + per_req, queues)) for j in range(per_queue)]
        s = time.perf_counter()
        r = c.post(f"/v1/groups/{gname(first, per_group)}/update",
                   content=orjson.dumps({"enqueue": items}), headers=JSON_H)
        e = time.perf_counter()
        if r.status_code == 200:
            run.ok(len(items), e - s)
        else:
            run.fail(f"{r.status_code} {r.text}")
        if e > t0 + limit_s or run.errors > 10:
            run.truncated = True
            break
    run.elapsed = time.perf_counter() - t0
    return run


def timed_gets(c: httpx.Client, reqs: list[tuple[str, dict[str, Any]]], limit_s: float) -> Run:
    """GET each (path, params) in turn; `extra["first"]` is the first answer's JSON."""
    run = Run()
    t0 = time.perf_counter()
    for path, params in reqs:
        s = time.perf_counter()
        r = c.get(path, params=params)
        e = time.perf_counter()
        if r.status_code == 200:
            run.ok(1, e - s)
            run.extra.setdefault("first", orjson.loads(r.content))
        else:
            run.fail(f"{r.status_code} {r.text}")
        if e > t0 + limit_s or run.errors > 10:
            run.truncated = True
            break
    run.elapsed = time.perf_counter() - t0
    return run


def reaped_count(url: str) -> float:
    v = metric(url, "squall_tasks_reaped")
    if v < 0:  # a master without the metric: its status page shows the counter
        m = REAPED_HTML.search(httpx.get(url + "/", timeout=30.0, headers=AUTH).text)
        v = float(m.group(1)) if m else -1.0
    return v


def enqueue_until(c: httpx.Client, tag: str, n: int, limit_s: float,
                  stop: threading.Event | None = None) -> Run:
    """Single-task enqueues into queue `probe`, one at a time: `n`, or until `stop`."""
    run, path = Run(), tasks_path("probe")
    t0 = time.perf_counter()
    for i in range(n):
        if stop is not None and stop.is_set():
            break
        s = time.perf_counter()
        r = c.post(path, content=enqueue_body([f"{tag}{i:07d}"]), headers=JSON_H)
        e = time.perf_counter()
        if r.status_code == 200:
            run.ok(1, e - s)
        else:
            run.fail(f"{r.status_code} {r.text}")
        if e > t0 + limit_s or run.errors > 10:
            run.truncated = stop is None or not stop.is_set()
            break
    run.elapsed = time.perf_counter() - t0
    return run


def poll_reap(url: str, base: float, want: int, poll_s: float, limit_s: float,
              done: threading.Event, samples: list[tuple[float, float]]) -> None:
    """(time, tasks reaped since `base`) every `poll_s` until `want`; then set `done`."""
    try:
        end_by = time.perf_counter() + limit_s
        while time.perf_counter() < end_by:
            samples.append((time.perf_counter(), reaped_count(url) - base))
            if samples[-1][1] >= want:
                break
            time.sleep(poll_s)
    finally:
        done.set()
