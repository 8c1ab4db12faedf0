"""The benchmark harness shared by squall's benchmarks: measured loops, server
subprocesses, machine facts, result rows and the table / Markdown / JSON writers.

A benchmark module keeps its workloads, its CLI and its ``TARGETS`` (id -> (op, target));
the rows and writers here take the targets and the title as parameters. Profiling with
py-spy is in :mod:`bench.profiling`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

# every server a benchmark starts checks credentials under this auth key; clients send an
# admin credential (SQUALL_TOKEN), raw HTTP calls the AUTH headers
# (an Ed25519 private key for the master; data nodes get its public half)
os.environ.setdefault("SQUALL_AUTH_KEY",
                      "ed25519-private:YmVuY2gtYXV0aC1rZXktMDEyMzQ1Njc4OWFiY2RlZmc")
if not os.environ.get("SQUALL_AUTH_PUBLIC_KEY"):
    from squall.common.security.auth import parse_keys

    os.environ["SQUALL_AUTH_PUBLIC_KEY"] = parse_keys(
        os.environ["SQUALL_AUTH_KEY"].encode()).public_text().decode().strip()
if not os.environ.get("SQUALL_TOKEN"):
    from squall.common.security.auth import load_auth_keys, mint

    _keys = load_auth_keys()
    assert _keys is not None
    os.environ["SQUALL_TOKEN"] = mint(_keys, ["admin"], 30 * 86400.0, time.time())
AUTH = {"Authorization": f"Bearer {os.environ['SQUALL_TOKEN']}"}
ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results"
Targets = dict[str, tuple[str, float]]


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


def stat_cpu_s(path: str) -> tuple[float, float]:
    """(utime, stime) in seconds from a ``/proc/<pid>/stat`` or ``/proc/<pid>/task/<tid>/stat``
    file; OSError if the process or thread is gone."""
    with open(path) as f:
        stat = f.read()
    rest = stat[stat.rfind(")") + 2 :].split()
    hz = os.sysconf("SC_CLK_TCK")
    return int(rest[11]) / hz, int(rest[12]) / hz


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (0 if it is gone)."""
    try:
        return sum(stat_cpu_s(f"/proc/{pid}/stat"))
    except OSError:
        return 0.0


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
        with httpx.Client(timeout=5.0, headers=AUTH) as c:
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

    def judge(self, targets: Targets) -> Row:
        if self.id in targets:
            self.op, self.target = targets[self.id]
            self.passed = (self.value >= self.target if self.op == ">="
                           else self.value <= self.target)
            if self.errors or self.truncated:
                self.passed = False
        return self


def rate_row(rid: str, what: str, run: Run, unit: str, targets: Targets, per_item: bool = True,
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
    return row.judge(targets)


def timed_loop(limit_s: float, count: int, step: Any) -> tuple[list[float], int, float, bool]:
    """Call step(i) for i in range(count) until done or `limit_s`; (latencies, items, wall
    seconds, truncated). step returns the items it did (0: stop)."""
    lats: list[float] = []
    items = 0
    t0 = time.perf_counter()
    for i in range(count):
        s = time.perf_counter()
        k = step(i)
        e = time.perf_counter()
        if not k:
            break
        lats.append(e - s)
        items += k
        if e - t0 > limit_s:
            return lats, items, e - t0, True
    return lats, items, time.perf_counter() - t0, False


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


def results_doc(quick: bool, sizes: Any, targets: Any, **more: Any) -> dict[str, Any]:
    """The head of a benchmark's results document: date, mode, machine, sizes (a
    dataclass), targets, then `more` in its order."""
    return {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "mode": "quick" if quick else "full", "machine": machine_info(),
            "sizes": asdict(sizes), "targets": targets, **more}


def raise_priority(n: int, say: Callable[[str], object]) -> int:
    """``--nice N``: raise this process's priority by `n` (root only), inherited by the
    servers and clients it starts. The `n` applied: 0 when refused (said)."""
    if n:
        try:
            os.nice(-n)
        except OSError as e:
            say(f"--nice {n} not applied: {e}")
            return 0
    return n


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


# -- reading a server ---------------------------------------------------------------------
def get_json(url: str, path: str) -> dict[str, Any]:
    r = httpx.get(url + path, timeout=30.0, headers=AUTH)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def metrics_text(url: str) -> str:
    """A server's Prometheus metrics, as text."""
    return httpx.get(url + "/metrics", timeout=30.0, headers=AUTH).text


def metric(url: str, name: str) -> float:
    text = metrics_text(url)
    m = re.search(rf"^{name}(?:_total)? ([\d.e+]+)$", text, re.M)
    return float(m.group(1)) if m else -1.0


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


def print_table(rows: list[dict[str, Any]], title: str,
                columns: list[tuple[str, str]] = COLUMNS) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=title)
    for _, head in columns:
        t.add_column(head, justify="left" if head in ("id", "what", "unit") else "right")
    met = [k for k, _ in columns].index("passed")
    for r in rows:
        cells = [_target_text(r) if k == "target" else _fmt(r.get(k)) for k, _ in columns]
        if r.get("passed") is False:
            cells[met] = "[bold red]NO[/]"
        elif r.get("passed"):
            cells[met] = "[green]yes[/]"
        t.add_row(*cells)
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(t)


