"""The client benchmark: ``squall.client`` as users use it, against a real master (fsync on)
and 3 data nodes at replication factor 2, 1 KiB payloads.

Run ``python -m bench.client_bench [--quick] [--only B,D,A,M,C] [--async-handler]``.

- B  ``put_many`` 20,000 in batches of 100, then drain with ``Client.batches(100)`` (two
     leases ahead, each acking a batch before and reading its payloads: one lease+ack
     update and one batch read per data node per batch); then the same count
     drained by a serial ``lease(100, payloads=True, done=<the previous batch>)`` loop
     (B.drain.serial, no target).
- D  4 producer processes (``put`` one task at a time) + 4 ``Worker`` processes (no-op
     handler, long-lived: long polling while idle, stopped once the queue is empty) at
     once; first put to last ack.
- A  one client, one task at a time: ``put`` and ``lease(1)`` → ``payload()`` → ``done()``;
     the HTTP round trips of each are counted and timed (httpx event hooks). A.worker1
     (no target): the same through a ``Worker(concurrency=1)``, its requests to the master
     counted from the master's metrics.
- M  master only (no payloads), batches of 100: ``put_many`` and ``lease(100, done=prev)``.
- C  4 MiB payloads: ``put`` one at a time, then ``lease(1)`` → ``payload()`` → ``done()``;
     C.rf1.put: the same puts on a second cluster at replication factor 1.

Client CPU share = getrusage(RUSAGE_SELF) of the client process(es) / wall time (% of one
core; D sums its 8 processes). Every loop is bounded in count and time. Results:
``<out>/client.json`` + ``.md`` (``client-quick.*`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import tempfile
import threading
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
    metrics_text,
    ms,
    only_workloads,
    pct,
    print_table,
    proc_cpu_s,
    results_doc,
    self_cpu_s,
    timed_loop,
    write_results,
)
from squall.client import Client, LeasedTask, Worker

WORKLOADS = ("B", "D", "A", "M", "C")
TITLE = "squall client benchmark (master + 3 data nodes, RF 2, fsync on, 1 KiB payloads)"
TARGETS: dict[str, tuple[str, float]] = {  # the client's throughput targets
    "B.put": (">=", 25_000), "B.drain": (">=", 25_000), "D.4p4w": (">=", 1_000),
    "A.put": (">=", 700), "A.lease_get_done": (">=", 500), "M.put": (">=", 43_000),
    "M.lease_ack": (">=", 42_000), "C.put": (">=", 200), "C.rf1.put": (">=", 276),
    "C.lease_read": (">=", 1_000)}
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
    m_tasks: int = 50_000
    c_tasks: int = 100
    c_bytes: int = 4 << 20
    payload_bytes: int = 1024
    limit_s: float = 120.0

    def quick(self) -> Sizes:
        return replace(self, b_tasks=2_000, d_tasks=2_000, a_tasks=200, m_tasks=5_000,
                       c_tasks=10, limit_s=60.0)


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
                        "(front door: one request to a data node per batch)", n, el, lats,
                        self_cpu_s() - c0, ctx.server_cpu() - s0, trunc=trunc,
                        note="latency per batch"))
        got, lats, el, c0, s0, bad = _drain_batches(ctx, c, q, n)
        rows.append(row(ctx, "B.drain", f"batches({z.batch}): {AHEAD} leases ahead, each "
                        "acking a batch before and reading its payloads (one batch read "
                        "per data node)", got, el, lats, self_cpu_s() - c0,
                        ctx.server_cpu() - s0, trunc=got < n, errors=int(got != n) + bad,
                        note=f"{got} of {n} drained, every payload read and checked "
                        f"({bad} wrong); latency per batch (its wait only)"))
        n = c.put_many(q, (data for _ in range(z.b_tasks)), batch_size=z.batch)
        got, lats, el, c0, s0, bad = _drain(ctx, c, q, n, payloads=True)
        rows.append(row(ctx, "B.drain.serial", f"lease({z.batch}, payloads=True, "
                        "done=previous batch) in a loop: ack + lease in one update, one "
                        "batch read per data node", got, el, lats, self_cpu_s() - c0,
                        ctx.server_cpu() - s0, trunc=got < n, errors=int(got != n) + bad,
                        note=f"{got} of {n} drained, every payload read and checked "
                        f"({bad} wrong); latency per batch; no target (B.drain's loop "
                        "without read-ahead)"))
    return rows


AHEAD = 2  # Client.batches' default


def _drain_batches(ctx: Ctx, c: Client, q: str, n: int
                   ) -> tuple[int, list[float], float, float, float, int]:
    """Drain with ``Client.batches``; as ``_drain``."""
    z = ctx.sizes
    lats: list[float] = []
    got, bad = 0, 0
    s0, c0 = ctx.server_cpu(), self_cpu_s()
    t0 = time.perf_counter()
    with c.batches(q, z.batch, 600, ahead=AHEAD) as batches:
        while got < n and time.perf_counter() - t0 < z.limit_s:
            s = time.perf_counter()
            tasks: list[LeasedTask] = next(batches, [])
            if not tasks:
                break
            bad += sum(len(t.payload()) != z.payload_bytes for t in tasks)
            got += len(tasks)
            lats.append(time.perf_counter() - s)
    return got, lats, time.perf_counter() - t0, c0, s0, bad


def _drain(ctx: Ctx, c: Client, q: str, n: int, payloads: bool
           ) -> tuple[int, list[float], float, float, float, int]:
    """Lease batches, acking the previous one in the same update; (drained, latencies,
    elapsed, client CPU at start, server CPU at start, payloads of the wrong size)."""
    z = ctx.sizes
    lats: list[float] = []
    got, bad = 0, 0
    prev: list[LeasedTask] = []
    s0, c0 = ctx.server_cpu(), self_cpu_s()
    t0 = time.perf_counter()
    while got < n and time.perf_counter() - t0 < z.limit_s:
        s = time.perf_counter()
        tasks = c.lease(q, z.batch, 600, payloads=payloads, done=prev)
        if payloads:
            bad += sum(len(t.payload()) != z.payload_bytes for t in tasks)
        prev = tasks
        if not tasks:
            break
        got += len(tasks)
        lats.append(time.perf_counter() - s)
    if prev:
        c.done(prev)
    return got, lats, time.perf_counter() - t0, c0, s0, bad


# -- A: one at a time -----------------------------------------------------------------------
def _kind(method: str, path: str) -> str:
    if path.endswith("/blobs/allocate"):
        return "allocate"
    if "/blobs/" in path:
        return f"{method} blob"
    return path.rsplit("/", 1)[-1].replace("tasks", "enqueue")


class Trips:
    """Round trips by kind: count and time to the answer. It wraps the client driver's
    calls (not httpx's event hooks: a client with hooks sends every request through httpx,
    off the direct path users get)."""

    def __init__(self, c: Client) -> None:
        self.t: dict[str, list[float]] = {}
        drv = c._driver
        real = drv._call

        def timed(call: Any, streams: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return real(call, streams)
            finally:
                path = call.url.split("?", 1)[0]
                self.t.setdefault(_kind(call.method, path), []).append(
                    time.perf_counter() - t0)

        drv._call = timed  # type: ignore[method-assign, assignment]

    def text(self, n: int) -> str:
        out = "; ".join(f"{k} {len(v) / max(1, n):.2f}/task p50 {ms(pct(v, 50))} ms"
                        for k, v in self.t.items())
        self.t.clear()
        return out


def _one_by_one(ctx: Ctx, n: int, step: Any) -> tuple[list[float], int, float, bool]:
    """step(i) up to `n` times (falsy: stop) within the time limit: (latencies, calls,
    seconds, stopped short)."""
    lats, calls, el, _ = timed_loop(ctx.sizes.limit_s, n, lambda i: 1 if step(i) else 0)
    return lats, calls, el, calls < n


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
        rows.append(_worker_one(ctx, c))
    return rows


def _worker_one(ctx: Ctx, c: Client) -> CRow:
    """A.worker1 (no target of its own): the same one-at-a-time consumption through a
    ``Worker(concurrency=1)``, whose acks ride on the lease that fills the slot."""
    z, q = ctx.sizes, "cb#worker1"
    c.put_many(q, [os.urandom(z.payload_bytes)] * z.a_tasks)
    sizes: list[int] = []

    def handler(task: Any) -> None:
        sizes.append(len(task.payload()))

    w = Worker(c, q, handler, concurrency=1, burst=True)
    limit = threading.Timer(z.limit_s, w.stop)  # bounded in time as the other loops are
    before = _master_requests(ctx.cluster.url)
    s0, c0, t0 = ctx.server_cpu(), self_cpu_s(), time.perf_counter()
    limit.start()
    try:
        stats = w.run()
    finally:
        limit.cancel()
    el = time.perf_counter() - t0
    after = _master_requests(ctx.cluster.url)
    per = "; ".join(f"{k} {(after[k] - before.get(k, 0)) / max(1, stats.done):.2f}/task"
                    for k in sorted(after))
    return row(ctx, "A.worker1", "Worker(concurrency=1, no-op handler reading its payload), "
               "one task at a time", stats.done, el, [], self_cpu_s() - c0,
               ctx.server_cpu() - s0, trunc=stats.done < z.a_tasks,
               errors=int(sizes != [z.payload_bytes] * len(sizes) or stats.failed > 0),
               note="requests to the master: " + per)


def _master_requests(url: str) -> dict[str, float]:
    """POSTs the master served so far, by route (its request-duration histogram counts),
    for the lease and update routes."""
    text = metrics_text(url)
    out: dict[str, float] = {}
    for m in re.finditer(r'^squall_master_http_request_duration_seconds_count\{method="POST",'
                         r'route="[^"]*/(lease|update)"\} ([\d.e+]+)$', text, re.M):
        out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def _more(name: str) -> Any:
    def run(ctx: Ctx) -> list[CRow]:
        from bench import client_more  # it builds on this module's helpers

        return getattr(client_more, name)(ctx)  # type: ignore[no-any-return]
    return run


RUNNERS = {"B": workload_b, "D": _more("workload_d"), "A": workload_a, "M": _more("workload_m"),
           "C": _more("workload_c")}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.client_bench",
                                 description="squall client benchmark (real processes)")
    ap.add_argument("--quick", action="store_true", help="10x smaller counts (smoke run)")
    ap.add_argument("--only", default=",".join(WORKLOADS), help="workloads among B,D,A,M,C")
    ap.add_argument("--async-handler", action="store_true", help="D: async no-op handler")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--masters", type=int, default=1, choices=(1, 3, 5),
                    help="3 or 5: the cluster's master is a master set (results in "
                    "client-set*.json/.md)")
    a = ap.parse_args(argv)
    a.only = only_workloads(ap, a.only, WORKLOADS)
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
    stem = ("client-quick" if a.quick else "client").replace(
        "client", "client-set" if a.masters > 1 else "client")
    tmp = Path(tempfile.mkdtemp(prefix="squall-clibench-"))
    doc = results_doc(a.quick, sizes, TARGETS, rows=[])
    say(f"data and logs in {tmp}")
    try:
        with running_cluster(ClusterSpec(nodes=3, rf=2, masters=a.masters), tmp) as cl:
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
