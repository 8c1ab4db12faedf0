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
- E     recovery: 900k tasks in big batches, a checkpoint (clean SIGTERM: the master syncs
        LMDB on close), ~100k single-task WAL records after it, SIGKILL; then the time from
        process start to the first successful real request, twice: after the SIGKILL as is
        (a process crash: the page cache keeps LMDB's unsynced writes), and with LMDB rolled
        back to the checkpoint (what a machine crash can leave), so that ~100k records are
        replayed.

Every loop is bounded in count and in time. Results: a rich table on stdout and
``<out>/master.json`` + ``<out>/master.md`` (``master-quick.*`` for ``--quick``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing as mp
import os
import platform
import re
import resource
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results"
GROUP = "bench"
JSON_H = {"content-type": "application/json"}
WORKLOADS = ("A", "B", "E")
RECOVERED_RE = re.compile(r"recovered: (\d+) WAL records replayed in ([\d.]+)s")

# id -> (comparison, target, what the figure is compared with)
TARGETS: dict[str, tuple[str, float]] = {
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


# -- measurements -------------------------------------------------------------------------
@dataclass
class Run:
    """One measured loop: items done, wall time, per-request (or per-pair) latencies."""

    reqs: int = 0
    items: int = 0
    elapsed: float = 0.0
    lats: list[float] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=dict)
    errors: int = 0
    first_error: str = ""
    truncated: bool = False
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def ok(self, k: int, lat: float) -> None:
        self.reqs += 1
        self.items += k
        self.lats.append(lat)

    def fail(self, what: str) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = what[:300]

    @property
    def rate(self) -> float:
        return self.items / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def req_rate(self) -> float:
        return self.reqs / self.elapsed if self.elapsed > 0 else 0.0


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 3)


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0.0
    rest = stat[stat.rfind(")") + 2 :].split()
    return (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")


def self_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


@contextlib.contextmanager
def metered(run: Run, server_pid: int | None) -> Iterator[None]:
    """Server and client CPU seconds spent while the block runs."""
    s0 = proc_cpu_s(server_pid) if server_pid else 0.0
    c0 = self_cpu_s()
    try:
        yield
    finally:
        run.server_cpu_s = (proc_cpu_s(server_pid) - s0) if server_pid else 0.0
        run.client_cpu_s = self_cpu_s() - c0


def load1() -> float:
    return round(os.getloadavg()[0], 2)


# -- server processes ---------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A server subprocess (a master or the baseline app) on 127.0.0.1."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name, self.argv, self.log_path = name, argv, log_path
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.t_start = 0.0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Server:
        self.port = free_port()
        argv = [a.replace("{port}", str(self.port)) for a in self.argv]
        with open(self.log_path, "ab") as log:
            self.t_start = time.perf_counter()
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
        return self

    def wait_serving(self, path: str = "/readyz", timeout: float = 60.0) -> float:
        """Poll GET `path` until it answers 200; seconds since the process was started."""
        assert self.proc is not None
        deadline = self.t_start + timeout
        with httpx.Client(timeout=5.0) as c:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; "
                                       f"see {self.log_path}")
                with contextlib.suppress(httpx.TransportError):
                    if c.get(self.url + path).status_code == 200:
                        return time.perf_counter() - self.t_start
                if time.perf_counter() > deadline:
                    raise TimeoutError(f"{self.name} not serving {path} after {timeout}s; "
                                       f"see {self.log_path}")
                time.sleep(0.002)

    def terminate(self, timeout: float = 120.0) -> int | None:
        """SIGTERM (a clean shutdown: the master flushes the WAL and syncs LMDB)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill9()
            return None

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)


def master_server(data_dir: Path, logs: Path, name: str, extra: tuple[str, ...] = ()) -> Server:
    argv = [sys.executable, "-m", "squall.master", "--data-dir", str(data_dir),
            "--port", "{port}", "--fsync", *extra]
    return Server(name, argv, logs / f"{name}.log")


def baseline_server(mode: str, logs: Path) -> Server:
    argv = [sys.executable, "-m", "bench.bare_app", "--port", "{port}", "--mode", mode]
    return Server(f"baseline-{mode}", argv, logs / f"baseline-{mode}.log")


@contextlib.contextmanager
def running(server: Server, timeout: float = 60.0) -> Iterator[Server]:
    server.start()
    try:
        server.wait_serving(timeout=timeout)
        yield server
    finally:
        server.terminate()


# -- optional profiling (py-spy) -----------------------------------------------------------
class Profiler:
    """`py-spy record` on the server during measured loops; raw collapsed stacks."""

    def __init__(self, out_dir: Path | None) -> None:
        self.out_dir = out_dir
        self.summaries: dict[str, dict[str, Any]] = {}

    @contextlib.contextmanager
    def record(self, label: str, pid: int) -> Iterator[None]:
        if self.out_dir is None:
            yield
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        out = self.out_dir / f"{label}.txt"
        spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
        p = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "100", "--format",
                              "raw", "--threads", "-o", str(out)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # let py-spy attach
        try:
            yield
        finally:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
            if out.exists():
                self.summaries[label] = summarize_profile(out)


def _frame_module(frame: str) -> str:
    """'func (path:line)' -> squall.master.wal for squall, else the top-level package."""
    m = re.search(r"\((.*?):\d+\)$", frame)
    path = (m.group(1) if m else frame).split("site-packages/")[-1]
    if "/squall/" in "/" + path:
        return "squall." + path.split("squall/", 1)[1].removesuffix(".py").replace("/", ".")
    if path.startswith(str(ROOT)):
        return "squall." + path[len(str(ROOT)) + 1 :].removesuffix(".py").replace("/", ".")
    return path.split("/", 1)[0].removesuffix(".py")


# leaf frames that are a thread waiting (uvloop's C loop shows as Runner.run)
IDLE_LEAVES = ("Runner.run (", "Condition.wait (", "Queue.get (", "Event.wait (",
               "select (", "Thread.join (")


# functions whose inclusive share is reported: where a request's time goes
WATCH = frozenset((
    "RequestResponseCycle.run_asgi", "HttpToolsProtocol.data_received",
    "RequestResponseCycle.send", "solve_dependencies", "run_in_threadpool",
    "request_body_to_args", "request_params_to_args", "Request.json", "Request.body",
    "run_endpoint_function", "Master._execute", "Engine.plan_enqueue", "Engine.plan_update",
    "Engine.plan_lease", "Engine.sweep", "Engine.apply", "apply", "Index.put_task",
    "Index.delete_task", "WAL.append", "WAL.durable", "WAL._write", "WAL._run", "JSON.render",
))


def summarize_profile(path: Path, top: int = 12) -> dict[str, Any]:
    """Per thread: samples; busy samples (leaf not a wait) by module of the innermost frame,
    and by function inclusive. Busy excludes uvloop's own C work (it shows as Runner.run)."""
    self_by_mod: Counter[str] = Counter()
    incl_by_fn: Counter[str] = Counter()
    by_thread: Counter[str] = Counter()
    total = busy = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        k = int(n)
        frames = stack.split(";")
        thread = "?"
        if frames[0].startswith("thread ("):
            thread = frames[0].split(": ", 1)[-1]
            frames = frames[1:]
        total += k
        idle = not frames or frames[-1].startswith(IDLE_LEAVES)
        by_thread[f"{thread} {'idle' if idle else 'busy'}"] += k
        if idle:
            continue
        busy += k
        self_by_mod[_frame_module(frames[-1])] += k
        for fn in {f.split(" (", 1)[0] for f in frames}:
            if fn in WATCH:
                incl_by_fn[fn] += k

    def share(c: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(100 * v / max(1, busy), 1)) for name, v in c.most_common(top)]

    return {"samples": total, "busy_samples": busy, "by_thread": dict(by_thread),
            "busy_self_by_module_pct": share(self_by_mod),
            "busy_inclusive_by_function_pct": share(incl_by_fn)}