def render_md(doc: dict[str, Any], title: str, targets: Targets,
              columns: list[tuple[str, str]] = COLUMNS) -> str:
    """`title` is the heading (the mode is appended), `targets` the list at the end."""
    m = doc["machine"]
    lines = [f"# {title} ({doc['mode']})", "",
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
             "| " + " | ".join(h for _, h in columns) + " |",
             "|" + "|".join("---" for _ in columns) + "|"]
    for r in doc["rows"]:
        cells = [_target_text(r) if k == "target" else _fmt(r.get(k)) for k, _ in columns]
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    lines += ["", "Notes:", ""]
    lines += [f"- **{r['id']}**: {r['note']}" for r in doc["rows"] if r.get("note")]
    lines += ["", "Targets:", ""]
    lines += [f"- {k} {op} {v:,}" for k, (op, v) in targets.items()]
    if doc.get("profiles"):
        lines += ["", "Profiles (py-spy, busy samples by module of the innermost frame):", ""]
        for label, s in doc["profiles"].items():
            top = ", ".join(f"{n} {p}%" for n, p in s["busy_self_by_module_pct"][:8])
            lines.append(f"- {label} ({s['busy_samples']} busy of {s['samples']} samples): "
                         f"{top}")
    return "\n".join(lines) + "\n"


def _rank(rid: str, order: tuple[str, ...]) -> int:
    return next((i for i, w in enumerate(order) if rid.startswith(w)), len(order))


def write_results(out: Path, stem: str, doc: dict[str, Any], merge: bool, *, title: str,
                  targets: Targets, order: tuple[str, ...] = (),
                  columns: list[tuple[str, str]] = COLUMNS) -> None:
    """`<out>/<stem>.json` and `.md`. With `merge`, rows of workloads `doc` did not run are
    kept from the existing JSON, sorted by the workload order (ids start with its name)."""
    out.mkdir(parents=True, exist_ok=True)
    jpath = out / f"{stem}.json"
    if merge and jpath.exists():
        with contextlib.suppress(ValueError, KeyError):
            old = json.loads(jpath.read_text())
            done = {r["workload"] for r in doc["rows"]}
            kept = [r for r in old["rows"] if r["workload"] not in done]
            doc["rows"] = sorted(kept + doc["rows"],
                                 key=lambda r: _rank(r["id"], order))
            doc["profiles"] = {**old.get("profiles", {}), **doc.get("profiles", {})}
    jpath.write_text(json.dumps(doc, indent=2) + "\n")
    (out / f"{stem}.md").write_text(render_md(doc, title, targets, columns))



def only_workloads(ap: argparse.ArgumentParser, value: str, known: Iterable[str]) -> list[str]:
    """``--only A,b`` → ["A", "B"]; an unknown name is a usage error naming the known ones."""
    only, known = [w.strip().upper() for w in value.split(",") if w.strip()], list(known)
    if bad := [w for w in only if w not in known]:
        ap.error(f"unknown workload(s) {bad}; choose among {','.join(known)}")
    return only


def exit_code(doc: dict[str, Any], argv: list[str] | None) -> int:
    """1 when a request failed or a loop was cut short (with --strict: also a missed target)."""
    strict = "--strict" in (sys.argv[1:] if argv is None else argv)
    failed = any(r.get("errors") or r.get("truncated") for r in doc["rows"])
    missed = any(r.get("passed") is False for r in doc["rows"])
    return 1 if failed or (strict and missed) else 0
