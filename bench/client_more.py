"""Workloads D (4 producers + 4 Workers), M (master only, batched) and C (4 MiB payloads;
C.rf1.put on a second cluster at replication factor 1) of the client benchmark
(``bench/client_bench.py`` runs them: ``--only D,M,C``)."""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.client_bench import TARGETS, CRow, Ctx, _drain, _one_by_one, row
from bench.dn_cluster import ClusterSpec, running_cluster
from bench.harness import self_cpu_s
from squall.client import Client, LeasedTask, Worker


# -- D: 4 producers + 4 workers ------------------------------------------------------------
def _noop(task: Any) -> None:  # the Worker's handler in D (sync, or async with the flag)
    return None


async def _anoop(task: Any) -> None:
    return None


def _producer(url: str, q: str, n: int, size: int, limit_s: float, go: Any, out: Any) -> None:
    data = os.urandom(size)
    with Client(url) as c:
        c.ready()
        out.put(("ready", None))
        go.wait()
        c0, t0, lats, errs, first = self_cpu_s(), time.monotonic(), [], 0, ""
        for _ in range(n):
            s = time.monotonic()
            try:
                c.put(q, data)
            except Exception as e:
                errs, first = errs + 1, first or repr(e)[:200]
            lats.append(time.monotonic() - s)
            if s - t0 > limit_s:
                break
        out.put(("producer", {"first": t0, "last": time.monotonic(), "n": len(lats) - errs,
                              "errors": errs, "error": first, "lats": lats,
                              "cpu": self_cpu_s() - c0}))


def _worker(url: str, q: str, conc: int, async_handler: bool, limit_s: float, go: Any,
            produced: Any, out: Any) -> None:
    """One ``Worker`` run as users run one: long-lived, long-polling the master while idle
    (not burst mode, which returns whenever the queue is momentarily empty). A watcher
    thread stops it once the producers are done and the queue holds nothing; ``last`` is
    when the watcher saw the queue empty (polled every 50 ms: at most that late).
    ``$BENCH_LEASE_VIA_NODE`` (0 or 1, when set) picks the lease path (the client's
    ``lease_via_node``; the small-task benchmark compares the two)."""
    via = os.environ.get("BENCH_LEASE_VIA_NODE")
    with Client(url, lease_via_node=None if via is None else via == "1") as c:
        c.ready()
        w = Worker(c, [q], _anoop if async_handler else _noop, concurrency=conc, grace_s=5.0,
                   wait_s=1.0)
        seen = {"last": 0.0}

        def watch() -> None:
            go.wait()
            t0 = time.monotonic()
            while time.monotonic() - t0 < limit_s:
                if produced.wait(0.05):
                    try:
                        empty = c.stats(q).total == 0
                    except Exception:
                        empty = False
                    if empty:
                        seen["last"] = time.monotonic()
                        break
            w.stop()

        watcher = threading.Thread(target=watch, name="bench-watcher", daemon=True)
        watcher.start()
        out.put(("ready", None))
        go.wait()
        c0 = self_cpu_s()
        st = w.run()
        watcher.join(10)
        out.put(("worker", {"done": st.done, "last": seen["last"] or time.monotonic(),
                            "runs": 1, "cpu": self_cpu_s() - c0}))


def workload_d(ctx: Ctx) -> list[CRow]:
    z, q = ctx.sizes, "cb#mixed"
    spawn = mp.get_context("spawn")
    go, produced, out = spawn.Event(), spawn.Event(), spawn.Queue()
    per = z.d_tasks // z.producers
    procs = [spawn.Process(target=_producer, args=(ctx.cluster.url, q, per, z.payload_bytes,
                                                   z.limit_s, go, out))
             for _ in range(z.producers)]
    wargs = (ctx.cluster.url, q, z.concurrency, ctx.async_handler, z.limit_s + 30, go,
             produced, out)
    procs += [spawn.Process(target=_worker, args=wargs) for _ in range(z.workers)]
    res: dict[str, list[dict[str, Any]]] = {"producer": [], "worker": []}
    try:
        for p in procs:
            p.start()
        for _ in procs:
            out.get(timeout=60)  # every process has its client and a warm connection
        s0 = ctx.server_cpu()
        go.set()
        while len(res["producer"]) < z.producers:
            kind, r = out.get(timeout=z.limit_s + 60)
            res[kind].append(r)
        produced.set()
        while len(res["worker"]) < z.workers:
            kind, r = out.get(timeout=z.limit_s + 60)
            res[kind].append(r)
        srv = ctx.server_cpu() - s0
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    pr, wr = res["producer"], res["worker"]
    el = max(r["last"] for r in wr) - (start := min(r["first"] for r in pr))
    put_n, acked = sum(r["n"] for r in pr), sum(r["done"] for r in wr)
    lats, cpu = [x for r in pr for x in r["lats"]], sum(r["cpu"] for r in pr + wr)
    p_el = max(r["last"] for r in pr) - start
    errs = sum(r["errors"] for r in pr) + int(acked != put_n)
    cpus = "/".join(f"{r['cpu']:.1f}" for r in pr) + " + " + "/".join(
        f"{r['cpu']:.1f}" for r in wr)
    note = (f"{put_n} put, {acked} acked; producers alone {put_n / p_el:,.0f}/s (put p50/p99 "
            f"above); client CPU s (producers + workers) {cpus}; long-lived Workers "
            "(long poll, stopped once the queue is empty); handler "
            f"{'async' if ctx.async_handler else 'sync'}, "
            f"concurrency {z.concurrency}" + "".join(f"; {r['error']}" for r in pr
                                                     if r["error"])[:400])
    return [row(ctx, "D.4p4w", f"{z.producers} producer procs (put 1 at a time) + "
                f"{z.workers} Worker procs (no-op, long-lived), first put → last ack", acked, el,
                lats, cpu, srv, errors=errs, trunc=put_n < z.d_tasks, note=note)]


