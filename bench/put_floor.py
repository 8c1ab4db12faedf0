"""The floor of a put's shape: one put at a time through three bare Python services.

``python -m bench.put_floor [--tasks N] [--rounds R]`` (``make bench-floor``) measures what
A.put of the small-task benchmark (one ``put`` per call, one client, 1 KiB) could reach if
squall did no work of its own: three bare uvicorn servers (uvloop, httptools, a raw ASGI
app: no framework, no routing, no credentials, no LMDB), each writing the body into a
zero-filled file and ``fdatasync``-ing it, wired in the shapes of squall's front door:

- ``floor.serial``: client -> front [its write || forward to the peer (its write)], then
  the commit to the "master" (its write) -> answer (squall's default path);
- ``floor.parallel``: the forward and the commit sent together (decision 0028's shape).

In the same run, alternating with the floor: squall's A.put itself (a master and 3 data
nodes, RF 2, fsync on) on both paths, and PostgreSQL's (one INSERT per transaction, fsync
on; ``bench/pg_baseline.py``). Every rate is also a ratio to PostgreSQL, and every row has
the CPU per put of each process. Client and node-side requests of the floor go through
squall's own HTTP engine (``common/transport``), as squall's do.

Results: ``bench/results/put-floor.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench import pg_baseline as pgb
from bench.dn_cluster import ClusterSpec, running_cluster
from bench.harness import DEFAULT_OUT, free_port, load1, machine_info, proc_cpu_s, self_cpu_s

PREFILL = 64 << 20  # zeros written ahead, as the master's WAL does (decision 0007)
TARGET = 0.2  # A.put's target, as a ratio to PostgreSQL
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


# -- the bare services ----------------------------------------------------------------------
def serve(role: str, port: int, peer: int, master: int, path: str) -> None:
    """One bare service: `front` (stores, forwards to `peer`, commits to `master`), or
    `store` (the peer and the master alike: write, fdatasync, answer)."""
    import uvicorn

    from squall.common.transport.aio import Pool

    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, bytes(PREFILL))
    os.fsync(fd)
    at = [0]
    disk = ThreadPoolExecutor(1)  # the writer thread (LMDB writer, WAL commit thread)
    pool = Pool()

    def durable(body: bytes) -> None:
        os.pwrite(fd, body, at[0] % PREFILL)
        at[0] += len(body)
        os.fdatasync(fd)

    async def call(to: int, body: bytes) -> None:
        r = await pool.request(("http", "127.0.0.1", to), "POST", "/",
                               [("host", f"127.0.0.1:{to}")], body)
        await r.read()
        r.release()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        parts = []
        while True:
            m = await receive()
            parts.append(m.get("body", b""))
            if not m.get("more_body"):
                break
        body = b"".join(parts)
        loop = asyncio.get_running_loop()
        stored = loop.run_in_executor(disk, durable, body)
        if role == "front" and scope["path"] == "/parallel":
            await asyncio.gather(stored, call(peer, body), call(master, b'{"commit":1}'))
        elif role == "front":
            await asyncio.gather(stored, call(peer, body))
            await call(master, b'{"commit":1}')
        else:
            await stored
        out = b'{"ok":true}'
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(out)).encode())]})
        await send({"type": "http.response.body", "body": out})

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools",
                access_log=False, log_level="warning")


@dataclass
class Floor:
    port: int
    pids: dict[str, int]


@contextmanager
def bare_services(tmp: Path) -> Iterator[Floor]:
    front, peer, master = free_port(), free_port(), free_port()
    me = [sys.executable, "-m", "bench.put_floor", "--serve"]
    argv = {"master": ["store", str(master), "0", "0", str(tmp / "m")],
            "peer": ["store", str(peer), "0", "0", str(tmp / "p")],
            "front": ["front", str(front), str(peer), str(master), str(tmp / "f")]}
    with open(tmp / "floor.log", "ab") as log:  # the servers' output (start-up refusals)
        procs = {k: subprocess.Popen([*me, *v], stdout=log, stderr=log)
                 for k, v in argv.items()}
        try:
            yield Floor(front, {k: p.pid for k, p in procs.items()})
        finally:
            for p in procs.values():
                p.terminate()
            for p in procs.values():
                p.wait(30)


# -- measuring -----------------------------------------------------------------------------
@dataclass
class Row:
    name: str
    rates: list[float] = field(default_factory=list)
    cpu_us: list[dict[str, int]] = field(default_factory=list)  # per put, by process

    @property
    def best(self) -> float:
        return max(self.rates, default=0.0)


def timed(n: int, put: Callable[[], object], pids: dict[str, int]
          ) -> tuple[float, dict[str, int]]:
    """`n` calls of `put` in series: the rate, and the CPU per call (µs) of each process."""
    c0 = {k: proc_cpu_s(p) for k, p in pids.items()}
    me0, t0 = self_cpu_s(), time.perf_counter()
    for _ in range(n):
        put()
    el = time.perf_counter() - t0
    cpu = {k: round(1e6 * (proc_cpu_s(p) - c0[k]) / n) for k, p in pids.items()}
    cpu["client"] = round(1e6 * (self_cpu_s() - me0) / n)
    return n / el, cpu


def floor_round(tmp: Path, n: int, rows: dict[str, Row], data: bytes) -> None:
    from squall.common.transport.sync import Pool

    pool = Pool()
    with bare_services(tmp) as fl:
        key = ("http", "127.0.0.1", fl.port)

        def put(path: str) -> Callable[[], None]:
            def one() -> None:
                r = pool.request(key, "POST", path, [("host", f"127.0.0.1:{fl.port}")], data)
                r.read()
                r.release()
            return one

        deadline = time.monotonic() + 60
        while True:  # the three services are up once a put goes through
            try:
                put("/")()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        for path, name in (("/", "floor.serial"), ("/parallel", "floor.parallel")):
            for _ in range(200):  # warm-up
                put(path)()
            rate, cpu = timed(n, put(path), fl.pids)
            rows[name].rates.append(rate)
            rows[name].cpu_us.append(cpu)
    pool.close()


def squall_round(tmp: Path, n: int, rows: dict[str, Row], data: bytes) -> None:
    from squall.client import Client

    for parallel, name in ((False, "squall.serial"), (True, "squall.parallel")):
        os.environ["SQUALL_FRONT_DOOR_PARALLEL"] = "1" if parallel else "0"
        with tempfile.TemporaryDirectory(dir=tmp) as d, \
                running_cluster(ClusterSpec(nodes=3, rf=2), Path(d)) as cl, \
                Client(cl.url) as c:
            for _ in range(200):
                c.put("floor#a", data)
            rate, cpu = timed(n, lambda: c.put("floor#a", data), cl.pids())
            rows[name].rates.append(rate)
            rows[name].cpu_us.append(cpu)
    os.environ.pop("SQUALL_FRONT_DOOR_PARALLEL", None)


def pg_round(n: int, rows: dict[str, Row], data: bytes, pg: pgb.Postgres) -> None:
    m = pgb.put_one(pg, "floor", n, data, 600.0)
    rows["postgresql"].rates.append(m.rate)
    rows["postgresql"].cpu_us.append({"server": round(1e6 * m.server_cpu_s / max(1, m.n)),
                                      "client": round(1e6 * m.client_cpu_s / max(1, m.n))})


# -- the report ----------------------------------------------------------------------------
SHAPES = {
    "postgresql": "PostgreSQL: one INSERT per transaction",
    "floor.serial": "bare shape, serial: store and forward, then commit",
    "floor.parallel": "bare shape, parallel: store, forward and commit together",
    "squall.serial": "squall A.put, the serial front door (the default)",
    "squall.parallel": "squall A.put, the parallel put (SQUALL_FRONT_DOOR_PARALLEL=1; "
                       "auto takes it for a lone client)",
}


def render(doc: dict[str, Any]) -> str:
    pg = doc["rows"]["postgresql"]["best"] or None
    m = doc["machine"]
    out = [f"# The floor of a put's shape\n\n{doc['date']}, commit {doc['commit']}, "
           f"{m.get('cpu', '?')}, {m.get('nproc', '?')} cores, fdatasync p50 "
           f"{m.get('fdatasync_ms', {}).get('p50', '?')} ms, "
           f"load {doc['load_start']} at the start. "
           f"`python -m bench.put_floor --tasks {doc['tasks']} --rounds {doc['rounds']}`: "
           "one put of 1 KiB at a time, one client; each round runs every row once. What "
           "the rows are: the module's docstring.\n",
           "| row | puts/s, best (each round) | / PostgreSQL (A.put target 0.2) "
           "| CPU per put, µs (median round) |",
           "|---|---|---:|---|"]
    for name, label in SHAPES.items():
        r = doc["rows"][name]
        each = ", ".join(f"{x:,.0f}" for x in r["rates"])
        ratio = f"{r['best'] / pg:.2f}" if pg else "-"
        cpus = r["cpu_us"]
        mid = cpus[len(cpus) // 2] if cpus else {}
        cpu = ", ".join(f"{k} {v:,}" for k, v in mid.items())
        cpu += f"; all {sum(mid.values()):,}" if mid else ""
        out.append(f"| {label} | {r['best']:,.0f} ({each}) | {ratio} | {cpu} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        role, port, peer, master, path = argv[1:6]
        serve(role, int(port), int(peer), int(master), path)
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.put_floor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", type=int, default=3000, help="puts per row and round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    if not 1 <= a.tasks <= 100_000 or not 1 <= a.rounds <= 10:
        ap.error("--tasks 1..100000, --rounds 1..10")
    data = os.urandom(1024)
    rows = {name: Row(name) for name in SHAPES}
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip() or "unknown"
    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "commit": commit, "machine": machine_info(), "load_start": load1(),
                           "tasks": a.tasks, "rounds": a.rounds}
    with tempfile.TemporaryDirectory(prefix="squall-floor-") as t, \
            pgb.running_postgres() as pg:
        tmp = Path(t)
        for k in range(a.rounds):
            print(f"round {k + 1}/{a.rounds}", flush=True)
            pg_round(a.tasks, rows, data, pg)
            floor_round(tmp, a.tasks, rows, data)
            squall_round(tmp, a.tasks, rows, data)
    doc["rows"] = {k: {**asdict(r), "best": round(r.best, 1)} for k, r in rows.items()}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "put-floor.json").write_text(json.dumps(doc, indent=1) + "\n")
    text = render(doc)
    (a.out / "put-floor.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
