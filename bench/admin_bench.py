"""The admin benchmark: list queues, queue statistics, delete and reap.

Run ``python -m bench.admin_bench [--quick] [--only L,D] [--reap-batch 500,1000]``
(``make bench``). Real masters on 127.0.0.1, fsync on, a fresh data dir each:

- L     100,000 queues of 10 tasks over 100 groups (filled with ``POST
        /v1/groups/{g}/update``, 1,000 enqueues of 100 queues per request); then ``GET
        /v1/queues`` with a regex matching one queue (the whole index is scanned) and with
        one matching a fifth of them (``limit=1000``: ~5,000 scanned, 1,000 returned), and
        one queue's statistics ``GET /v1/groups/{g}/queues/{q}`` of random queues.
- D     one queue of 1,000,000 tasks (batches of 1,000); the master is stopped cleanly and
        its data dir kept. Three rounds, each on a fresh copy: single-task enqueues into
        another queue (idle), the timed ``DELETE`` of the big queue, single-task enqueues
        while the background reap runs (its rate from the ``squall_tasks_reaped`` metric,
        polled), idle enqueues again after it.
- R<N>  (``--reap-batch N,...``) D with ``MasterSettings.reap_batch = N`` (no CLI flag: a
        launcher calls the CLI's own ``serve`` with that setting); the rounds of all variants
        are interleaved, so that load changes on a shared machine hit them alike.

Every loop is bounded in count and in time. Results: a table on stdout and
``<out>/admin.json`` + ``.md`` (``admin-quick.*`` for ``--quick``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from bench.admin_load import (
    enqueue_until,
    fill_queues,
    gname,
    metered_run,
    poll_reap,
    qname,
    reaped_count,
    timed_gets,
)
from bench.harness import (
    AUTH,
    DEFAULT_OUT,
    Row,
    Run,
    Server,
    Targets,
    exit_code,
    fdatasync_latency,
    get_json,
    load1,
    master_server,
    metric,
    ms,
    pct,
    print_table,
    raise_priority,
    rate_row,
    results_doc,
    running,
    write_results,
)
from bench.master_load import GROUP, seq_enqueue

TITLE = "squall admin benchmark"
WORKLOADS = ("L", "D", "R")
TARGETS: Targets = {
    "L.list_rare": ("<=", 200.0),  # ms, p99
    "L.list_common": ("<=", 200.0),  # ms, p99
    "L.stats": ("<=", 5.0),  # ms, p99
    "D.delete": ("<=", 50.0),  # ms, the request
    "D.reap": (">=", 200_000),  # tasks/s
    "D.enq_reap": ("<=", 2.0),  # enqueue p99 during the reap / idle p99
}
COLUMNS = [("id", "id"), ("what", "what"), ("value", "value"), ("unit", "unit"),
           ("target", "target"), ("passed", "met"), ("vs_target", "x target"),
           ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"), ("n", "n"),
           ("server_cpu_pct", "srv CPU%"), ("load1", "load"), ("fsync_ms", "fsync ms")]
# a master with a non-default reap_batch, served exactly as `squall master` serves
LAUNCH = ("import sys; from squall.master.cli import serve; "
          "from squall.master.service import MasterSettings; "
          "serve(MasterSettings(data_dir=sys.argv[1], fsync=True, "
          "reap_batch=int(sys.argv[3])), '127.0.0.1', int(sys.argv[2]))")


@dataclass(frozen=True)
class Sizes:
    groups: int = 100
    queues: int = 100_000
    per_queue: int = 10
    batch: int = 1_000  # the API's maximum
    list_reqs: int = 100  # per regex
    stats_reqs: int = 2_000
    big: int = 1_000_000
    enq_reqs: int = 2_000  # single-task enqueues idle, before and after the reap
    enq_max: int = 100_000  # bound on the enqueues during the reap
    warmup: int = 100
    rounds: int = 3  # D (and each R<N>) is measured this many times, on fresh copies
    poll_s: float = 0.05  # reap progress polling period
    fill_limit_s: float = 900.0
    loop_limit_s: float = 120.0
    serve_timeout_s: float = 120.0

    def quick(self) -> Sizes:
        return replace(self, queues=10_000, big=100_000, list_reqs=50, stats_reqs=1_000,
                       enq_reqs=500, fill_limit_s=300.0, rounds=1)


@dataclass
class Ctx:
    sizes: Sizes
    tmp: Path
    logs: Path
    say: Any

    def fresh_dir(self, name: str) -> Path:
        d = self.tmp / name
        shutil.rmtree(d, ignore_errors=True)
        return d


def lat_row(rid: str, what: str, run: Run, targets: Targets, note: str = "") -> Row:
    """A latency figure: the value is the p99 in ms (p50 in its column)."""
    row = rate_row(rid, what, run, "ms p99", targets, per_item=False, note=note)
    row.value = row.p99_ms or 0.0
    return row.judge(targets)


# -- L: list and stats over 100,000 queues ---------------------------------------------------
def workload_l(ctx: Ctx) -> list[Row]:
    z = ctx.sizes
    rng = random.Random(3)
    per_group = z.queues // z.groups
    ctx.say(f"L: filling {z.queues} queues x {z.per_queue} tasks over {z.groups} groups")
    with running(master_server(ctx.fresh_dir("l"), ctx.logs, "master-l"), z.serve_timeout_s
                 ) as srv, httpx.Client(base_url=srv.url, timeout=120.0, headers=AUTH) as c:
        fill = metered_run(srv.pid, fill_queues, c, z.queues, per_group, z.per_queue, z.batch,
                           z.fill_limit_s)
        tot = get_json(srv.url, "/v1/cluster/stats")
        ctx.say(f"L: {tot['queues']} queues, {tot['available']} tasks; timing list and stats")
        rare = [("/v1/queues", {"regex": f"#{qname(rng.randrange(z.queues))}$"})
                for _ in range(z.list_reqs)]
        common = [("/v1/queues", {"regex": "[05]$", "limit": 1000})] * z.list_reqs
        stats: list[tuple[str, dict[str, Any]]] = [
            (f"/v1/groups/{gname(i, per_group)}/queues/{qname(i)}", {})
            for i in (rng.randrange(z.queues) for _ in range(z.stats_reqs))]
        timed_gets(c, rare[:5] + common[:5] + stats[:z.warmup], z.loop_limit_s)  # warm-up
        r_rare = metered_run(srv.pid, timed_gets, c, rare, z.loop_limit_s)
        r_common = metered_run(srv.pid, timed_gets, c, common, z.loop_limit_s)
        r_stats = metered_run(srv.pid, timed_gets, c, stats, z.loop_limit_s)
        r_cluster = metered_run(srv.pid, timed_gets, c, [("/v1/cluster/stats", {})] * 50,
                                z.loop_limit_s)
    want = z.queues * z.per_queue
    fill_row = rate_row("L.fill", f"{z.queues:,} queues x {z.per_queue} tasks, update of "
                        f"{z.batch} enqueues", fill, "tasks/s", TARGETS,
                        note=f"cluster stats after the fill: {tot['queues']} queues, "
                        f"{tot['available']} tasks available (expected {want})")
    if tot["available"] != want or tot["queues"] != z.queues:
        fill_row.errors += 1
    n_rare = len(r_rare.extra.get("first", {}).get("queues", ()))
    n_common = len(r_common.extra.get("first", {}).get("queues", ()))
    return [
        fill_row,
        lat_row("L.list_rare", f"GET /v1/queues?regex=#q<one>$: scans {z.queues:,} queues",
                r_rare, TARGETS, note=f"{n_rare} queue(s) returned by the first request"),
        lat_row("L.list_common", "GET /v1/queues?regex=[05]$&limit=1000 (1 in 5 match)",
                r_common, TARGETS, note=f"{n_common} queues returned per request"),
        lat_row("L.stats", "GET /v1/groups/{g}/queues/{q}, random queues", r_stats, TARGETS),
        lat_row("L.cluster", f"GET /v1/cluster/stats over {z.queues:,} queues (info)",
                r_cluster, TARGETS),
    ]


# -- D: delete a 1,000,000-task queue, reap in the background ------------------------------
def d_snapshot(ctx: Ctx) -> tuple[Path, Row]:
    """Fill one queue with `big` tasks, stop the master cleanly; its data dir, kept."""
    z = ctx.sizes
    ctx.say(f"D: filling one queue with {z.big} tasks in batches of {z.batch}")
    data = ctx.fresh_dir("d-snapshot")
    srv = master_server(data, ctx.logs, "master-d-fill").start()
    try:
        srv.wait_serving(timeout=z.serve_timeout_s)
        with httpx.Client(base_url=srv.url, timeout=120.0, headers=AUTH) as c:
            fill = metered_run(srv.pid, seq_enqueue, c, "big", z.big, z.batch, z.fill_limit_s)
    finally:
        rc = srv.terminate()
    if rc not in (0, -signal.SIGTERM):
        raise RuntimeError(f"master did not stop cleanly (exit {rc}); see {srv.log_path}")
    return data, rate_row("D.fill", f"one queue, {z.big:,} tasks in batches of {z.batch}",
                          fill, "puts/s", TARGETS)


def d_round(ctx: Ctx, snapshot: Path, prefix: str, reap_batch: int | None) -> dict[str, Any]:
    """On a fresh copy of the snapshot: idle enqueues, DELETE, enqueues during the reap,
    idle enqueues after it. Returns what was measured."""
    z = ctx.sizes
    data = ctx.fresh_dir(prefix.lower())
    shutil.copytree(snapshot, data)
    name = f"master-{prefix.lower()}"
    srv = (master_server(data, ctx.logs, name) if reap_batch is None else
           Server(name, [sys.executable, "-c", LAUNCH, str(data), "{port}", str(reap_batch)],
                  ctx.logs / f"{name}.log"))
    samples: list[tuple[float, float]] = []
    done = threading.Event()
    with running(srv, z.serve_timeout_s), \
            httpx.Client(base_url=srv.url, timeout=60.0, headers=AUTH) as c:
        enqueue_until(c, "w", z.warmup, z.loop_limit_s)
        idle = metered_run(srv.pid, enqueue_until, c, "i", z.enq_reqs, z.loop_limit_s)
        base = reaped_count(srv.url)
        s = time.perf_counter()
        r = c.delete(f"/v1/groups/{GROUP}/queues/big")
        t_del = time.perf_counter()
        deleted = int(r.json().get("deleted", 0)) if r.status_code == 200 else 0
        poller = threading.Thread(target=poll_reap, daemon=True, args=(
            srv.url, base, deleted, z.poll_s, z.loop_limit_s, done, samples))
        poller.start()
        during = metered_run(srv.pid, enqueue_until, c, "r", z.enq_max, z.loop_limit_s, done)
        poller.join(z.loop_limit_s + 30)
        after = metered_run(srv.pid, enqueue_until, c, "a", z.enq_reqs, z.loop_limit_s)
        checkpoints = metric(srv.url, "squall_checkpoints")
    shutil.rmtree(data, ignore_errors=True)
    t_end, reaped = samples[-1] if samples else (t_del, 0.0)
    first = next(((t, v) for t, v in samples if v > 0), None)
    return {"delete_s": t_del - s, "status": r.status_code, "deleted": deleted,
            "reaped": reaped, "reap_s": t_end - t_del,
            "lag_ms": ms(first[0] - t_del) if first else None,
            "steady": (reaped - first[1]) / (t_end - first[0]) if first and t_end > first[0]
            else 0.0, "idle": idle, "during": during, "after": after,
            "checkpoints": checkpoints}


def d_rows(prefix: str, batch: int, rounds: list[dict[str, Any]], big: int) -> list[Row]:
    """Rows of one variant over its rounds: DELETE latency (worst), reap rate (median),
    enqueue latencies pooled over the rounds."""
    targets = {prefix + k[1:]: v for k, v in TARGETS.items() if k.startswith("D.")}
    k = len(rounds)
    dels = [x["delete_s"] for x in rounds]
    rates = [x["reaped"] / x["reap_s"] if x["reap_s"] > 0 else 0.0 for x in rounds]
    idle, during = Run(), Run()
    for x in rounds:
        for part in (x["idle"], x["after"]):
            idle.reqs += part.reqs
            idle.lats += part.lats
            idle.elapsed += part.elapsed
            idle.server_cpu_s += part.server_cpu_s
        during.reqs += x["during"].reqs
        during.lats += x["during"].lats
        during.elapsed += x["during"].elapsed
        during.server_cpu_s += x["during"].server_cpu_s
        during.errors += x["idle"].errors + x["during"].errors + x["after"].errors
    idle.items, during.items = idle.reqs, during.reqs
    i99, d99 = pct(idle.lats, 99), pct(during.lats, 99)
    p50x = round((pct(during.lats, 50) or 0) / (pct(idle.lats, 50) or 1), 2)
    rates_s = ", ".join(f"{v:,.0f}" for v in rates)
    steady_s = ", ".join(f"{x['steady']:,.0f}" for x in rounds)
    common = (f"reap_batch {batch}, {k} round(s), a fresh copy of the filled master each; "
              f"checkpoints {[x['checkpoints'] for x in rounds]}")
    delete = Row(f"{prefix}.delete", prefix, f"DELETE of a {big:,}-task queue (median of {k})",
                 ms(pct(dels, 50)) or 0.0, "ms", n=k, p50_ms=ms(pct(dels, 50)),
                 p99_ms=ms(max(dels)), load1=load1(),
                 errors=sum(x["status"] != 200 or x["deleted"] != big for x in rounds),
                 note=f"one DELETE per round: {[ms(d) for d in dels]} ms (p99 column: the "
                 "worst); answers " + ", ".join(f"{x['status']} deleted {x['deleted']}"
                                              for x in rounds)).judge(targets)
    reap = Row(f"{prefix}.reap", prefix, f"background reap of the deleted queue (median of "
               f"{k})", round(sorted(rates)[k // 2], 1), "tasks/s", n=int(rounds[0]["reaped"]),
               elapsed_s=round(rounds[0]["reap_s"], 3), load1=load1(),
               truncated=any(x["reaped"] < x["deleted"] for x in rounds),
               note=f"{common}; rate from the DELETE answer to the last task reaped (counter "
               f"polled every 50 ms): {rates_s} tasks/s; first reaped seen after "
               f"{[x['lag_ms'] for x in rounds]} ms; from then on {steady_s} tasks/s"
               ).judge(targets)
    idle_row = lat_row(f"{prefix}.enq_idle", "1-task enqueue, idle (before + after the reap)",
                       idle, targets)
    enq = lat_row(f"{prefix}.enq_reap", "1-task enqueue during the reap: p99 / idle p99",
                  during, targets,
                  note=f"{common}; p99 {ms(d99)} ms during ({during.reqs} requests) vs {ms(i99)} "
                  f"ms idle ({idle.reqs}); p50 {ms(pct(during.lats, 50))} vs "
                  f"{ms(pct(idle.lats, 50))} ms (x{p50x}); p99 per round during "
                  f"{[ms(pct(x['during'].lats, 99)) for x in rounds]}, idle "
                  f"{[ms(pct(x['idle'].lats + x['after'].lats, 99)) for x in rounds]}")
    enq.value, enq.unit = round(d99 / i99, 3) if i99 and d99 else 0.0, "x idle p99"
    return [delete, reap, idle_row, enq.judge(targets)]


# -- main ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.admin_bench",
                                 description="squall admin benchmark: list, stats, delete")
    ap.add_argument("--quick", action="store_true", help="10x smaller counts (smoke run)")
    ap.add_argument("--only", default="L,D", help="comma-separated among L,D (default: both)")
    ap.add_argument("--reap-batch", default="", metavar="N,...",
                    help="also run D with MasterSettings.reap_batch = each N (rows R<N>.*)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    ap.add_argument("--keep", action="store_true", help="keep the temp data dirs and logs")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--nice", type=int, default=0, metavar="N",
                    help="raise the priority of the benchmark and its servers by N (root)")
    a = ap.parse_args(argv)
    a.only = [w.strip().upper() for w in a.only.split(",") if w.strip()]
    a.reap_batch = [int(n) for n in a.reap_batch.split(",") if n.strip()]
    if any(w not in ("L", "D") for w in a.only) or any(n < 1 for n in a.reap_batch):
        ap.error("--only takes L and/or D; --reap-batch positive integers")
    return a


def run_workloads(ctx: Ctx, a: argparse.Namespace) -> list[dict[str, Any]]:
    from squall.master.service import MasterSettings

    rows: list[dict[str, Any]] = []

    def add(new: list[Row]) -> None:
        now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        rows.extend({**asdict(r), "date": now, "fsync_ms": fsync} for r in new)

    fsync = fdatasync_latency(50)["p50"]
    if "L" in a.only:
        add(workload_l(ctx))
    if "D" in a.only or a.reap_batch:
        fsync = fdatasync_latency(50)["p50"]
        snapshot, fill = d_snapshot(ctx)
        variants = ([("D", None)] if "D" in a.only else []) + [
            (f"R{n}", n) for n in a.reap_batch]
        rounds: dict[str, list[dict[str, Any]]] = {p: [] for p, _ in variants}
        fsyncs: list[float] = []
        for i in range(ctx.sizes.rounds):  # variants interleaved: load drift hits them alike
            for prefix, n in variants:
                ctx.say(f"{prefix}: round {i + 1}/{ctx.sizes.rounds}, reap_batch "
                        f"{n or MasterSettings.reap_batch}")
                fsyncs.append(fdatasync_latency(50)["p50"] or 0.0)
                rounds[prefix].append(d_round(ctx, snapshot, prefix, n))
        fsync = pct(fsyncs, 50)
        add([fill] if "D" in a.only else [])  # D.fill belongs to workload D
        for prefix, n in variants:
            add(d_rows(prefix, n or MasterSettings.reap_batch, rounds[prefix], ctx.sizes.big))
    for r in rows:
        if r.get("target"):
            r["vs_target"] = round(r["value"] / r["target"], 3)
    return rows


def run(argv: list[str] | None = None) -> dict[str, Any]:
    from rich.console import Console

    from squall.master.service import MasterSettings

    a = parse_args(argv)
    sizes = Sizes().quick() if a.quick else Sizes()
    stem = "admin-quick" if a.quick else "admin"
    console = Console(stderr=True)
    a.nice = raise_priority(a.nice, console.log)
    tmp = Path(tempfile.mkdtemp(prefix="squall-admin-bench-"))
    (tmp / "logs").mkdir()
    ctx = Ctx(sizes, tmp, tmp / "logs", console.log)
    doc = results_doc(a.quick, sizes, TARGETS, reap_batch_default=MasterSettings.reap_batch,
                      nice=-a.nice, rows=[])
    console.log(f"data and logs in {tmp}")
    try:
        doc["rows"] = run_workloads(ctx, a)
    finally:
        if a.keep:
            console.log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    doc["machine"]["load_at_end"] = list(os.getloadavg())
    print_table(doc["rows"], f"{TITLE} ({doc['mode']}, {doc['date']})", COLUMNS)
    # rows of workloads not run now (L, D, each R<N> of a --reap-batch sweep) are kept
    write_results(a.out, stem, doc, True, title=TITLE, targets=TARGETS, order=WORKLOADS,
                  columns=COLUMNS)
    console.log(f"results in {a.out / stem}.json and .md")
    return doc


def main(argv: list[str] | None = None) -> int:
    return exit_code(run(argv), argv)


if __name__ == "__main__":
    sys.exit(main())