# -- M: master only ---------------------------------------------------------------------------
def workload_m(ctx: Ctx) -> list[CRow]:
    z, q = ctx.sizes, "cb#meta"
    with Client(ctx.cluster.url) as c:
        c.put_many(q, [None] * z.batch, batch_size=z.batch)
        c.done(c.lease(q, z.batch, 600))
        lats: list[float] = []
        mark = [time.perf_counter()]

        def progress(res: list[Any]) -> None:
            now = time.perf_counter()
            lats.append(now - mark[0])
            mark[0] = now

        s0, c0 = ctx.server_cpu(), self_cpu_s()
        t0 = mark[0] = time.perf_counter()
        n = c.put_many(q, (None for _ in range(z.m_tasks)), batch_size=z.batch,
                       progress=progress)
        el = time.perf_counter() - t0
        rows = [row(ctx, "M.put", f"put_many {z.m_tasks:,} without payloads, batches of "
                    f"{z.batch} (one enqueue request each)", n, el, lats, self_cpu_s() - c0,
                    ctx.server_cpu() - s0, note="latency per batch")]
        got, lats, el, c0, s0, _ = _drain(ctx, c, q, n, payloads=False)
        rows.append(row(ctx, "M.lease_ack", f"lease({z.batch}, done=previous batch): one "
                        "update per batch", got, el, lats, self_cpu_s() - c0,
                        ctx.server_cpu() - s0, trunc=got < n, errors=int(got != n),
                        note="latency per batch"))
    return rows


# -- C: 4 MiB payloads ------------------------------------------------------------------------
def workload_c(ctx: Ctx) -> list[CRow]:
    z, q = ctx.sizes, "cb#large"
    data = os.urandom(z.c_bytes)
    mib = z.c_bytes / (1 << 20)
    rows: list[CRow] = []
    with Client(ctx.cluster.url) as c:
        c.put(q, data)
        c.lease(q, 1, 600)[0].done()
        s0, c0 = ctx.server_cpu(), self_cpu_s()
        lats, n, el, trunc = _one_by_one(ctx, z.c_tasks, lambda i: c.put(q, data))
        r = row(ctx, "C.put", f"put(queue, {mib:.0f} MiB), one at a time", n, el, lats,
                self_cpu_s() - c0, ctx.server_cpu() - s0, trunc=trunc)
        rows.append(_in_mb(r, mib))

        held: list[LeasedTask] = []  # acknowledged by the next lease, as B.drain and Workers do

        def lease_read(i: int) -> bool:
            got = c.lease(q, 1, 600, done=held)
            held[:] = got
            if not got or got[0].payload() != data:
                return False
            if i == z.c_tasks - 1:
                held.pop().done()
            return True

        def lease_read_done(i: int) -> bool:
            got = c.lease(q, 1, 600)
            if not got or got[0].payload() != data:
                return False
            got[0].done()
            return True

        s0, c0 = ctx.server_cpu(), self_cpu_s()
        lats, n, el, trunc = _one_by_one(ctx, z.c_tasks, lease_read)
        r = row(ctx, "C.lease_read", f"lease(1, done=previous) → payload() ({mib:.0f} MiB, "
                "checked): two requests per task", n, el, lats, self_cpu_s() - c0,
                ctx.server_cpu() - s0, trunc=trunc, errors=int(n != z.c_tasks))
        rows.append(_in_mb(r, mib))
        if held:  # cut short: acknowledge the last one
            held.pop().done()
        c.put_many(q, (data for _ in range(z.c_tasks)), batch_size=8)  # untimed
        s0, c0 = ctx.server_cpu(), self_cpu_s()
        lats, n, el, trunc = _one_by_one(ctx, z.c_tasks, lease_read_done)
        r = row(ctx, "C.lease_read_done", f"lease(1) → payload() ({mib:.0f} MiB, checked) → "
                "done(): three requests per task (no target)", n, el, lats,
                self_cpu_s() - c0, ctx.server_cpu() - s0, trunc=trunc,
                errors=int(n != z.c_tasks))
        rows.append(_in_mb(r, mib))
    rows.append(_c_put_rf1(ctx, data))
    return rows


def _c_put_rf1(ctx: Ctx, data: bytes) -> CRow:
    """C.put on a cluster of its own at replication factor 1 (3 data nodes, fsync on): the
    issue's RF 1 target; the RF 2 cluster stays up, idle."""
    mib = len(data) / (1 << 20)
    with tempfile.TemporaryDirectory(prefix="squall-clibench-rf1-") as tmp, \
            running_cluster(ClusterSpec(nodes=3, rf=1), Path(tmp)) as cl, \
            Client(cl.url) as c:
        one = replace(ctx, cluster=cl)
        c.put("cb#large1", data)  # warm-up: connections, paths
        s0, c0 = one.server_cpu(), self_cpu_s()
        lats, n, el, trunc = _one_by_one(one, ctx.sizes.c_tasks,
                                         lambda i: c.put("cb#large1", data))
        r = row(one, "C.rf1.put", f"put(queue, {mib:.0f} MiB), one at a time, RF 1", n, el,
                lats, self_cpu_s() - c0, one.server_cpu() - s0, trunc=trunc)
    return _in_mb(r, mib)


def _in_mb(r: CRow, mib: float) -> CRow:
    """A tasks/s row as MB/s (MiB-sized payloads, MB = 10^6 bytes as in the issue)."""
    r.value = round(r.value * mib * (1 << 20) / 1e6, 1)
    r.unit = "MB/s"
    r.judge(TARGETS)
    if r.target:
        r.ratio = round(r.value / r.target, 3)
    return r
