"""The client benchmark: ``squall.client`` as users use it, against a real master (fsync on)
and 3 data nodes at replication factor 2, 1 KiB payloads.

Run ``python -m bench.client_bench [--quick] [--only B,D,A] [--async-handler]``.

- B  ``put_many`` 20,000 in batches of 100, then drain with ``lease(100)`` → ``done``.
- D  4 producer processes (``put`` one task at a time) + 4 ``Worker`` processes (no-op
     handler, burst mode) at once; first put to last ack.
- A  one client, one task at a time: ``put`` and ``lease(1)`` → ``payload()`` → ``done()``;
     the HTTP round trips of each are counted and timed (httpx event hooks).

Client CPU share = getrusage(RUSAGE_SELF) of the client process(es) / wall time (% of one
core; D sums its 8 processes). Every loop is bounded in count and time. Results:
``<out>/client.json`` + ``.md`` (``client-quick.*`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.dn_cluster import Cluster, ClusterSpec, running_cluster
from bench.harness import (
    DEFAULT_OUT,
    Row,
    exit_code,
    fdatasync_latency,
    load1,
    machine_info,
    ms,
    pct,
    print_table,
    proc_cpu_s,
    self_cpu_s,
    write_results,
)
from squall.client import Client, Worker

WORKLOADS = ("B", "D", "A")
TITLE = "squall client benchmark (master + 3 data nodes, RF 2, fsync on, 1 KiB payloads)"
TARGETS: dict[str, tuple[str, float]] = {
    "B.put": (">=", 32_000), "B.drain": (">=", 32_000), "D.4p4w": (">=", 2_800),
    "A.put": (">=", 500), "A.lease_get_done": (">=", 300)}
COLUMNS = [("id", "id"), ("what", "what"), ("value", "value"), ("unit", "unit"),
           ("target", "target"), ("ratio", "ratio"), ("passed", "met"), ("n", "n"),
           ("elapsed_s", "s"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"),
           ("client_cpu_pct", "client CPU%"), ("client_cpu_us_per_req", "cli us/task"),
           ("server_cpu_pct", "servers CPU%"), ("load1", "load"), ("fsync_ms", "fsync ms")]


@dataclass
class CRow(Row):
    ratio: float | None = None  # value / target


@dataclass(frozen=True)
class Sizes:
    b_tasks: int = 20_000
    batch: int = 100
    d_tasks: int = 20_000
    producers: int = 4
    workers: int = 4
    concurrency: int = 64
    a_tasks: int = 2_000
    payload_bytes: int = 1024
    limit_s: float = 120.0

    def quick(self) -> Sizes:
        return replace(self, b_tasks=2_000, d_tasks=2_000, a_tasks=200, limit_s=60.0)


@dataclass
class Ctx:
    sizes: Sizes
    cluster: Cluster
    async_handler: bool

    def server_cpu(self) -> float:
        return sum(proc_cpu_s(p) for p in self.cluster.pids().values())


def row(ctx: Ctx, rid: str, what: str, n: int, el: float, lats: list[float], cli_cpu: float,
        srv_cpu: float, *, trunc: bool = False, errors: int = 0, note: str = "") -> CRow:
    r = CRow(rid, rid.split(".")[0], what, round(n / el, 1) if el > 0 else 0.0, "tasks/s", n,
             round(el, 3), ms(pct(lats, 50)), ms(pct(lats, 99)), load1=load1(),
             errors=errors, truncated=trunc, note=note)
    if el > 0:
        r.client_cpu_pct = round(100 * cli_cpu / el, 1)
        r.server_cpu_pct = round(100 * srv_cpu / el, 1)
    r.client_cpu_us_per_req = round(1e6 * cli_cpu / max(1, n), 1)
    r.judge(TARGETS)
    if r.target:
        r.ratio = round(r.value / r.target, 3)
    return r


# -- B: batched -----------------------------------------------------------------------------
def workload_b(ctx: Ctx) -> list[CRow]:
    z, q = ctx.sizes, "cb#batch"
    data = os.urandom(z.payload_bytes)
    rows: list[CRow] = []
    with Client(ctx.cluster.url) as c:
        c.put_many(q, [data] * z.batch, batch_size=z.batch)  # warm-up: connections, paths
        c.done(c.lease(q, z.batch, 600))
        lats: list[float] = []
        t0 = time.perf_counter()
        mark = [t0]

        def progress(res: list[Any]) -> None:
            now = time.perf_counter()
            lats.append(now - mark[0])
            mark[0] = now
            if now - t0 > z.limit_s:
                raise TimeoutError("B.put over its time limit")

        s0, c0, trunc = ctx.server_cpu(), self_cpu_s(), False
        t0 = mark[0] = time.perf_counter()
        try:
            n = c.put_many(q, (data for _ in range(z.b_tasks)), batch_size=z.batch,
                           progress=progress)
        except TimeoutError:
            n, trunc = len(lats) * z.batch, True
        el = time.perf_counter() - t0
        rows.append(row(ctx, "B.put", f"put_many {z.b_tasks:,} x 1 KiB, batches of {z.batch} "
                        "(allocate → batch-put → enqueue per batch)", n, el, lats,
                        self_cpu_s() - c0, ctx.server_cpu() - s0, trunc=trunc,
                        note="latency per batch"))
        lats, got, s0, c0 = [], 0, ctx.server_cpu(), self_cpu_s()
        t0 = time.perf_counter()
        while got < n and time.perf_counter() - t0 < z.limit_s:
            s = time.perf_counter()
            tasks = c.lease(q, z.batch, 600)
            if not tasks:
                break
            c.done(tasks)
            got += len(tasks)
            lats.append(time.perf_counter() - s)
        el = time.perf_counter() - t0
        rows.append(row(ctx, "B.drain", f"lease({z.batch}) → done(tasks), one update per "
                        "batch; payloads not read", got, el, lats, self_cpu_s() - c0,
                        ctx.server_cpu() - s0, trunc=got < n, errors=int(got != n),
                        note=f"{got} of {n} drained; latency per batch (2 round trips); "
                        "the client has no batched payload read, so B reads none "
                        "(A measures payload())"))
    return rows


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
    with Client(url) as c:
        c.ready()
        out.put(("ready", None))
        go.wait()
        c0, t0 = self_cpu_s(), time.monotonic()
        done, last, runs = 0, t0, 0
        while time.monotonic() - t0 < limit_s:
            finished = produced.is_set()  # read before the run: a drain after it is final
            st = Worker(c, [q], _anoop if async_handler else _noop, concurrency=conc,
                        burst=True, grace_s=5.0).run()
            runs += 1
            if st.done:
                done, last = done + st.done, time.monotonic()
            if finished:
                break
            time.sleep(0.002)
        out.put(("worker", {"done": done, "last": last, "runs": runs,
                            "cpu": self_cpu_s() - c0}))


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
            f"above); client CPU s (producers + workers) {cpus}; worker runs "
            f"{[r['runs'] for r in wr]}; handler {'async' if ctx.async_handler else 'sync'}, "
            f"concurrency {z.concurrency}" + "".join(f"; {r['error']}" for r in pr
                                                     if r["error"])[:400])
    return [row(ctx, "D.4p4w", f"{z.producers} producer procs (put 1 at a time) + "
                f"{z.workers} Worker procs (no-op, burst), first put → last ack", acked, el,
                lats, cpu, srv, errors=errs, trunc=put_n < z.d_tasks, note=note)]


# -- A: one at a time -----------------------------------------------------------------------
def _kind(method: str, path: str) -> str:
    if path.endswith("/blobs/allocate"):
        return "allocate"
    if "/blobs/" in path:
        return f"{method} blob"
    return path.rsplit("/", 1)[-1].replace("tasks", "enqueue")


class Trips:
    """Round trips by kind (httpx event hooks): count and time to response headers."""

    def __init__(self, c: Client) -> None:
        self.t: dict[str, list[float]] = {}
        c._http.event_hooks = {"request": [self._req], "response": [self._resp]}

    def _req(self, request: Any) -> None:
        request.extensions["t0"] = time.perf_counter()

    def _resp(self, response: Any) -> None:
        rq = response.request
        k = _kind(rq.method, rq.url.path)
        self.t.setdefault(k, []).append(time.perf_counter() - rq.extensions["t0"])

    def text(self, n: int) -> str:
        out = "; ".join(f"{k} {len(v) / max(1, n):.2f}/task p50 {ms(pct(v, 50))} ms"
                        for k, v in self.t.items())
        self.t.clear()
        return out


def _one_by_one(ctx: Ctx, n: int, step: Any) -> tuple[list[float], int, float, bool]:
    lats: list[float] = []
    t0 = time.perf_counter()
    for i in range(n):
        s = time.perf_counter()
        if not step(i):
            break
        lats.append(time.perf_counter() - s)
        if s - t0 > ctx.sizes.limit_s:
            break
    return lats, len(lats), time.perf_counter() - t0, len(lats) < n


def workload_a(ctx: Ctx) -> list[CRow]:
    z, q = ctx.sizes, "cb#single"
    data = os.urandom(z.payload_bytes)
    rows: list[CRow] = []
    with Client(ctx.cluster.url) as c:
        for _ in range(5):  # warm-up
            c.put(q, data)
            c.lease(q, 1, 600)[0].done()
        trips = Trips(c)
        s0, c0 = ctx.server_cpu(), self_cpu_s()
        lats, n, el, trunc = _one_by_one(ctx, z.a_tasks, lambda i: c.put(q, data))
        rows.append(row(ctx, "A.put", "put(queue, 1 KiB), one at a time", n, el, lats,
                        self_cpu_s() - c0, ctx.server_cpu() - s0, trunc=trunc,
                        note="round trips: " + trips.text(n)))

        def lgd(i: int) -> bool:
            got = c.lease(q, 1, 600)
            if not got or len(got[0].payload()) != z.payload_bytes:
                return False
            got[0].done()
            return True

        s0, c0 = ctx.server_cpu(), self_cpu_s()
        lats, n, el, trunc = _one_by_one(ctx, z.a_tasks, lgd)
        rows.append(row(ctx, "A.lease_get_done", "lease(1) → payload() → done(), one at a "
                        "time", n, el, lats, self_cpu_s() - c0, ctx.server_cpu() - s0,
                        trunc=trunc, errors=int(n != z.a_tasks),
                        note="round trips: " + trips.text(n)))
    return rows


RUNNERS = {"B": workload_b, "D": workload_d, "A": workload_a}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.client_bench",
                                 description="squall client benchmark (real processes)")
    ap.add_argument("--quick", action="store_true", help="10x smaller counts (smoke run)")
    ap.add_argument("--only", default=",".join(WORKLOADS), help="workloads among B,D,A")
    ap.add_argument("--async-handler", action="store_true", help="D: async no-op handler")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    a.only = [w.strip().upper() for w in a.only.split(",") if w.strip()]
    if bad := [w for w in a.only if w not in WORKLOADS]:
        ap.error(f"unknown workload(s) {bad}")
    return a


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}  (load {load1()})", file=sys.stderr)


def _rows(ctx: Ctx, only: list[str]) -> Iterator[dict[str, Any]]:
    for w in WORKLOADS:
        if w not in only:
            continue
        fsync = fdatasync_latency(50)["p50"]
        say(f"workload {w}")
        try:
            rows = RUNNERS[w](ctx)
        except Exception as e:  # a failed workload is a row, not a lost run
            say(f"{w} failed: {e!r}")
            rows = [CRow(f"{w}.failed", w, "the workload failed", 0.0, "", errors=1,
                         note=repr(e)[:500])]
        for r in rows:
            r.fsync_ms = fsync
            yield asdict(r)


def run(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    sizes = Sizes().quick() if a.quick else Sizes()
    stem = "client-quick" if a.quick else "client"
    tmp = Path(tempfile.mkdtemp(prefix="squall-clibench-"))
    doc: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                           "mode": "quick" if a.quick else "full", "machine": machine_info(),
                           "sizes": asdict(sizes), "targets": TARGETS, "rows": []}
    say(f"data and logs in {tmp}")
    try:
        with running_cluster(ClusterSpec(nodes=3, rf=2), tmp) as cl:
            doc["rows"] = list(_rows(Ctx(sizes, cl, a.async_handler), a.only))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    doc["machine"]["load_at_end"] = list(os.getloadavg())
    print_table(doc["rows"], TITLE, COLUMNS)
    write_results(a.out, stem, doc, merge=set(a.only) != set(WORKLOADS), title=TITLE,
                  targets=TARGETS, order=WORKLOADS, columns=COLUMNS)
    say(f"results in {a.out / stem}.json and .md")
    return doc


def main(argv: list[str] | None = None) -> int:
    return exit_code(run(argv), argv)


if __name__ == "__main__":
    sys.exit(main())