# -- clients -------------------------------------------------------------------------------
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
    with httpx.Client(base_url=url, timeout=60.0) as c:
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


# -- results -------------------------------------------------------------------------------
@dataclass
class Row:
    id: str
    workload: str
    what: str
    value: float
    unit: str
    n: int = 0
    elapsed_s: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    target: float | None = None
    op: str = ""
    passed: bool | None = None
    baseline: float | None = None
    vs_baseline: float | None = None
    server_cpu_pct: float | None = None
    server_cpu_us_per_req: float | None = None
    client_cpu_pct: float | None = None
    client_cpu_us_per_req: float | None = None
    load1: float = 0.0
    fsync_ms: float | None = None
    errors: int = 0
    truncated: bool = False
    note: str = ""
    date: str = ""

    def judge(self) -> Row:
        if self.id in TARGETS:
            self.op, self.target = TARGETS[self.id]
            self.passed = (self.value >= self.target if self.op == ">="
                           else self.value <= self.target)
            if self.errors or self.truncated:
                self.passed = False
        return self


def rate_row(rid: str, what: str, run: Run, unit: str, per_item: bool = True,
             baseline: float | None = None, note: str = "") -> Row:
    value = run.rate if per_item else run.req_rate
    row = Row(rid, rid.split(".")[0], what, round(value, 1), unit, n=run.items,
              elapsed_s=round(run.elapsed, 3), p50_ms=ms(pct(run.lats, 50)),
              p99_ms=ms(pct(run.lats, 99)), load1=load1(), errors=run.errors,
              truncated=run.truncated, note=note)
    if run.errors:
        row.note = (row.note + f" first error: {run.first_error}").strip()
    if baseline:
        row.baseline = round(baseline, 1)
        row.vs_baseline = round(value / baseline, 3)
    if run.elapsed > 0 and run.server_cpu_s:
        row.server_cpu_pct = round(100 * run.server_cpu_s / run.elapsed, 1)
        row.server_cpu_us_per_req = round(1e6 * run.server_cpu_s / max(1, run.reqs), 1)
    if run.elapsed > 0 and run.client_cpu_s:
        row.client_cpu_pct = round(100 * run.client_cpu_s / run.elapsed, 1)
        row.client_cpu_us_per_req = round(1e6 * run.client_cpu_s / max(1, run.reqs), 1)
    return row.judge()


