"""Many clients at once: `procs` processes x `threads` threads, each with its own
:class:`~bench.dn_cluster.Payloads` (own keep-alive connections), one task per request.

Phase ``put``: every thread puts its share (allocate 1 → PUT → enqueue 1). Phase ``drain``:
every thread leases 1 → GETs it → dequeues it, until the queue is empty. The phases start
together behind barriers (with the parent), so a phase's wall time runs from the earliest
start to the latest finish. Every loop is bounded in count and in time.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Callable
from typing import Any

QUEUE = "d4x4"


def _phase(step: Callable[[int], bool], n: int, end_by: float, res: dict[str, Any]) -> None:
    """step(i) for i in range(n) (False: nothing left), each timed into `res`; stops past
    `end_by` (truncated) or after 50 errors."""
    for i in range(n):
        s = time.perf_counter()
        try:
            if not step(i):
                return
        except Exception as e:
            res["errors"] += 1
            res["first_error"] = res["first_error"] or repr(e)[:300]
            if res["errors"] > 50:
                return
            continue
        done = time.perf_counter()
        res["lats"].append(done - s)
        res["items"] += 1
        if done > end_by:
            res["truncated"] = True
            return


def _phase_put(cli: Any, tag: str, n: int, size: int, end_by: float, res: dict[str, Any]
               ) -> None:
    data = os.urandom(size)

    def put(i: int) -> bool:
        cli.put(f"{tag}{i:06d}", data)
        return True

    _phase(put, n, end_by, res)


def _phase_drain(cli: Any, n: int, end_by: float, res: dict[str, Any]) -> None:
    def take(i: int) -> bool:
        tasks = cli.lease(1)
        if not tasks:
            return False
        cli.get(tasks[0])
        cli.dequeue(tasks)
        return True

    _phase(take, n, end_by, res)


def _blank() -> dict[str, Any]:
    return {"t0": 0.0, "t1": 0.0, "lats": [], "items": 0, "errors": 0, "first_error": "",
            "truncated": False, "cpu": 0.0}


def _thread(url: str, tag: str, n: int, size: int, limit_s: float, barrier: Any
            ) -> dict[str, dict[str, Any]]:
    from bench.dn_cluster import Payloads

    out = {"put": _blank(), "drain": _blank()}
    cli = Payloads(url, QUEUE)
    try:
        cli.http.get(url + "/readyz")
        barrier.wait(timeout=600)
        r = out["put"]
        r["t0"], c0 = time.perf_counter(), time.thread_time()
        _phase_put(cli, tag, n, size, r["t0"] + limit_s, r)
        r["t1"], r["cpu"] = time.perf_counter(), time.thread_time() - c0
        barrier.wait(timeout=limit_s + 600)
        r = out["drain"]
        r["t0"], c0 = time.perf_counter(), time.thread_time()
        _phase_drain(cli, 2 * n + 10, r["t0"] + limit_s, r)
        r["t1"], r["cpu"] = time.perf_counter(), time.thread_time() - c0
        barrier.wait(timeout=limit_s + 600)
    finally:
        cli.close()
    return out


def _process(url: str, tag: str, n: int, size: int, threads: int, limit_s: float,
             barrier: Any, q: Any) -> None:
    results: list[dict[str, dict[str, Any]]] = []
    lock = threading.Lock()

    def main(t: int) -> None:
        try:
            res = _thread(url, f"{tag}{t}-", n, size, limit_s, barrier)
        except Exception as e:
            res = {"put": _blank(), "drain": _blank()}
            res["put"].update(errors=1, first_error=repr(e)[:300], truncated=True)
            with contextlib.suppress(Exception):
                barrier.abort()
        with lock:
            results.append(res)

    ths = [threading.Thread(target=main, args=(t,)) for t in range(threads)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    q.put(results)


def multi_phases(url: str, total: int, size: int, procs: int, threads: int,
                 limit_s: float) -> dict[str, dict[str, Any]]:
    """Run both phases; per phase: items, elapsed, lats, errors, first_error, truncated."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs * threads + 1)
    q = ctx.Queue()
    per = max(1, total // (procs * threads))
    ps = [ctx.Process(target=_process, daemon=True,
                      args=(url, f"p{p}-", per, size, threads, limit_s, barrier, q))
          for p in range(procs)]
    for p in ps:
        p.start()
    results: list[dict[str, dict[str, Any]]] = []
    try:
        for _ in range(3):  # start of put, start of drain, end of drain
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=2 * limit_s + 600)
        for _ in ps:
            results.extend(q.get(timeout=120))
    finally:
        for p in ps:
            p.join(30)
            if p.is_alive():
                p.kill()
    out: dict[str, dict[str, Any]] = {}
    for phase in ("put", "drain"):
        rs = [r[phase] for r in results]
        started = [r for r in rs if r["t0"] and r["t1"]]
        out[phase] = {
            "items": sum(r["items"] for r in rs),
            "elapsed": (max(r["t1"] for r in started) - min(r["t0"] for r in started))
            if started else 0.0,
            "lats": [x for r in rs for x in r["lats"]],
            "errors": sum(r["errors"] for r in rs) + (len(results) < procs * threads),
            "first_error": next((r["first_error"] for r in rs if r["first_error"]), ""),
            "truncated": any(r["truncated"] for r in rs),
            "client_cpu_s": round(sum(r["cpu"] for r in rs), 2)}
    return out
