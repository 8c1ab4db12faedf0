"""The data node benchmark: a real master and data nodes on 127.0.0.1 (fsync on), one
Python client (httpx, keep-alive), the payload paths end to end.

Run ``python -m bench.datanode_bench [--quick] [--only C,D,R] [--nice N] [--profile]``.
Workloads (see bench/README.md):

- C   large payloads: 200 x 4 MiB put (allocate → PUT through the replication pipeline →
      enqueue with receipts), then lease (10 per request) + GET + dequeue; at replication
      factor 1 and 2 (3 data nodes).
- D   20,000 x 1 KiB payload tasks at RF 2: batched 100 per request (allocate 100 → one
      batch-put → one enqueue; lease 100 → batch-get → one dequeue), and one task per
      request from 4 client processes x 4 threads.
- R   re-replication: 256 x 4 MiB, then 20,000 x 1 KiB, at RF 2, kill -9 a holder, time
      from the master noticing to under_replicated == 0 and nothing in flight or waiting
      (MB/s, blobs/s); foreground put latency (64 KiB payloads, 40/s) during the repair
      against idle.

Every loop is bounded in count and time. Results: a table on stdout and
``<out>/datanode.json`` + ``.md`` (``datanode-quick.*`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from bench.dn_cluster import ClusterSpec, CpuMeter, Payloads, running_cluster
from bench.dn_multi import multi_phases
from bench.dn_repair import workload_r
from bench.dn_rows import (
    DEFAULT_OUT,
    TARGETS,
    WORKLOADS,
    Ctx,
    Row,
    Sizes,
    ms,
    phases,
    print_table,
    write_results,
)
from bench.harness import (
    exit_code,
    fdatasync_latency,
    load1,
    only_workloads,
    pct,
    raise_priority,
    results_doc,
    timed_loop,
)
from bench.profiling import Profiler


# -- C: large payloads ----------------------------------------------------------------------
def workload_c(ctx: Ctx) -> list[Row]:
    data = os.urandom(ctx.sizes.c_bytes)
    return [r for rf in (1, 2) for r in _c_rf(ctx, rf, data)]


def _c_rf(ctx: Ctx, rf: int, data: bytes) -> list[Row]:
    z = ctx.sizes
    rows: list[Row] = []
    ctx.say(f"C: RF {rf}, {z.c_blobs} x {z.c_bytes >> 20} MiB")
    with running_cluster(ClusterSpec(rf=rf), ctx.fresh(f"c-rf{rf}")) as cl:
        cli = Payloads(cl.url, f"c{rf}")
        try:
            for i in range(3):  # warm-up: connections, code paths
                cli.put(f"w{i}", data[: 1 << 20])
            for t in cli.lease(10):
                cli.get(t)
            cpu = CpuMeter(cl.pids())
            cli.phases.clear()
            with cpu.measure(), ctx.prof.record(f"C.rf{rf}.put", cl.nodes[0].pid):
                lats, n, el, trunc = timed_loop(
                    z.loop_limit_s, z.c_blobs, lambda i: bool(cli.put(f"t{i:06d}", data)))
            rows.append(Row(f"C.rf{rf}.put", f"RF {rf}: allocate → PUT 4 MiB → enqueue",
                            round(n * z.c_bytes / el / 1e6, 1), "MB/s", n, round(el, 2),
                            ms(pct(lats, 50)), ms(pct(lats, 99)), cpu_s=cpu.used,
                            truncated=trunc, note=phases(cli, n)).judge())
            rows.append(_c_put_parallel(ctx, cl.url, rf, data, cpu, cl.nodes[0].pid))
            total = z.c_blobs + z.c_blobs // 2
            half = total // 2
            for how, count in (("httpx", half), ("engine", total - half)):
                rows.append(_c_drain(ctx, cli, cpu, rf, how, count, cl.nodes[0].pid))
        finally:
            cli.close()
    return rows


def _c_put_parallel(ctx: Ctx, url: str, rf: int, data: bytes, cpu: CpuMeter, pid: int
                    ) -> Row:
    """Half as many puts again from 4 threads of this one client (own connections): what
    the nodes give when a client keeps a few writes in flight (no target)."""
    z = ctx.sizes
    n, k = z.c_blobs // 2, 4
    clis = [Payloads(url, f"c{rf}") for _ in range(k)]
    lats: list[float] = []
    errors: list[str] = []

    def work(t: int) -> None:
        end_by = time.perf_counter() + z.loop_limit_s
        for i in range(t, n, k):
            s = time.perf_counter()
            try:
                clis[t].put(f"p{i:06d}", data)
            except Exception as e:
                errors.append(repr(e)[:200])
                return
            lats.append(time.perf_counter() - s)
            if time.perf_counter() > end_by:
                return

    try:
        with cpu.measure(), ctx.prof.record(f"C.rf{rf}.put_x4", pid):
            t0 = time.perf_counter()
            ths = [threading.Thread(target=work, args=(t,)) for t in range(k)]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
            el = time.perf_counter() - t0
    finally:
        for c in clis:
            c.close()
    return Row(f"C.rf{rf}.put_x4", f"RF {rf}: the same put, {k} in flight (threads of one "
               "client)", round(len(lats) * z.c_bytes / el / 1e6, 1), "MB/s", len(lats),
               round(el, 2), ms(pct(lats, 50)), ms(pct(lats, 99)), cpu_s=cpu.used,
               errors=len(errors), truncated=len(lats) + len(errors) < n,
               note=f"{n} puts; no target (the target rows are sequential)"
               + (f"; errors: {errors[:2]}" if errors else "")).judge()


def _c_drain(ctx: Ctx, cli: Payloads, cpu: CpuMeter, rf: int, how: str, count: int,
             pid: int) -> Row:
    """lease → GET each → dequeue, until `count` tasks are done; MB/s of payload read."""
    z = ctx.sizes
    cli.fast_get = how == "engine"
    done = [0]

    def drain(_: int) -> int:
        tasks = cli.lease(min(z.c_lease, count - done[0])) if done[0] < count else []
        if not tasks:
            return 0
        got = sum(cli.get(t) for t in tasks)
        cli.dequeue(tasks)
        done[0] += len(tasks)
        return got

    rid = f"C.rf{rf}.get" + ("" if cli.fast_get else "_httpx")
    with cpu.measure(), ctx.prof.record(rid, pid):
        lats, nbytes, el, trunc = timed_loop(z.loop_limit_s, count, drain)
    client = ("the engine (common/transport: one piece per blob)" if cli.fast_get
              else "httpx streaming (64 KiB reads)")
    return Row(rid, f"RF {rf}: lease {z.c_lease} → GET each with {client} → dequeue",
               round(nbytes / el / 1e6, 1) if el else 0.0, "MB/s", done[0], round(el, 2),
               ms(pct(lats, 50)), ms(pct(lats, 99)), cpu_s=cpu.used, truncated=trunc,
               errors=int(done[0] != count),
               note=f"{done[0]} of {count} drained; latency per lease round; "
                    f"{phases(cli, done[0])}").judge()


# -- D: 1 KiB payload tasks -----------------------------------------------------------------
def workload_d(ctx: Ctx) -> list[Row]:
    z = ctx.sizes
    rows: list[Row] = []
    ctx.say(f"D: {z.d_tasks} x {z.d_bytes} B at RF 2, batches of {z.d_batch}")
    with running_cluster(ClusterSpec(rf=2), ctx.fresh("d-batch")) as cl:
        cli = Payloads(cl.url, "d")
        try:
            datas = [os.urandom(z.d_bytes) for _ in range(z.d_batch)]
            cli.put_batch([f"w{i}" for i in range(z.d_batch)], datas)  # warm-up
            warm = cli.lease(z.d_batch)
            cli.get_batch(warm)
            cli.dequeue(warm)
            nb = z.d_tasks // z.d_batch
            cpu = CpuMeter(cl.pids())
            cli.phases.clear()

            def put(i: int) -> int:
                cli.put_batch([f"t{i:05d}{j:03d}" for j in range(z.d_batch)], datas)
                return z.d_batch

            with cpu.measure(), ctx.prof.record("D.batch.put", cl.nodes[0].pid):
                lats, n, el, trunc = timed_loop(z.loop_limit_s, nb, put)
            rows.append(Row("D.batch.put", f"allocate {z.d_batch} → batch-put → enqueue "
                            f"{z.d_batch}", round(n / el, 1), "tasks/s", n, round(el, 2),
                            ms(pct(lats, 50)), ms(pct(lats, 99)), cpu_s=cpu.used,
                            truncated=trunc, note=f"latency per batch; {phases(cli, n)}"
                            ).judge())

            def drain(_: int) -> int:
                tasks = cli.lease(z.d_batch)
                if not tasks:
                    return 0
                cli.get_batch(tasks)
                cli.dequeue(tasks)
                return len(tasks)

            with cpu.measure(), ctx.prof.record("D.batch.drain", cl.nodes[0].pid):
                lats, n, el, trunc = timed_loop(z.loop_limit_s, nb + 1, drain)
            rows.append(Row("D.batch.drain", f"lease {z.d_batch} → batch-get → dequeue "
                            f"{z.d_batch}", round(n / el, 1), "tasks/s", n, round(el, 2),
                            ms(pct(lats, 50)), ms(pct(lats, 99)), cpu_s=cpu.used,
                            truncated=trunc, errors=int(n != nb * z.d_batch),
                            note=f"latency per batch; {phases(cli, n)}").judge())
        finally:
            cli.close()
    ctx.say(f"D: {z.d_tasks} single-task requests from {z.procs} x {z.threads} clients")
    with running_cluster(ClusterSpec(rf=2), ctx.fresh("d-4x4")) as cl:
        cpu = CpuMeter(cl.pids())
        with cpu.measure():
            ph = multi_phases(cl.url, z.d_tasks, z.d_bytes, z.procs, z.threads,
                              z.loop_limit_s)
        for name, what in (("put", "allocate 1 → PUT 1 KiB → enqueue 1"),
                           ("drain", "lease 1 → GET → dequeue 1")):
            p = ph[name]
            rows.append(Row(f"D.4x4.{name}", what, round(p["items"] / p["elapsed"], 1)
                            if p["elapsed"] else 0.0, "tasks/s", p["items"],
                            round(p["elapsed"], 2), ms(pct(p["lats"], 50)),
                            ms(pct(p["lats"], 99)), cpu_s=cpu.used if name == "put" else {},
                            errors=p["errors"], truncated=p["truncated"],
                            note=(p["first_error"] or "") + (" CPU: both phases"
                                                             if name == "put" else "")
                            ).judge())
    return rows



RUNNERS = {"C": workload_c, "D": workload_d, "R": workload_r}



def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.datanode_bench",
                                 description="squall data node benchmark (real processes)")
    ap.add_argument("--quick", action="store_true", help="smaller counts (smoke run)")
    ap.add_argument("--only", default=",".join(WORKLOADS), help="workloads among C,D,R")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--profile", action="store_true", help="py-spy one data node per loop")
    ap.add_argument("--copies-per-node", type=int, default=Sizes.copies_per_node,
                    help="the master's --max-copies-per-node in R (blobs in flight)")
    ap.add_argument("--repair-bytes", type=int, default=Sizes.repair_bytes,
                    help="the master's --max-repair-bytes-per-node in R")
    ap.add_argument("--repair-pace", type=int, default=Sizes.repair_pace,
                    help="the data nodes' --repair-bytes-per-s in R (0: unpaced)")
    ap.add_argument("--small-blobs", type=int, default=None,
                    help="1 KiB blobs written before the kill in R (default 20,000; "
                         "4,000 with --quick)")
    ap.add_argument("--nice", type=int, default=0, metavar="N",
                    help="raise the benchmark's priority by N (root)")
    ap.add_argument("--keep", action="store_true", help="keep the temp dirs and logs")
    a = ap.parse_args(argv)
    a.only = only_workloads(ap, a.only, WORKLOADS)
    return a


def run(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    sizes = replace(Sizes().quick() if a.quick else Sizes(), copies_per_node=a.copies_per_node,
                    repair_bytes=a.repair_bytes, repair_pace=a.repair_pace)
    if a.small_blobs:
        sizes = replace(sizes, s_blobs=a.small_blobs)
    stem = "datanode-quick" if a.quick else "datanode"

    def say(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}  (load {load1()})", file=sys.stderr)

    a.nice = raise_priority(a.nice, say)
    tmp = Path(tempfile.mkdtemp(prefix="squall-dnbench-"))
    prof = Profiler(a.out / "profiles" if a.profile else None)
    ctx = Ctx(sizes, tmp, prof, say)
    doc = results_doc(a.quick, sizes, TARGETS, nice=-a.nice, rows=[])
    say(f"data and logs in {tmp}")
    try:
        for w in WORKLOADS:
            if w in a.only:
                fsync = fdatasync_latency(50)["p50"]
                try:
                    rows = RUNNERS[w](ctx)
                except Exception as e:  # a failed workload is a row, not a lost run
                    say(f"{w} failed: {e!r}")
                    rows = [Row(f"{w}.failed", "the workload failed", 0.0, "", errors=1,
                                note=repr(e)[:500])]
                for r in rows:
                    doc["rows"].append({**asdict(r), "fsync_ms_before": fsync})
    finally:
        if a.keep:
            say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    doc["machine"]["load_at_end"] = list(os.getloadavg())
    doc["profiles"] = prof.summaries
    print_table(doc["rows"])
    write_results(a.out, stem, doc, merge=set(a.only) != set(WORKLOADS))
    say(f"results in {a.out / stem}.json and .md")
    return doc


def main(argv: list[str] | None = None) -> int:
    return exit_code(run(argv), argv)


if __name__ == "__main__":
    sys.exit(main())

