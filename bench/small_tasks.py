"""Small tasks at the speed of a database: squall and PostgreSQL side by side, in one run.

``python -m bench.small_tasks [--quick] [--only A,B,D,C]`` (``make bench-small``) starts a
squall cluster (a master and 3 data nodes, RF 2, fsync on) and a throwaway PostgreSQL
(``bench/pg_baseline.py``: ``FOR UPDATE SKIP LOCKED``, one transaction per call, fsync on)
and runs each workload on PostgreSQL and then on squall, so that every ratio is measured
together. 20,000 tasks of 1 KiB (2,000 with ``--quick``):

- A.put         one ``put`` per call, one client;
- A.lease_done  one task at a time: squall ``lease(1, payloads=True, done=<previous>)``
                (the acknowledgement rides on the next lease), PostgreSQL a lease
                transaction then a delete transaction;
- B.put         100 tasks per call, sequential (squall ``put_many(batch_size=100)``);
- B.lease_done  100 at a time: squall ``batches(100)``, PostgreSQL lease 100 then delete;
- D             4 producer processes (one ``put`` per call) + 4 consumer processes (squall
                ``Worker``s, PostgreSQL lease up to 16 + delete loops), first put to last
                acknowledgement;
- C             4 MiB payloads, squall only: ``put`` and ``lease(1, done=previous)`` →
                ``payload()``, against the last figure in ``bench/results/client.json``.

Targets are ratios to PostgreSQL. Results: ``bench/results/small-tasks.md`` and ``.json``
(``small-tasks-quick.*`` with ``--quick``). Without PostgreSQL (no server binaries, no
psycopg) the squall figures are still measured and the ratios say why they are missing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench import pg_baseline as pgb
from bench.client_bench import Ctx, Sizes, _drain_batches, _one_by_one
from bench.dn_cluster import ClusterSpec, running_cluster
from bench.harness import DEFAULT_OUT, fdatasync_latency, load1, ms, pct, results_doc, self_cpu_s
from squall.client import Client, LeasedTask
from squall.client._protocol import LEASE_VIA_NODE

WORKLOADS = ("A", "B", "D", "C")
TITLE = ("Small tasks: squall (master + 3 data nodes, RF 2, fsync on) and PostgreSQL "
         "(SKIP LOCKED, fsync on) in one run, 1 KiB payloads")
TARGETS = {"A.put": 0.2, "A.lease_done": 0.6, "B.put": 0.4, "B.lease_done": 0.6, "D": 0.5}
BATCH = 100
PG_CONSUMER_BATCH = 16


@dataclass
class Figure:
    """One workload: squall's and PostgreSQL's tasks per second (or MB/s for C)."""

    id: str
    what: str
    unit: str
    squall: float
    n: int
    squall_p50_ms: float | None = None
    squall_p99_ms: float | None = None
    squall_server_us_per_task: float | None = None
    squall_client_us_per_task: float | None = None
    pg: float | None = None
    pg_p50_ms: float | None = None
    pg_p99_ms: float | None = None
    pg_server_us_per_task: float | None = None
    ratio: float | None = None  # squall / PostgreSQL, or squall / the last recorded (C)
    target: float | None = None
    met: bool | None = None
    errors: int = 0
    load1: float = 0.0
    note: str = ""

    def judge(self) -> None:
        if self.pg:
            self.ratio = round(self.squall / self.pg, 3)
        self.target = TARGETS.get(self.id)
        if self.target is not None and self.ratio is not None:
            self.met = self.ratio >= self.target and not self.errors


def _per(x: float, n: int) -> float:
    return round(1e6 * x / max(1, n), 1)


def _squall(f: Figure, n: int, el: float, lats: list[float], srv: float, cli: float) -> None:
    f.squall, f.n = round(n / el, 1) if el > 0 else 0.0, n
    f.squall_p50_ms, f.squall_p99_ms = ms(pct(lats, 50)), ms(pct(lats, 99))
    f.squall_server_us_per_task, f.squall_client_us_per_task = _per(srv, n), _per(cli, n)


def _pg(f: Figure, m: pgb.Measured | None) -> None:
    if m is None:
        return
    f.pg = round(m.rate, 1)
    f.pg_p50_ms, f.pg_p99_ms = ms(pct(m.lats, 50)), ms(pct(m.lats, 99))
    f.pg_server_us_per_task = _per(m.server_cpu_s, m.n)
    f.errors += m.errors
    if m.note:
        f.note = (f.note + "; PostgreSQL: " + m.note).strip("; ")


@dataclass
class Run:
    ctx: Ctx
    pg: pgb.Postgres | None
    data: bytes
    via_node: bool = True  # the lease path of the main figures (the client's default)
    compare: bool = False  # also the other path (rows .node / .master)

    @property
    def z(self) -> Sizes:
        return self.ctx.sizes


def _meter(r: Run) -> tuple[float, float]:
    return r.ctx.server_cpu(), self_cpu_s()


def lease_one(r: Run, via_node: bool, rid: str) -> Figure:
    """One task at a time, lease(1, payloads=True, done=previous), through a data node or
    on the master: the squall half of A.lease_done (no PostgreSQL figure of its own)."""
    z, data, q = r.z, r.data, "st#a1"
    f = Figure(rid, "lease(1, payloads=True, done=previous), one at a time, "
               + ("through a data node (one request per task)" if via_node else
                  "on the master, then a batch read (two requests per task)"),
               "tasks/s", 0.0, 0)
    with Client(r.ctx.cluster.url, lease_via_node=via_node) as c:
        c.put_many(q, (data for _ in range(z.a_tasks)), batch_size=BATCH)
        _lease_each(r, c, q, data, z.a_tasks, f)
    return f


def _lease_each(r: Run, c: Client, q: str, data: bytes, tasks: int, f: Figure,
                payloads: bool = True) -> None:
    """lease(1, done=previous) one task at a time, each payload checked against `data`,
    the last acknowledged at the end: the squall half of `f`."""
    held: list[LeasedTask] = []
    bad = [0]

    def step(i: int) -> bool:
        got = c.lease(q, 1, 600, payloads=payloads, done=held)
        held[:] = got
        if not got:
            return False
        bad[0] += got[0].payload() != data
        return True

    s0, c0 = _meter(r)
    lats, n, el, _ = _one_by_one(r.ctx, tasks, step)
    if held:
        c.done(held)
    _squall(f, n, el, lats, r.ctx.server_cpu() - s0, self_cpu_s() - c0)
    f.errors += bad[0] + int(n != tasks)


def work_a(r: Run) -> list[Figure]:
    z, data, q = r.z, r.data, "st#a"
    put = Figure("A.put", "one put per call, one client", "tasks/s", 0.0, 0)
    lease = Figure("A.lease_done", "one task at a time: squall lease(1, payloads=True, "
                   "done=previous), PostgreSQL lease 1 then delete 1 (two transactions)",
                   "tasks/s", 0.0, 0)
    if r.pg:
        _pg(put, pgb.put_one(r.pg, "a", z.a_tasks, data, z.limit_s))
    with Client(r.ctx.cluster.url) as c:
        for _ in range(5):  # warm-up: connections, paths
            c.put(q, data)
        c.done(c.lease(q, 5, 600))
        s0, c0 = _meter(r)
        lats, n, el, _ = _one_by_one(r.ctx, z.a_tasks, lambda i: c.put(q, data))
        _squall(put, n, el, lats, r.ctx.server_cpu() - s0, self_cpu_s() - c0)
        put.errors += int(n != z.a_tasks)
        if r.pg:
            _pg(lease, pgb.lease_done(r.pg, "a", z.a_tasks, len(data), 1, z.limit_s))
        _lease_each(r, c, q, data, z.a_tasks, lease)
    out = [put, lease]
    if r.compare:
        out.append(lease_one(r, not r.via_node, "A.lease_done." + (
            "master" if r.via_node else "node")))
    return out


def _drain(r: Run, c: Client, q: str, n: int, f: Figure) -> None:
    """Lease and acknowledge the `n` tasks of `q` in batches: the squall half of `f`."""
    got, lats, el, c0, s0, bad = _drain_batches(r.ctx, c, q, n)
    _squall(f, got, el, lats, r.ctx.server_cpu() - s0, self_cpu_s() - c0)
    f.errors += bad + int(got != n)


def work_b(r: Run) -> list[Figure]:
    z, data, q = r.z, r.data, "st#b"
    put = Figure("B.put", f"{BATCH} tasks per call (squall put_many)", "tasks/s", 0.0, 0)
    lease = Figure("B.lease_done", f"{BATCH} at a time: squall batches({BATCH}) (2 ahead), "
                   f"PostgreSQL lease {BATCH} then delete them", "tasks/s", 0.0, 0)
    if r.pg:
        _pg(put, pgb.put_many(r.pg, "b", z.b_tasks, data, BATCH, z.limit_s))
    with Client(r.ctx.cluster.url) as c:
        c.put_many(q, [data] * BATCH, batch_size=BATCH)  # warm-up
        c.done(c.lease(q, BATCH, 600))
        lats: list[float] = []
        mark = [0.0]

        def progress(res: list[Any]) -> None:
            now = time.perf_counter()
            lats.append(now - mark[0])
            mark[0] = now

        s0, c0 = _meter(r)
        t0 = mark[0] = time.perf_counter()
        n = c.put_many(q, (data for _ in range(z.b_tasks)), batch_size=BATCH,
                       progress=progress)
        el = time.perf_counter() - t0
        _squall(put, n, el, lats, r.ctx.server_cpu() - s0, self_cpu_s() - c0)
        put.errors += int(n != z.b_tasks)
        put.note = ("squall: put_many's default of 16 batches in flight from one client; "
                    "PostgreSQL: one call at a time")
        if r.pg:
            _pg(lease, pgb.lease_done(r.pg, "b", z.b_tasks, len(data), BATCH, z.limit_s))
        _drain(r, c, q, n, lease)
    out = [put, lease]
    if r.compare:
        other = not r.via_node
        f = Figure("B.lease_done." + ("node" if other else "master"), f"batches({BATCH}) "
                   + ("through data nodes" if other else "on the master, then batch reads"),
                   "tasks/s", 0.0, 0)
        with Client(r.ctx.cluster.url, lease_via_node=other) as c:
            n = c.put_many(q, (data for _ in range(z.b_tasks)), batch_size=BATCH)
            _drain(r, c, q, n, f)
        out.append(f)
    return out


def work_d(r: Run) -> list[Figure]:
    from bench.client_more import workload_d

    z = r.z
    d = Figure("D", f"{z.producers} producer processes (one put per call) + {z.workers} "
               "consumer processes (squall Workers; PostgreSQL lease up to "
               f"{PG_CONSUMER_BATCH} + delete), first put to last acknowledgement",
               "tasks/s", 0.0, 0)
    if r.pg:
        _pg(d, pgb.mixed(r.pg, "d", z.d_tasks, len(r.data), z.producers, z.workers,
                         PG_CONSUMER_BATCH, z.limit_s))
    row = workload_d(r.ctx)[0]
    _d_figure(d, row)
    out = [d]
    if r.compare:
        other = not r.via_node
        os.environ["BENCH_LEASE_VIA_NODE"] = "1" if other else "0"
        try:
            row = workload_d(r.ctx)[0]
        finally:
            os.environ["BENCH_LEASE_VIA_NODE"] = "1" if r.via_node else "0"
        f = Figure("D." + ("node" if other else "master"), "D with the Workers leasing "
                   + ("through data nodes" if other else "on the master"), "tasks/s", 0.0, 0)
        _d_figure(f, row)
        out.append(f)
    return out


def _d_figure(d: Figure, row: Any) -> None:
    d.squall, d.n = row.value, row.n
    d.squall_p50_ms, d.squall_p99_ms = row.p50_ms, row.p99_ms
    d.squall_client_us_per_task = row.client_cpu_us_per_req
    if row.server_cpu_pct is not None and row.value:
        d.squall_server_us_per_task = round(1e4 * row.server_cpu_pct / row.value, 1)
    d.errors += row.errors + int(row.truncated)
    d.note = ("squall: " + row.note[:200].rstrip("; ") + "; " + d.note).strip("; ")


def _last_recorded(out: Path) -> dict[str, float]:
    """The last recorded C figures of the client benchmark (MB/s)."""
    with contextlib.suppress(OSError, ValueError):
        doc = json.loads((out / "client.json").read_text())
        return {r["id"]: float(r["value"]) for r in doc.get("rows", [])
                if r.get("id") in ("C.put", "C.lease_read")}
    return {}


def work_c(r: Run, out: Path) -> list[Figure]:
    z, q = r.z, "st#c"
    data = os.urandom(z.c_bytes)
    mb = z.c_bytes / 1e6
    last = _last_recorded(out)
    put = Figure("C.put", f"put(queue, {z.c_bytes >> 20} MiB), one at a time, vs the last "
                 "recorded figure (bench/results/client.json)", "MB/s", 0.0, 0)
    lease = Figure("C.lease_read", f"lease(1, done=previous) → payload() ({z.c_bytes >> 20} "
                   "MiB, checked), vs the last recorded figure", "MB/s", 0.0, 0)
    with Client(r.ctx.cluster.url) as c:
        c.put(q, data)
        c.lease(q, 1, 600)[0].done()
        s0, c0 = _meter(r)
        lats, n, el, _ = _one_by_one(r.ctx, z.c_tasks, lambda i: c.put(q, data))
        _squall(put, n, el, lats, r.ctx.server_cpu() - s0, self_cpu_s() - c0)
        _lease_each(r, c, q, data, z.c_tasks, lease, payloads=False)
    for f in (put, lease):
        f.squall = round(f.squall * mb, 1)
        if f.id in last:
            f.pg = None
            f.ratio = round(f.squall / last[f.id], 3) if last[f.id] else None
            f.note = f"last recorded: {last[f.id]:,.1f} MB/s (ratio = this run / it)"
    return [put, lease]


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "**no**"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)


def render(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [f"# {TITLE}", "",
             f"{doc['date']}, commit {m.get('commit', '')}, {m.get('nproc')} CPUs "
             f"({m.get('cpu', '')}), Python {m.get('python', '')}; load at start "
             f"{m['load_at_start'][0]:.2f}, at end {m.get('load_at_end', [0])[0]:.2f}; "
             f"fdatasync p50 {m.get('fdatasync_ms', {}).get('p50')} ms. Mode: {doc['mode']} "
             f"({doc['sizes']['a_tasks']:,} tasks per workload). Written by "
             "`python -m bench.small_tasks` (`make bench-small`); what runs: "
             "`bench/README.md`, \"Small tasks against PostgreSQL\".", ""]
    if doc.get("pg_skipped"):
        lines += [f"PostgreSQL baseline not run: {doc['pg_skipped']}.", ""]
    else:
        lines += [f"PostgreSQL {doc.get('pg_version', '')}: fsync on, synchronous_commit on, "
                  "unix socket, psycopg 3, autocommit (one transaction per call).", ""]
    lines += ["| workload | squall | PostgreSQL | squall / PostgreSQL | target | met | "
              "squall p50 / p99 ms | PostgreSQL p50 / p99 ms | squall servers µs/task | "
              "PostgreSQL µs/task | load | errors |",
              "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for f in doc["figures"]:
        ref = _fmt(f["pg"]) if f["unit"] == "tasks/s" else "(last recorded)"
        lines.append(
            f"| {f['id']} ({f['unit']}) | {_fmt(f['squall'])} | {ref} | {_fmt(f['ratio'])} | "
            f"{_fmt(f['target'])} | {_fmt(f['met'])} | {_fmt(f['squall_p50_ms'])} / "
            f"{_fmt(f['squall_p99_ms'])} | {_fmt(f['pg_p50_ms'])} / {_fmt(f['pg_p99_ms'])} | "
            f"{_fmt(f['squall_server_us_per_task'])} | {_fmt(f['pg_server_us_per_task'])} | "
            f"{_fmt(f['load1'])} | {f['errors']} |")
    lines += ["", "What each row measures:", ""]
    lines += [f"- **{f['id']}**: {f['what']}." + (f" {f['note']}." if f["note"] else "")
              for f in doc["figures"]]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.small_tasks", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="2,000 tasks per workload")
    ap.add_argument("--only", default=",".join(WORKLOADS), help="among A,B,D,C")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--compare-lease", action="store_true", help="also run the lease "
                    "workloads on the other lease path (through a data node / the master)")
    a = ap.parse_args(argv)
    a.only = [w.strip().upper() for w in a.only.split(",") if w.strip()]
    bad = set(a.only) - set(WORKLOADS)
    if bad:
        ap.error(f"unknown workloads {sorted(bad)}; known: {','.join(WORKLOADS)}")
    return a


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}  (load {load1()})", file=sys.stderr)


def sizes(quick: bool) -> Sizes:
    full = replace(Sizes(), a_tasks=20_000, b_tasks=20_000, d_tasks=20_000, c_tasks=50,
                   limit_s=300.0)
    return replace(full, a_tasks=2_000, b_tasks=2_000, d_tasks=2_000, c_tasks=10,
                   limit_s=120.0) if quick else full


def run(argv: list[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    z = sizes(a.quick)
    stem = "small-tasks-quick" if a.quick else "small-tasks"
    doc = results_doc(a.quick, z, TARGETS, figures=[])
    why = pgb.unavailable()
    if why:
        doc["pg_skipped"] = why
        say(f"PostgreSQL baseline skipped: {why}")
    tmp = Path(tempfile.mkdtemp(prefix="squall-small-"))
    try:
        with contextlib.ExitStack() as stack:
            pg = None if why else stack.enter_context(pgb.running_postgres())
            if pg is not None:
                doc["pg_version"] = pgb.server_version(pg)
            cl = stack.enter_context(running_cluster(ClusterSpec(nodes=3, rf=2), tmp))
            r = Run(Ctx(z, cl, False), pg, os.urandom(z.payload_bytes),
                    LEASE_VIA_NODE, a.compare_lease)
            os.environ["BENCH_LEASE_VIA_NODE"] = "1" if r.via_node else "0"
            doc["lease_via_node"] = r.via_node
            for w in WORKLOADS:
                if w not in a.only:
                    continue
                say(f"workload {w}")
                fsync = fdatasync_latency(50)["p50"]
                try:
                    figs = work_c(r, a.out) if w == "C" else {
                        "A": work_a, "B": work_b, "D": work_d}[w](r)
                except Exception as e:  # a failed workload is a row, not a lost run
                    say(f"{w} failed: {e!r}")
                    figs = [Figure(f"{w}.failed", "the workload failed", "", 0.0, 0, errors=1,
                                   note=repr(e)[:300])]
                for f in figs:
                    if f.unit == "tasks/s":
                        f.judge()
                    f.load1 = load1()
                    say(f"{f.id}: squall {f.squall:,.1f} {f.unit}, reference {f.pg}, "
                        f"ratio {f.ratio} (fsync p50 {fsync} ms)")
                    doc["figures"].append(asdict(f))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    doc["machine"]["load_at_end"] = list(os.getloadavg())
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / f"{stem}.json").write_text(json.dumps(doc, indent=1) + "\n")
    (a.out / f"{stem}.md").write_text(render(doc))
    print(render(doc))
    say(f"results in {a.out / stem}.md and .json")
    return doc


def main(argv: list[str] | None = None) -> int:
    doc = run(argv)
    return int(any(f["errors"] for f in doc["figures"]))


if __name__ == "__main__":
    sys.exit(main())
