"""Where the missed client targets go (for each missed target, a py-spy profile saying
what bounds it): ``python -m bench.client_profile [--only A,B,D] [--quick]``
(``make profile``; py-spy needs root or ptrace rights). The lease side:
``--only L,R --stem lease-profile`` (``make profile-lease``): A.lease_done (``lease(1,
payloads=True, done=previous)`` one at a time) and B.lease_done (``batches(100)``), their
tasks put first, untimed.

Each workload runs as in ``bench.client_bench`` (master + 3 data nodes, RF 2, fsync on,
1 KiB payloads): A.put (one ``put`` at a time), B.put (``put_many`` in batches of 100), D
(4 producer + 4 ``Worker`` processes). Each runs twice:

- **clean, for the CPU per task**: every server thread's user and system time from
  ``/proc`` (system time includes the ``fdatasync`` calls; threads named by py-spy), the
  clients' from ``getrusage``, the rate, and how idle the machine was (``/proc/stat``);
- **under py-spy, for where the Python time goes**: one ``py-spy record --subprocesses``
  over the master, the data nodes and the client processes (it pauses each process for a
  sample, so this run is slower; its size is set so that it gathers enough samples). Each
  busy sample goes in a category by its innermost frame, and by that frame's source line
  when it calls into C (``orjson.dumps``, ``txn.commit()``, ``os.fdatasync``, a socket
  ``send``): the HTTP stack, validation and serialisation, fsync, LMDB, checksums and
  copies, auth, thread hand-offs, and the project's own logic per component. A thread
  waiting (uvloop's C loop, a condition, a queue) is not busy; uvloop's own C work is
  counted with it, so the HTTP stack's share is a lower bound.

Results: ``<out>/client-profile.json`` and ``.md`` (``client-profile-quick.*`` with
``--quick``). What the figures say, and the next step for each target: ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import linecache
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson

from bench.client_bench import Ctx, Sizes, say
from bench.dn_cluster import ClusterSpec, running_cluster
from bench.harness import (
    DEFAULT_OUT,
    ROOT,
    load1,
    machine_info,
    only_workloads,
    self_cpu_s,
    stat_cpu_s,
)
from bench.profiling import py_spy
from squall.client import Client

# (category, pattern on the leaf's source line): a call into C named on the line decides
LINE_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("fsync", re.compile(r"fdatasync|fsync|\.sync\(")),
    ("LMDB commit (its writes and sync)", re.compile(r"txn\.commit\(")),
    ("LMDB", re.compile(r"\btxn\b|cursor|\.begin\(")),
    ("file writes (WAL)", re.compile(r"_os_write|os\.write|pwrite")),
    ("validation & serialisation", re.compile(
        r"orjson|msgpack|model_validate|model_dump|json\.|packb|unpackb|TypeAdapter")),
    ("checksums & copies", re.compile(
        r"crc32c|\.tobytes\(|bytes\(|memoryview\(|b[\"']{2}\.join")),
    ("auth (tokens, MACs)", re.compile(r"hmac|digest|compare_digest|b64")),
    ("HTTP stack", re.compile(r"\.send\(|sendall|\.recv|readinto|\.write\(|transport\.")),
]
# (category, pattern on the leaf's file): otherwise the module decides
FILE_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("HTTP stack", re.compile(
        r"^(uvicorn|httptools|h11|starlette|fastapi|anyio|httpx|httpcore|http/|email/|socket|"
        r"ssl|asyncio/(streams|selector_events|transports|sslproto))|common/(http|http1|"
        r"leanio|serving|layered)\.py|common/transport/|client/(_direct|_http)\.py|"
        r"datanode/(replication/)?peers\.py|master/http\.py")),
    ("validation & serialisation", re.compile(
        r"^(pydantic|pydantic_core|orjson|msgpack|json/|typing|enum|dataclasses)|"
        r"common/(models|payload)\.py")),
    ("auth (tokens, MACs)", re.compile(
        r"^(hmac|hashlib|base64|secrets)|common/(tokens|guard|auth|access)\.py|"
        r"master/security\.py")),
    ("checksums & copies", re.compile(r"common/checksum\.py|google_crc32c")),
    ("LMDB", re.compile(r"^lmdb|datanode/lmdbenv\.py")),
    ("garbage collection", re.compile(r"common/runtime\.py")),
    ("master: queues, WAL, placement", re.compile(r"^master/")),
    ("data node: store, front door", re.compile(r"^datanode/")),
    ("client library", re.compile(r"^client/")),
    ("event loop & thread hand-offs", re.compile(
        r"^(asyncio|concurrent|threading|queue|selectors|uvloop|contextvars|functools)")),
]
# a leaf that is a thread waiting, not working: uvloop's C loop (it shows as Runner.run),
# a blocking client's socket read (the sync client's threads waiting for an answer), ...
IDLE = re.compile(r"^(Runner\.run|Condition\.wait|Event\.wait|Queue\.get|Thread\.join|"
                  r"select|_worker|BaseSelectorEvent|SocketIO\.readinto)|"
                  r"^(SimpleQueue|Semaphore)\.")
IDLE_LINE = re.compile(r"\.get\((block=True)?\)|\.wait\(|sleep\(|\.acquire\(|select\(|"
                       r"\.join\(\)")
_NUMBERED = re.compile(r"[_-]?\d+$")  # pool threads: blob-read_0, blob-read_1 → blob-read
_FRAME = re.compile(r"^(?P<fn>.*) \((?P<file>.*?):(?P<line>\d+)\)$")
_SEARCH = [ROOT, Path(sysconfig.get_paths()["purelib"]), Path(sysconfig.get_paths()["stdlib"])]


def _source(file: str, line: int) -> str:
    for base in _SEARCH:
        p = base / file
        if p.is_file():
            return linecache.getline(str(p), line).split("#", 1)[0].strip()
    return ""


def classify(frames: list[str]) -> str | None:
    """The category of a sample (its frames, outermost first) by its innermost frame; None
    when the thread waits."""
    leaf = frames[-1]
    if any("importlib._bootstrap" in f for f in frames):
        return "process start-up (imports)"
    m = _FRAME.match(leaf)
    if m is None or leaf.startswith(("thread (", "process ")):
        return None  # no Python frame: a thread in C, waiting (a process's main thread)
    fn, file = m["fn"], m["file"].split("site-packages/")[-1]
    src = _source(file, int(m["line"]))
    if IDLE.match(fn) or IDLE_LINE.search(src):
        return None
    for cat, rx in LINE_RULES:
        if rx.search(src):
            return cat
    for cat, rx in FILE_RULES:
        if rx.search(file):
            return cat
    return "other"


def role_of(frames: list[str]) -> str:
    procs = [f for f in frames if f.startswith("process ")]
    cmd = procs[-1] if procs else ""
    return ("master" if "squall.master" in cmd else
            "data nodes" if "squall.datanode" in cmd else "clients")


def summarize(raw: Path, top: int = 8) -> dict[str, dict[str, Any]]:
    """Per process role: busy samples by category, and the busiest innermost functions."""
    cats: dict[str, Counter[str]] = {}
    leaves: dict[str, Counter[str]] = {}
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        cat = classify(frames)
        if cat is not None:
            role = role_of(frames)
            cats.setdefault(role, Counter())[cat] += int(n)
            m = _FRAME.match(frames[-1])
            fn = f"{m['fn']} ({m['file'].split('site-packages/')[-1]})" if m else frames[-1]
            leaves.setdefault(role, Counter())[fn] += int(n)
    return {r: {"categories": dict(c.most_common()),
                "functions": dict(leaves[r].most_common(top))} for r, c in sorted(cats.items())}


# -- CPU from /proc -------------------------------------------------------------------------
def thread_cpu(pids: dict[str, int]) -> dict[tuple[str, int], tuple[float, float, str]]:
    """(user s, system s, the OS's name) of every thread of the servers, by (role, id)."""
    out: dict[tuple[str, int], tuple[float, float, str]] = {}
    for name, pid in pids.items():
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                u, s = stat_cpu_s(f"/proc/{pid}/task/{tid}/stat")
                comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
                out[("master" if name == "master" else "data nodes", int(tid))] = (u, s, comm)
    return out


def thread_names(raw: Path) -> dict[int, str]:
    """Thread id → the Python thread's name, from py-spy's ``thread (tid): name`` frames."""
    names: dict[int, str] = {}
    for m in re.finditer(r"thread \((\d+)\): ([^;]+);", raw.read_text()):
        names[int(m[1])] = _NUMBERED.sub("", m[2])
    return names


def machine_idle() -> tuple[int, int]:
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return f[3] + f[4], sum(f)  # idle + iowait, total


# -- the workloads ----------------------------------------------------------------------------
def a_put(ctx: Ctx) -> tuple[int, float | None]:
    data = os.urandom(ctx.sizes.payload_bytes)
    with Client(ctx.cluster.url) as c:
        for _ in range(20):
            c.put("cp#a", data)
        c0 = self_cpu_s()
        for _ in range(ctx.sizes.a_tasks):
            c.put("cp#a", data)
        return ctx.sizes.a_tasks, self_cpu_s() - c0


def b_put(ctx: Ctx) -> tuple[int, float | None]:
    data = os.urandom(ctx.sizes.payload_bytes)
    with Client(ctx.cluster.url) as c:
        c.put_many("cp#b", [data] * 100, batch_size=100)
        c0 = self_cpu_s()
        n = c.put_many("cp#b", (data for _ in range(ctx.sizes.b_tasks)), batch_size=100)
        return n, self_cpu_s() - c0


def d_mixed(ctx: Ctx) -> tuple[int, float | None]:
    from bench.client_more import workload_d

    r = workload_d(ctx)[0]
    return r.n or 0, None if r.client_cpu_us_per_req is None else (
        r.client_cpu_us_per_req * (r.n or 0) / 1e6)


# the lease side: the tasks are put first (untimed, `_fill`), then consumed
def _fill(ctx: Ctx, q: str, n: int) -> None:
    with Client(ctx.cluster.url) as c:
        c.put_many(q, (os.urandom(ctx.sizes.payload_bytes) for _ in range(n + 20)),
                   batch_size=100)


def a_lease(ctx: Ctx) -> tuple[int, float | None]:
    """lease(1, payloads=True, done=previous), one at a time (``$BENCH_LEASE_VIA_NODE``:
    1 through a data node, 0 on the master, unset the client's default)."""
    via = os.environ.get("BENCH_LEASE_VIA_NODE")
    with Client(ctx.cluster.url, lease_via_node=None if via is None else via == "1") as c:
        held = c.lease("cp#l", 20, 600, payloads=True)
        c0, n = self_cpu_s(), 0
        while n < ctx.sizes.a_tasks:
            held = c.lease("cp#l", 1, 600, payloads=True, done=held)
            if not held:
                break
            held[0].payload()
            n += 1
        c.done(held)
        return n, self_cpu_s() - c0


def b_lease(ctx: Ctx) -> tuple[int, float | None]:
    """batches(100): two leases ahead, each acknowledging a batch."""
    via = os.environ.get("BENCH_LEASE_VIA_NODE")
    with Client(ctx.cluster.url, lease_via_node=None if via is None else via == "1") as c:
        c0, n = self_cpu_s(), 0
        with c.batches("cp#r", 100, 600) as batches:
            for batch in batches:
                n += sum(1 for t in batch if t.payload())
                if n >= ctx.sizes.b_tasks:
                    break
        return n, self_cpu_s() - c0


Prep = Callable[[Ctx], None]
# id, what, the loop, the py-spy run's size against the clean run's (B's loop is short),
# what to do before each run (untimed)
WORKLOADS: dict[str, tuple[str, str, Callable[[Ctx], tuple[int, float | None]], float,
                           Prep | None]] = {
    "A": ("A.put", "put(queue, 1 KiB), one at a time, one client", a_put, 1.0, None),
    "B": ("B.put", "put_many in batches of 100, 16 batches in flight", b_put, 4.0, None),
    "D": ("D.4p4w", "4 producer processes (put 1 at a time) + 4 Worker processes", d_mixed,
          0.5, None),
    "L": ("A.lease_done", "lease(1, payloads=True, done=previous), one at a time, one "
          "client", a_lease, 1.0, lambda ctx: _fill(ctx, "cp#l", ctx.sizes.a_tasks)),
    "R": ("B.lease_done", "batches(100): two leases ahead, each acknowledging a batch and "
          "reading its payloads", b_lease, 2.0,
          lambda ctx: _fill(ctx, "cp#r", ctx.sizes.b_tasks)),
}


def profile(ctx: Ctx, key: str, raw: Path, rate: int, spy_scale: float) -> dict[str, Any]:
    """A clean run (CPU per task, rate, idle time), then a smaller one under py-spy."""
    rid, what, fn, scale, prep = WORKLOADS[key]
    spy_scale *= scale
    pids = ctx.cluster.pids()
    if prep is not None:
        prep(ctx)
    cpu0, idle0, t0 = thread_cpu(pids), machine_idle(), time.perf_counter()
    n, client_cpu = fn(ctx)
    el, idle1, cpu1 = time.perf_counter() - t0, machine_idle(), thread_cpu(pids)
    z = ctx.sizes
    small = replace(z, a_tasks=int(z.a_tasks * spy_scale), b_tasks=int(z.b_tasks * spy_scale),
                    d_tasks=int(z.d_tasks * spy_scale))
    if prep is not None:
        prep(replace(ctx, sizes=small))
    with py_spy(raw, os.getpid(), rate, "--subprocesses", attach_s=1.5):
        fn(replace(ctx, sizes=small))
    names = thread_names(raw)
    per: dict[str, list[float]] = {}
    for (role, tid), (u, s, comm) in cpu1.items():
        u0, s0, _ = cpu0.get((role, tid), (0.0, 0.0, ""))
        k = f"{role}: {names.get(tid) or _NUMBERED.sub('', comm) + ' (never busy under py-spy)'}"
        acc = per.setdefault(k, [0.0, 0.0])
        acc[0] += 1e6 * (u - u0) / max(1, n)
        acc[1] += 1e6 * (s - s0) / max(1, n)
    cpu = {k: (round(u, 1), round(s, 1))
           for k, (u, s) in sorted(per.items(), key=lambda kv: -sum(kv[1])) if u + s >= 1}
    if client_cpu is not None:
        cpu["clients (user + system)"] = (round(1e6 * client_cpu / max(1, n), 1), 0.0)
    return {"id": rid, "what": what, "n": n, "rate": round(n / el, 1),
            "machine_idle_pct": round(100 * (idle1[0] - idle0[0]) /
                                      max(1, idle1[1] - idle0[1]), 1),
            "load1": load1(), "cpu_us_per_task": cpu, "spied_tasks": int(n * spy_scale),
            "samples": summarize(raw)}


# -- the report -------------------------------------------------------------------------------
def render(doc: dict[str, Any]) -> str:
    out = [f"# {TITLE}", "", f"{doc['date']}, commit {doc['commit']}; py-spy at {doc['rate']} Hz "
           "on a second, smaller run of each workload (it slows what it samples). How to read it: "
           "`bench/client_profile.py`; what bounds each target and the next step: "
           "`docs/decisions/0019-what-bounds-the-client-targets.md`.", ""]
    for w in doc["workloads"]:
        out += [f"## {w['id']}: {w['what']}", "",
                f"{w['n']:,} tasks at {w['rate']:,} /s without py-spy, the machine "
                f"{w['machine_idle_pct']} % idle (load {w['load1']}); then {w['spied_tasks']:,} "
                "under py-spy.", "",
                "CPU per task (µs; from `/proc`, each thread's user and system time; the "
                "clients' from `getrusage`, user and system together):", "",
                "| process/thread | user | system |", "|---|---:|---:|"]
        tot = [0.0, 0.0]
        for k, (u, s) in w["cpu_us_per_task"].items():
            out.append(f"| {k} | {u:,.1f} | {s:,.1f} |")
            tot = [tot[0] + u, tot[1] + s]
        out += [f"| **all** | **{tot[0]:,.1f}** | **{tot[1]:,.1f}** |", "",
                "Busy py-spy samples by category (% of each process role's busy samples):",
                ""]
        for role, got in w["samples"].items():
            busy = sum(got["categories"].values())
            parts = ", ".join(f"{c} {100 * v / busy:.0f} %" for c, v in got["categories"].items()
                              if 100 * v / busy >= 1)
            fns = ", ".join(f"`{f}` {100 * v / busy:.0f} %" for f, v in got["functions"].items())
            out += [f"- **{role}** ({busy:,} samples): {parts}.", f"  Busiest functions: {fns}."]
        out.append("")
    return "\n".join(out)


TITLE = "Where the missed client targets go (py-spy and /proc)"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.client_profile", description=__doc__
                                 .split("\n\n")[0])
    ap.add_argument("--only", default="A,B,D", help="workloads among A,B,D and the lease "
                    "side's L (A.lease_done) and R (B.lease_done)")
    ap.add_argument("--stem", default="client-profile", help="the result files' name")
    ap.add_argument("--quick", action="store_true", help="10x smaller counts (smoke run)")
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    ap.add_argument("--spy-scale", type=float, default=1.0,
                    help="scales the py-spy runs' sizes (1, 4 and 0.5 times the clean run's "
                         "for A, B and D)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--keep-raw", action="store_true", help="copy py-spy's raw stacks to --out")
    a = ap.parse_args(argv)
    a.only = only_workloads(ap, a.only, WORKLOADS)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    sizes = Sizes().quick() if a.quick else Sizes()
    tmp = Path(tempfile.mkdtemp(prefix="squall-cliprof-"))
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    doc: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                           "commit": commit, "rate": a.rate, "machine": machine_info(),
                           "workloads": []}
    a.out.mkdir(parents=True, exist_ok=True)
    try:
        with running_cluster(ClusterSpec(nodes=3, rf=2), tmp) as cl:
            ctx = Ctx(sizes, cl, False)
            for key in a.only:
                say(f"profiling {WORKLOADS[key][0]}")
                doc["workloads"].append(profile(ctx, key, tmp / f"{key}.raw", a.rate,
                                                  a.spy_scale))
                if a.keep_raw:
                    shutil.copy(tmp / f"{key}.raw", a.out / f"{key}.raw")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    stem = a.stem + ("-quick" if a.quick else "")
    (a.out / f"{stem}.json").write_bytes(orjson.dumps(doc, option=orjson.OPT_INDENT_2))
    (a.out / f"{stem}.md").write_text(render(doc))
    say(f"results in {a.out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
