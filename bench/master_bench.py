"""The master benchmark: real master processes on 127.0.0.1, fsync on, a fresh data dir each.

Run ``python -m bench.master_bench [--quick] [--only A,B,E] [--out DIR] [--profile]``
(``make bench``). Workloads (see bench/README.md for the reasoning and the targets):

- A     one client (httpx.Client, keep-alive), one task per request, sequential: enqueue,
        then lease (max_tasks=1) + dequeue one by one. Also the same shapes against a bare
        FastAPI/uvicorn endpoint (``bench/bare_app.py``), so squall is shown as a ratio of
        the HTTP ceiling.
- A4x4  4 client processes x 4 threads, single-task enqueues; total puts/s (and baseline).
- B     the same batched 100 per request: enqueue in batches of 100, lease 100 and dequeue
        those 100 in one update.
- S     what the power-loss-safe index costs: A.put, A4x4.put, B.put and B.lease_ack with
        the default index sync (one index fdatasync per group commit) and with
        ``--no-index-sync`` (LMDB synced at checkpoints only), in the same run.
- E     recovery: 900k tasks in big batches, a checkpoint (clean SIGTERM: the master syncs
        LMDB on close), ~100k single-task WAL records after it, SIGKILL; then the time from
        process start to the first successful real request, twice: after the SIGKILL as is
        (a process crash: the page cache keeps LMDB's unsynced writes), and with LMDB rolled
        back to the checkpoint (what a machine crash can leave), so that ~100k records are
        replayed.

Every loop is bounded in count and in time. Results: a rich table on stdout and
``<out>/master.json`` + ``<out>/master.md`` (``master-quick.*`` for ``--quick``).
The generic harness (servers, rows, writers) is :mod:`bench.harness`; the client loops are
:mod:`bench.master_load`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import shutil
import signal
import sys
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from bench.harness import (
    AUTH,
    DEFAULT_OUT,
    Row,
    Run,
    Server,
    Targets,
    baseline_server,
    exit_code,
    fdatasync_latency,
    free_port,
    get_json,
    load1,
    machine_info,
    master_server,
    metered,
    metric,
    ms,
    only_workloads,
    pct,
    print_table,
    proc_cpu_s,
    raise_priority,
    results_doc,
    running,
    write_results,
)
from bench.harness import rate_row as _rate_row
from bench.master_load import GROUP, multi_enqueue, seq_enqueue, seq_lease_ack, tasks_path, warm_up
from bench.profiling import Profiler

# imported by other benchmarks (bench/datanode_bench.py, dn_cluster.py, spark_bench.py)
__all__ = ["Profiler", "Server", "fdatasync_latency", "free_port", "load1", "machine_info",
           "pct", "proc_cpu_s"]

TITLE = "squall master benchmark"
WORKLOADS = ("A", "B", "S", "E")
RECOVERED_RE = re.compile(r"recovered: (\d+) WAL records replayed in ([\d.]+)s")

# id -> (comparison, target, what the figure is compared with)
TARGETS: Targets = {
    "A.put": (">=", 1_000),
    "A.pair": (">=", 500),
    "A4x4.put": (">=", 1_630),
    "B.put": (">=", 43_000),
    "B.lease_ack": (">=", 42_000),
    "E.kill": ("<=", 3.0),
    "E.lost_index": ("<=", 3.0),
}


@dataclass(frozen=True)
class Sizes:
    a_seq: int = 20_000  # tasks, one per request
    a_multi: int = 20_000  # requests in total across the A4x4 clients
    procs: int = 4
    threads: int = 4
    warmup: int = 200  # requests before a measured loop (not measured)
    b_tasks: int = 20_000
    b_batch: int = 100
    e_load: int = 900_000  # tasks before the checkpoint
    e_load_batch: int = 1_000  # the API's maximum batch
    e_tail: int = 100_000  # single-task WAL records after the checkpoint
    loop_limit_s: float = 300.0  # every measured loop stops after this long
    serve_timeout_s: float = 120.0  # a server that is not serving by then is a failure

    def quick(self) -> Sizes:
        return replace(self, a_seq=2_000, a_multi=2_000, warmup=50, b_tasks=2_000,
                       e_load=90_000, e_tail=10_000, loop_limit_s=120.0)


def rate_row(rid: str, what: str, run: Run, unit: str, **kw: Any) -> Row:
    return _rate_row(rid, what, run, unit, TARGETS, **kw)


# -- workloads -----------------------------------------------------------------------------
@dataclass
class Ctx:
    sizes: Sizes
    tmp: Path
    logs: Path
    prof: Profiler
    say: Any

    def fresh_dir(self, name: str) -> Path:
        d = self.tmp / name
        shutil.rmtree(d, ignore_errors=True)
        return d


def _seq_on(server: Server, fn: Any, *args: Any, label: str, ctx: Ctx) -> Run:
    with httpx.Client(base_url=server.url, timeout=60.0, headers=AUTH) as c:
        warm_up(c, ctx.sizes.warmup, lease=server.name.startswith("master"))
        run = Run()
        with ctx.prof.record(label, server.pid):
            m = Run()
            with metered(m, server.pid):
                run = fn(c, *args)
        run.server_cpu_s, run.client_cpu_s = m.server_cpu_s, m.client_cpu_s
    return run


def _multi_on(server: Server, queue: str, label: str, ctx: Ctx) -> Run:
    z = ctx.sizes
    with httpx.Client(base_url=server.url, timeout=60.0, headers=AUTH) as c:
        warm_up(c, z.warmup, lease=False)
    with ctx.prof.record(label, server.pid):
        return multi_enqueue(server.url, queue, "m", z.a_multi, z.procs, z.threads,
                             z.loop_limit_s, server_pid=server.pid)


def workload_a(ctx: Ctx) -> list[Row]:
    z = ctx.sizes
    shape = f"{z.procs} procs x {z.threads} threads"
    ctx.say(f"A: baselines (bare FastAPI endpoint, {z.a_seq} sequential + {z.a_multi} {shape})")
    with running(baseline_server("bare", ctx.logs)) as srv:
        bare_seq = _seq_on(srv, seq_enqueue, "a", z.a_seq, 1, z.loop_limit_s, label="A-bare-seq",
                           ctx=ctx)
        bare_multi = _multi_on(srv, "a", "A4x4-bare", ctx)
    with running(baseline_server("model", ctx.logs)) as srv:
        model_seq = _seq_on(srv, seq_enqueue, "a", z.a_seq, 1, z.loop_limit_s,
                            label="A-model-seq", ctx=ctx)
    ctx.say(f"A: squall, {z.a_seq} single-task enqueues, then lease+dequeue one by one")
    with running(master_server(ctx.fresh_dir("a"), ctx.logs, "master-a")) as srv:
        put = _seq_on(srv, seq_enqueue, "a", z.a_seq, 1, z.loop_limit_s, label="A-put", ctx=ctx)
        pair = _seq_on(srv, seq_lease_ack, "a", 1, z.a_seq, z.loop_limit_s, label="A-pair",
                       ctx=ctx)
    ctx.say(f"A4x4: squall, {z.a_multi} single-task enqueues from {shape}")
    with running(master_server(ctx.fresh_dir("a4x4"), ctx.logs, "master-a4x4")) as srv:
        multi = _multi_on(srv, "a4", "A4x4-put", ctx)
    pair_row = rate_row("A.pair", "lease(1) + dequeue(1), sequential", pair, "pairs/s",
                        baseline=bare_seq.req_rate / 2,
                        note="baseline: half the bare request rate (2 requests per pair); "
                        f"lease p50 {ms(pct(pair.parts['lease'], 50))} ms, dequeue p50 "
                        f"{ms(pct(pair.parts['dequeue'], 50))} ms")
    return [
        rate_row("A.base", "bare FastAPI POST, 1-task body, sequential", bare_seq, "req/s"),
        rate_row("A.base_model", "bare + path/body validation, sequential", model_seq, "req/s",
                 baseline=bare_seq.req_rate),
        rate_row("A.put", "enqueue 1 task/request, sequential", put, "puts/s",
                 baseline=bare_seq.req_rate),
        pair_row,
        rate_row("A4x4.base", f"bare FastAPI POST, {shape}", bare_multi, "req/s"),
        rate_row("A4x4.put", f"enqueue 1 task/request, {shape}", multi, "puts/s",
                 baseline=bare_multi.req_rate),
    ]


def workload_b(ctx: Ctx) -> list[Row]:
    z = ctx.sizes
    n, k = z.b_tasks, z.b_batch
    ctx.say(f"B: baselines, {n // k} requests of {k} tasks")
    with running(baseline_server("bare", ctx.logs)) as srv:
        bare = _seq_on(srv, seq_enqueue, "b", n, k, z.loop_limit_s, label="B-bare", ctx=ctx)
    with running(baseline_server("model", ctx.logs)) as srv:
        model = _seq_on(srv, seq_enqueue, "b", n, k, z.loop_limit_s, label="B-model", ctx=ctx)
    ctx.say(f"B: squall, {n} tasks in batches of {k}, then lease {k} + dequeue {k} per round")
    with running(master_server(ctx.fresh_dir("b"), ctx.logs, "master-b")) as srv:
        put = _seq_on(srv, seq_enqueue, "b", n, k, z.loop_limit_s, label="B-put", ctx=ctx)
        ack = _seq_on(srv, seq_lease_ack, "b", k, n, z.loop_limit_s, label="B-lease_ack",
                      ctx=ctx)
    return [
        rate_row("B.base", f"bare FastAPI POST, {k}-task body, sequential", bare, "tasks/s"),
        rate_row("B.base_model", f"bare + validation of {k} tasks, sequential", model,
                 "tasks/s", baseline=bare.rate),
        rate_row("B.put", f"enqueue {k} tasks/request, sequential", put, "puts/s",
                 baseline=bare.rate),
        rate_row("B.lease_ack", f"lease({k}) + dequeue({k}) in one update, sequential", ack,
                 "tasks/s", baseline=bare.rate / 2,
                 note="baseline: half the bare rate (2 requests per round); latency per "
                 f"round; lease p50 {ms(pct(ack.parts['lease'], 50))} ms, dequeue p50 "
                 f"{ms(pct(ack.parts['dequeue'], 50))} ms"),
    ]


def workload_s(ctx: Ctx) -> list[Row]:
    z = ctx.sizes
    n, k = z.b_tasks, z.b_batch
    rows: list[Row] = []
    runs: dict[str, dict[str, Run]] = {}
    for mode, extra in (("sync", ()), ("nosync", ("--no-index-sync",))):
        ctx.say(f"S: index {mode}: {z.a_seq} single puts, {z.a_multi} from 4x4, {n} in "
                f"batches of {k}, lease+ack")
        with running(master_server(ctx.fresh_dir(f"s-{mode}"), ctx.logs, f"master-s-{mode}",
                                   extra)) as srv:
            runs[mode] = {
                "put": _seq_on(srv, seq_enqueue, "s", z.a_seq, 1, z.loop_limit_s,
                               label=f"S-put-{mode}", ctx=ctx),
                "multi": _multi_on(srv, "s4", f"S-multi-{mode}", ctx),
                "bput": _seq_on(srv, seq_enqueue, "sb", n, k, z.loop_limit_s,
                                label=f"S-bput-{mode}", ctx=ctx),
                "back": _seq_on(srv, seq_lease_ack, "sb", k, n, z.loop_limit_s,
                                label=f"S-back-{mode}", ctx=ctx),
            }
    what = {"put": ("enqueue 1 task/request, sequential", "puts/s"),
            "multi": ("enqueue 1 task/request, 4 procs x 4 threads", "puts/s"),
            "bput": (f"enqueue {k} tasks/request, sequential", "tasks/s"),
            "back": (f"lease({k}) + dequeue({k}), sequential", "tasks/s")}
    for key, (desc, unit) in what.items():
        off = runs["nosync"][key]
        rows.append(rate_row(f"S.{key}_nosync", f"{desc}, --no-index-sync", off, unit))
        rows.append(rate_row(f"S.{key}_sync", f"{desc}, index sync (default)",
                             runs["sync"][key], unit, baseline=off.rate,
                             note="baseline: the same with --no-index-sync"))
    return rows


def _replayed(log_path: Path) -> tuple[int, float] | None:
    found = RECOVERED_RE.findall(log_path.read_text(errors="replace"))
    return (int(found[-1][0]), float(found[-1][1])) if found else None


def _dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


def _recover(ctx: Ctx, data: Path, name: str, probe: str, expect_total: int,
             extra: tuple[str, ...]) -> dict[str, Any]:
    """Start a master on `data`, time process start -> first 200 on `probe`, verify, kill."""
    srv = master_server(data, ctx.logs, name, extra).start()
    try:
        serve_s = srv.wait_serving(probe, timeout=ctx.sizes.serve_timeout_s)
        ready = get_json(srv.url, "/readyz")
        stats = get_json(srv.url, f"/v1/groups/{GROUP}/queues/e")
    finally:
        srv.kill9()
    replayed = _replayed(srv.log_path)
    return {"serve_s": round(serve_s, 3), "recovery_secs": round(ready["recovery_secs"], 3),
            "replayed_records": replayed[0] if replayed else None,
            "tasks": stats["total"], "tasks_expected": expect_total,
            "tasks_ok": stats["total"] == expect_total}


def _e_fill(ctx: Ctx, data: Path, extra: tuple[str, ...]) -> dict[str, Any]:
    """Load, checkpoint by a clean stop, add the tail, SIGKILL. Returns what was done."""
    z = ctx.sizes
    ctx.say(f"E: loading {z.e_load} tasks in batches of {z.e_load_batch}")
    srv = master_server(data, ctx.logs, "master-e-load", extra).start()
    try:
        srv.wait_serving(timeout=z.serve_timeout_s)
        with httpx.Client(base_url=srv.url, timeout=120.0, headers=AUTH) as c:
            load = seq_enqueue(c, "e", z.e_load, z.e_load_batch, z.loop_limit_s, tag="L")
    finally:
        rc = srv.terminate()
    if rc not in (0, -signal.SIGTERM):  # uvicorn re-raises SIGTERM after a clean shutdown
        raise RuntimeError(f"master did not stop cleanly (exit {rc}); see {srv.log_path}")
    snapshot = ctx.tmp / "e-index-at-checkpoint"
    shutil.copytree(data / "index", snapshot)
    ctx.say(f"E: checkpoint done (clean stop); adding {z.e_tail} single-task records "
            f"from {z.procs} procs x {z.threads} threads")
    srv = master_server(data, ctx.logs, "master-e-tail", extra).start()
    try:
        restart_s = srv.wait_serving(timeout=z.serve_timeout_s)
        ready = get_json(srv.url, "/readyz")
        clean_replayed = _replayed(srv.log_path)
        ticket0 = ready["ticket"]
        tail = multi_enqueue(srv.url, "e", "T", z.e_tail, z.procs, z.threads, z.loop_limit_s,
                             server_pid=srv.pid)
        ticket1 = get_json(srv.url, "/readyz")["ticket"]
        checkpoints = metric(srv.url, "squall_checkpoints")
    finally:
        srv.kill9()
    return {"load": load, "tail": tail, "snapshot": snapshot, "restart_s": restart_s,
            "clean_restart_recovery_secs": ready["recovery_secs"],
            "clean_restart_replayed": clean_replayed[0] if clean_replayed else None,
            "tail_records": ticket1 - ticket0, "checkpoints_during_tail": checkpoints,
            "wal_mb": round(_dir_bytes(data / "wal") / 2**20, 1),
            "index_mb": round(_dir_bytes(data / "index") / 2**20, 1)}


def workload_e(ctx: Ctx) -> list[Row]:
    z = ctx.sizes
    extra = ("--checkpoint-interval-s", "3600")
    data = ctx.fresh_dir("e")
    f = _e_fill(ctx, data, extra)
    load, tail = f["load"], f["tail"]
    expect = load.items + tail.items
    probe = f"{tasks_path('e')}/{tail.extra.get('last_pid') or load.extra['last_pid']}"
    ctx.say("E: SIGKILLed; restarting (process crash: LMDB as the page cache left it)")
    kill = _recover(ctx, data, "master-e-kill", probe, expect, extra)
    ctx.say("E: restarting with LMDB rolled back to the checkpoint (replays the tail)")
    shutil.rmtree(data / "index")
    shutil.copytree(f["snapshot"], data / "index")
    lost = _recover(ctx, data, "master-e-lost-index", probe, expect, extra)
    floor_srv = baseline_server("bare", ctx.logs).start()
    try:
        floor = floor_srv.wait_serving(timeout=z.serve_timeout_s)
    finally:
        floor_srv.terminate()
    common = (f"{load.items} tasks in {load.reqs} requests, checkpoint, then "
              f"{f['tail_records']} single-task records (WAL {f['wal_mb']} MB, LMDB "
              f"{f['index_mb']} MB, checkpoints during tail: {f['checkpoints_during_tail']:g})")
    rows = [
        rate_row("E.load", f"load before the checkpoint, batches of {z.e_load_batch}", load,
                 "puts/s"),
        rate_row("E.tail", f"tail records, single-task, {z.procs}x{z.threads} clients", tail,
                 "puts/s", note=f"{f['tail_records']} WAL records"),
        Row("E.floor", "E", "bare FastAPI app: process start -> first answer", round(floor, 3),
            "s", load1=load1(), note="interpreter + import floor of any serve time"),
        Row("E.clean", "E", "after clean stop: process start -> first answer",
            round(f["restart_s"], 3), "s", load1=load1(),
            note=f"recovery_secs {f['clean_restart_recovery_secs']:.3f}, replayed "
            f"{f['clean_restart_replayed']} records (0: the clean stop checkpointed LMDB)"),
    ]
    for rid, what, res in (("E.kill", "after SIGKILL: start -> first real answer", kill),
                           ("E.lost_index", "LMDB at checkpoint: start -> first real answer",
                            lost)):
        note = (f"recovery_secs {res['recovery_secs']}, replayed {res['replayed_records']} "
                f"records, tasks {res['tasks']}/{res['tasks_expected']}; {common}")
        row = Row(rid, "E", what, res["serve_s"], "s", n=expect, load1=load1(), note=note,
                  errors=0 if res["tasks_ok"] else 1).judge(TARGETS)
        rows.append(row)
    return rows


RUNNERS = {"A": workload_a, "B": workload_b, "S": workload_s, "E": workload_e}


# -- main ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.master_bench",
                                 description="squall master benchmark (real processes)")
    ap.add_argument("--quick", action="store_true", help="10x smaller counts (smoke run)")
    ap.add_argument("--only", default=",".join(WORKLOADS),
                    help="comma-separated workloads among A,B,E (default: all)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results directory")
    ap.add_argument("--profile", action="store_true",
                    help="py-spy the server during measured loops (needs root); raw stacks "
                    "in <out>/profiles/")
    ap.add_argument("--keep", action="store_true", help="keep the temp data dirs and logs")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--nice", type=int, default=0, metavar="N",
                    help="raise the priority of the benchmark and its servers by N (needs "
                    "root; reduces noise from other work on a shared machine)")
    a = ap.parse_args(argv)
    a.only = only_workloads(ap, a.only, WORKLOADS)
    return a


def run(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the results document (also written to disk)."""
    a = parse_args(argv)
    sizes = Sizes().quick() if a.quick else Sizes()
    stem = "master-quick" if a.quick else "master"
    from rich.console import Console

    console = Console(stderr=True)

    def say(msg: str) -> None:
        console.log(msg)

    a.nice = raise_priority(a.nice, say)
    tmp = Path(tempfile.mkdtemp(prefix="squall-bench-"))
    logs = tmp / "logs"
    logs.mkdir()
    prof = Profiler(a.out / "profiles" if a.profile else None)
    ctx = Ctx(sizes, tmp, logs, prof, say)
    doc = results_doc(a.quick, sizes, TARGETS, nice=-a.nice, rows=[])
    say(f"data and logs in {tmp}")
    try:
        for w in WORKLOADS:
            if w in a.only:
                now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
                fsync = fdatasync_latency(50)["p50"]  # the disk is shared too
                doc["rows"] += [{**asdict(r), "date": now, "fsync_ms": fsync}
                                for r in RUNNERS[w](ctx)]
    finally:
        if a.keep:
            say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    doc["machine"]["load_at_end"] = list(os.getloadavg())
    doc["profiles"] = prof.summaries
    print_table(doc["rows"], f"{TITLE} ({doc['mode']}, {doc['date']})")
    write_results(a.out, stem, doc, merge=set(a.only) != set(WORKLOADS), title=TITLE,
                  targets=TARGETS, order=WORKLOADS)
    say(f"results in {a.out / stem}.json and .md")
    return doc


def main(argv: list[str] | None = None) -> int:
    return exit_code(run(argv), argv)


if __name__ == "__main__":
    sys.exit(main())