def machine_info() -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    versions = {}
    for pkg in ("fastapi", "starlette", "uvicorn", "uvloop", "httptools", "pydantic", "httpx",
                "lmdb", "orjson", "msgpack"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions[pkg] = version(pkg)
    commit = ""
    with contextlib.suppress(Exception):
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "master", "common"],
                               cwd=ROOT, capture_output=True, text=True, timeout=5).stdout
        commit += "+dirty" if dirty.strip() else ""
    code = ""
    with contextlib.suppress(Exception):
        import squall.master

        code = str(Path(squall.master.__file__).parent)
    if code and not code.startswith(str(ROOT)):  # e.g. PYTHONPATH=<an export of a commit>
        commit = commit.removesuffix("+dirty") + " (working tree not used)"
    return {"nproc": os.cpu_count(), "cpus_usable": len(os.sched_getaffinity(0)),
            "squall_master_from": code, "cpu": cpu, "mem_gb": round(mem_gb, 1),
            "python": platform.python_version(),
            "platform": platform.platform(), "packages": versions, "commit": commit,
            "fdatasync_ms": fdatasync_latency(), "load_at_start": list(os.getloadavg())}


def fdatasync_latency(n: int = 200) -> dict[str, float | None]:
    """p50/p99 of a 100-byte append + fdatasync in the temp dir (the WAL's floor)."""
    fd, path = tempfile.mkstemp(prefix="squall-bench-fsync-")
    lats = []
    try:
        for _ in range(n):
            os.write(fd, b"x" * 100)
            s = time.perf_counter()
            os.fdatasync(fd)
            lats.append(time.perf_counter() - s)
    finally:
        os.close(fd)
        os.unlink(path)
    return {"p50": ms(pct(lats, 50)), "p99": ms(pct(lats, 99))}


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
    with httpx.Client(base_url=server.url, timeout=60.0) as c:
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
    with httpx.Client(base_url=server.url, timeout=60.0) as c:
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


def _get_json(url: str, path: str) -> dict[str, Any]:
    r = httpx.get(url + path, timeout=30.0)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def _metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30.0).text
    m = re.search(rf"^{name}(?:_total)? ([\d.e+]+)$", text, re.M)
    return float(m.group(1)) if m else -1.0


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
        ready = _get_json(srv.url, "/readyz")
        stats = _get_json(srv.url, f"/v1/groups/{GROUP}/queues/e")
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
        with httpx.Client(base_url=srv.url, timeout=120.0) as c:
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
        ready = _get_json(srv.url, "/readyz")
        clean_replayed = _replayed(srv.log_path)
        ticket0 = ready["ticket"]
        tail = multi_enqueue(srv.url, "e", "T", z.e_tail, z.procs, z.threads, z.loop_limit_s,
                             server_pid=srv.pid)
        ticket1 = _get_json(srv.url, "/readyz")["ticket"]
        checkpoints = _metric(srv.url, "squall_checkpoints")
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
                  errors=0 if res["tasks_ok"] else 1).judge()
        rows.append(row)
    return rows


RUNNERS = {"A": workload_a, "B": workload_b, "E": workload_e}


# -- output --------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:,.3f}" if abs(v) < 10 else f"{v:,.0f}"
    return str(v)


COLUMNS = [("id", "id"), ("what", "what"), ("value", "value"), ("unit", "unit"),
           ("target", "target"), ("passed", "met"), ("p50_ms", "p50 ms"),
           ("p99_ms", "p99 ms"), ("vs_baseline", "x bare"), ("server_cpu_pct", "srv CPU%"),
           ("server_cpu_us_per_req", "srv us/req"), ("client_cpu_us_per_req", "cli us/req"),
           ("load1", "load"), ("fsync_ms", "fsync ms")]


def _target_text(r: dict[str, Any]) -> str:
    return f"{r['op']} {_fmt(r['target'])}" if r.get("target") is not None else ""


