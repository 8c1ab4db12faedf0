"""Client load loops of the master benchmark: sequential enqueue and lease + dequeue on one
keep-alive ``httpx.Client``, and single-task enqueues from several client processes x
threads started together behind a barrier. Every loop is bounded in count and in time.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import threading
import time
from typing import Any

import httpx
import orjson

from bench.harness import AUTH, Run, proc_cpu_s

GROUP = "bench"
JSON_H = {"content-type": "application/json", **AUTH}  # AUTH: the admin credential


def tasks_path(queue: str) -> str:
    return f"/v1/groups/{GROUP}/queues/{queue}/tasks"


def enqueue_body(pids: list[str]) -> bytes:
    return orjson.dumps({"tasks": [{"pid": p} for p in pids]})


def seq_enqueue(c: httpx.Client, queue: str, n_tasks: int, batch: int, limit_s: float,
                tag: str = "") -> Run:
    """Enqueue `n_tasks` in requests of `batch`, one request at a time."""
    run, path = Run(), tasks_path(queue)
    t0 = time.perf_counter()
    end_by = t0 + limit_s
    for start in range(0, n_tasks, batch):
        pids = [f"{tag}{i:09d}" for i in range(start, min(start + batch, n_tasks))]
        body = enqueue_body(pids)
        s = time.perf_counter()
        r = c.post(path, content=body, headers=JSON_H)
        e = time.perf_counter()
        if r.status_code == 200:
            run.ok(len(pids), e - s)
            run.extra["last_pid"] = pids[-1]
        else:
            run.fail(f"{r.status_code} {r.text}")
        if e > end_by or run.errors > 100:
            run.truncated = True
            break
    run.elapsed = time.perf_counter() - t0
    return run


def seq_lease_ack(c: httpx.Client, queue: str, per: int, n_tasks: int, limit_s: float) -> Run:
    """Lease `per` tasks, then dequeue them in one update; until `n_tasks` are done."""
    run = Run(parts={"lease": [], "dequeue": []})
    lease_path = f"/v1/groups/{GROUP}/queues/{queue}/lease"
    upd_path = f"/v1/groups/{GROUP}/update"
    lease_body = orjson.dumps({"max_tasks": per, "lease_secs": 60})
    t0 = time.perf_counter()
    end_by = t0 + limit_s
    while run.items < n_tasks:
        s = time.perf_counter()
        r = c.post(lease_path, content=lease_body, headers=JSON_H)
        m = time.perf_counter()
        if r.status_code != 200:
            run.fail(f"lease: {r.status_code} {r.text}")
            break
        tasks = orjson.loads(r.content)["tasks"]
        if not tasks:
            break
        body = orjson.dumps({"dequeue": [{"queue": queue, "pid": t["pid"], "token": t["token"]}
                                         for t in tasks]})
        r2 = c.post(upd_path, content=body, headers=JSON_H)
        e = time.perf_counter()
        if r2.status_code != 200:
            run.fail(f"update: {r2.status_code} {r2.text}")
            break
        run.ok(len(tasks), e - s)
        run.parts["lease"].append(m - s)
        run.parts["dequeue"].append(e - m)
        if e > end_by:
            run.truncated = True
            break
    run.elapsed = time.perf_counter() - t0
    return run


def warm_up(c: httpx.Client, n: int, lease: bool = True) -> None:
    """Unmeasured requests on another queue: connection, code paths, allocator."""
    for i in range(n):
        c.post(tasks_path("warm"), content=enqueue_body([f"w{i:06d}"]), headers=JSON_H)
    if lease:
        seq_lease_ack(c, "warm", 1, min(n, 50), 30.0)


def _thread_loop(url: str, queue: str, tag: str, n: int, limit_s: float,
                 barrier: Any) -> dict[str, Any]:
    res: dict[str, Any] = {"t0": 0.0, "t1": 0.0, "lats": [], "errors": 0, "first_error": "",
                           "last_pid": "", "truncated": False}
    path = tasks_path(queue)
    with httpx.Client(base_url=url, timeout=60.0, headers=AUTH) as c:
        c.get("/readyz")  # connect before the start line
        barrier.wait(timeout=300)
        res["t0"] = time.perf_counter()
        end_by = res["t0"] + limit_s
        for i in range(n):
            pid = f"{tag}{i:07d}"
            s = time.perf_counter()
            r = c.post(path, content=enqueue_body([pid]), headers=JSON_H)
            e = time.perf_counter()
            if r.status_code == 200:
                res["lats"].append(e - s)
                res["last_pid"] = pid
            else:
                res["errors"] += 1
                res["first_error"] = res["first_error"] or f"{r.status_code} {r.text[:200]}"
            if e > end_by or res["errors"] > 100:
                res["truncated"] = True
                break
        res["t1"] = time.perf_counter()
    return res


def _client_process(url: str, queue: str, tag: str, n: int, threads: int, limit_s: float,
                    barrier: Any, out: Any) -> None:
    """One client process of the multi-client shape: `threads` threads, own connections."""
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def main(t: int) -> None:
        try:
            res = _thread_loop(url, queue, f"{tag}{t}-", n, limit_s, barrier)
        except Exception as e:  # reported to the parent, not lost
            res = {"t0": 0.0, "t1": 0.0, "lats": [], "errors": 1, "first_error": repr(e),
                   "last_pid": "", "truncated": True}
            with contextlib.suppress(Exception):
                barrier.abort()
        with lock:
            results.append(res)

    ths = [threading.Thread(target=main, args=(t,)) for t in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    out.put(results)


def _collect(out: Any, ps: list[Any], results: list[dict[str, Any]], deadline: float) -> None:
    """One result list per client process; stop early if they all died without one."""
    import queue

    got = 0
    while got < len(ps) and time.monotonic() < deadline:
        try:
            results.extend(out.get(timeout=1.0))
            got += 1
        except queue.Empty:
            if not any(p.is_alive() for p in ps) and out.empty():
                break
    if got < len(ps):
        raise RuntimeError(f"only {got} of {len(ps)} client processes reported")


def multi_enqueue(url: str, queue: str, tag: str, total: int, procs: int, threads: int,
                  limit_s: float, server_pid: int | None = None) -> Run:
    """`procs` processes x `threads` threads, one single-task enqueue per request each."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs * threads + 1)
    out = ctx.Queue()
    per = max(1, total // (procs * threads))
    ps = [ctx.Process(target=_client_process, daemon=True,
                      args=(url, queue, f"{tag}{p}-", per, threads, limit_s, barrier, out))
          for p in range(procs)]
    for p in ps:
        p.start()
    run = Run()
    results: list[dict[str, Any]] = []
    try:
        barrier.wait(timeout=300)
        s0 = proc_cpu_s(server_pid) if server_pid else 0.0
        _collect(out, ps, results, deadline=time.monotonic() + limit_s + 120)
        run.server_cpu_s = (proc_cpu_s(server_pid) - s0) if server_pid else 0.0
    finally:
        for p in ps:
            p.join(30)
            if p.is_alive():
                p.kill()
    for res in results:
        run.reqs += len(res["lats"])
        run.lats.extend(res["lats"])
        run.errors += res["errors"]
        run.first_error = run.first_error or res["first_error"]
        run.truncated = run.truncated or res["truncated"]
    run.items = run.reqs
    started = [r for r in results if r["t0"]]
    if started:
        run.elapsed = max(r["t1"] for r in started) - min(r["t0"] for r in started)
        run.extra["last_pid"] = next((r["last_pid"] for r in started if r["last_pid"]), "")
    return run