def print_table(rows: list[dict[str, Any]], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for _, head in COLUMNS:
        t.add_column(head, justify="left" if head in ("id", "what", "unit") else "right")
    for r in rows:
        cells = [_target_text(r) if k == "target" else _fmt(r.get(k)) for k, _ in COLUMNS]
        if r.get("passed") is False:
            cells[5] = "[bold red]NO[/]"
        elif r.get("passed"):
            cells[5] = "[green]yes[/]"
        t.add_row(*cells)
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(t)


def render_md(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [f"# squall master benchmark ({doc['mode']})", "",
             f"- date: {doc['date']}",
             f"- machine: nproc {m['nproc']} ({m['cpus_usable']} usable), {m['cpu']}, "
             f"{m['mem_gb']} GB RAM; {m['platform']}",
             f"- python {m['python']}; " + ", ".join(f"{k} {v}" for k, v in
                                                   m["packages"].items()),
             f"- commit {m['commit']} (squall.master from {m.get('squall_master_from')}); "
             f"fdatasync of 100 B in the temp dir: p50 "
             f"{m['fdatasync_ms']['p50']} ms, p99 {m['fdatasync_ms']['p99']} ms",
             f"- load average at start: {', '.join(f'{x:.2f}' for x in m['load_at_start'])} "
             "(the `load` column is the 1-minute load after each figure, `fsync ms` the "
             "p50 of a 100-byte fdatasync just before its workload; the machine and its disk "
             "are shared, so figures are noisy)",
             f"- benchmark niceness {doc.get('nice', 0)} (servers and clients); sizes: "
             + ", ".join(f"{k}={v}" for k, v in doc["sizes"].items()), "",
             "| " + " | ".join(h for _, h in COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in doc["rows"]:
        cells = [_target_text(r) if k == "target" else _fmt(r.get(k)) for k, _ in COLUMNS]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    lines += ["", "Notes:", ""]
    lines += [f"- **{r['id']}**: {r['note']}" for r in doc["rows"] if r.get("note")]
    lines += ["", "Targets:", ""]
    lines += [f"- {k} {op} {v:,}" for k, (op, v) in TARGETS.items()]
    if doc.get("profiles"):
        lines += ["", "Profiles (py-spy, busy samples by module of the innermost frame):", ""]
        for label, s in doc["profiles"].items():
            top = ", ".join(f"{n} {p}%" for n, p in s["busy_self_by_module_pct"][:8])
            lines.append(f"- {label} ({s['busy_samples']} busy of {s['samples']} samples): "
                         f"{top}")
    return "\n".join(lines) + "\n"


def write_results(out: Path, stem: str, doc: dict[str, Any], merge: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    jpath = out / f"{stem}.json"
    if merge and jpath.exists():
        with contextlib.suppress(ValueError, KeyError):
            old = json.loads(jpath.read_text())
            done = {r["workload"] for r in doc["rows"]}
            kept = [r for r in old["rows"] if r["workload"] not in done]
            doc["rows"] = sorted(kept + doc["rows"],
                                 key=lambda r: (WORKLOADS.index(r["id"][0]), 0))
            doc["profiles"] = {**old.get("profiles", {}), **doc.get("profiles", {})}
    jpath.write_text(json.dumps(doc, indent=2) + "\n")
    (out / f"{stem}.md").write_text(render_md(doc))


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
    a.only = [w.strip().upper() for w in a.only.split(",") if w.strip()]
    bad = [w for w in a.only if w not in WORKLOADS]
    if bad:
        ap.error(f"unknown workload(s) {bad}; choose among {','.join(WORKLOADS)}")
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

    if a.nice:
        try:
            os.nice(-a.nice)  # inherited by the servers and client processes started below
        except OSError as e:
            say(f"--nice {a.nice} not applied: {e}")
            a.nice = 0
    tmp = Path(tempfile.mkdtemp(prefix="squall-bench-"))
    logs = tmp / "logs"
    logs.mkdir()
    prof = Profiler(a.out / "profiles" if a.profile else None)
    ctx = Ctx(sizes, tmp, logs, prof, say)
    doc: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                           "mode": "quick" if a.quick else "full", "machine": machine_info(),
                           "sizes": asdict(sizes), "targets": TARGETS, "nice": -a.nice,
                           "rows": []}
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
    print_table(doc["rows"], f"squall master benchmark ({doc['mode']}, {doc['date']})")
    write_results(a.out, stem, doc, merge=set(a.only) != set(WORKLOADS))
    say(f"results in {a.out / stem}.json and .md")
    return doc


def main(argv: list[str] | None = None) -> int:
    """Exit 1 when a request failed or data was lost (with --strict: also a missed target)."""
    strict = "--strict" in (sys.argv[1:] if argv is None else argv)
    doc = run(argv)
    failed = any(r.get("errors") or r.get("truncated") for r in doc["rows"])
    missed = any(r.get("passed") is False for r in doc["rows"])
    return 1 if failed or (strict and missed) else 0


if __name__ == "__main__":
    sys.exit(main())
