"""PostgreSQL as a task queue, the baseline of the small-task benchmark
(``bench/small_tasks.py``).

A throwaway server (Debian's ``postgresql`` package: ``initdb`` and ``postgres`` from
``$PATH`` or ``/usr/lib/postgresql/<v>/bin``) in a temporary directory, listening on a
unix socket only, with fsync on and ``synchronous_commit = on`` (its defaults: a commit
answers once its WAL is flushed). As root the server runs as the ``postgres`` user (it
refuses to run as root). Clients use psycopg 3, one connection each, autocommit: every
call is one transaction.

The queue is one table; a lease is the usual ``FOR UPDATE SKIP LOCKED`` update that sets
a lease deadline, ``done`` deletes:

- put:   ``INSERT`` one row (A), or 100 rows in one statement (B);
- lease: ``UPDATE tasks SET lease_until = now() + lease, attempts = attempts + 1 WHERE id
  IN (SELECT id ... WHERE queue = $1 AND lease_until < now() ORDER BY id LIMIT n FOR
  UPDATE SKIP LOCKED) RETURNING id, payload``;
- done:  ``DELETE ... WHERE id = ANY($1)``.

``python -m bench.pg_baseline [--quick]`` runs the workloads alone and prints them.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import multiprocessing as mp
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import timed_loop

SCHEMA = """
CREATE TABLE tasks (
    id          bigserial PRIMARY KEY,
    queue       text NOT NULL,
    payload     bytea NOT NULL,
    lease_until timestamptz NOT NULL DEFAULT '-infinity',
    attempts    int NOT NULL DEFAULT 0
);
CREATE INDEX tasks_queue_id ON tasks (queue, id);
"""
PUT1 = "INSERT INTO tasks (queue, payload) VALUES (%s, %s)"
PUTN = "INSERT INTO tasks (queue, payload) SELECT %s, p FROM unnest(%s::bytea[]) AS p"
LEASE = """
UPDATE tasks SET lease_until = now() + make_interval(secs => %s), attempts = attempts + 1
WHERE id IN (SELECT id FROM tasks WHERE queue = %s AND lease_until < now()
             ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED)
RETURNING id, payload
"""
DONE = "DELETE FROM tasks WHERE id = ANY(%s)"
LEASE_S = 600


def binaries() -> Path | None:
    """The directory holding ``initdb`` and ``postgres``, or None."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(found).resolve().parent
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if os.access(os.path.join(d, "initdb"), os.X_OK):
            return Path(d)
    return None


def unavailable() -> str:
    """Why the baseline cannot run here ('' when it can)."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[dev]')"
    if binaries() is None:
        return "no PostgreSQL server binaries (apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the server as"
    return ""


@dataclass
class Postgres:
    """A running throwaway server; ``conninfo`` for psycopg."""

    tmp: Path
    proc: subprocess.Popen[bytes] | None = None
    user: str = field(default_factory=lambda: pwd.getpwuid(os.geteuid()).pw_name)

    @property
    def conninfo(self) -> str:
        return f"host={self.tmp} port=5432 dbname=postgres user={self.user}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_s(self) -> float:
        """CPU seconds of the server: the postmaster (with its reaped children) and its
        live children (one backend per connection, the WAL writer, the checkpointer...)."""
        total = 0.0
        hz = os.sysconf("SC_CLK_TCK")
        for p in os.listdir("/proc"):
            if not p.isdigit():
                continue
            try:
                with open(f"/proc/{p}/stat") as f:
                    st = f.read()
            except OSError:
                continue
            rest = st[st.rfind(")") + 2:].split()
            pid, ppid = int(p), int(rest[1])
            if pid == self.pid:
                total += sum(int(x) for x in rest[11:15]) / hz  # utime stime cutime cstime
            elif ppid == self.pid:
                total += (int(rest[11]) + int(rest[12])) / hz
        return total


def _as_server_user(argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
    if os.geteuid() == 0:
        kw["user"], kw["group"] = "postgres", "postgres"
        kw["extra_groups"] = []
    return subprocess.Popen(argv, **kw)


@contextlib.contextmanager
def running_postgres(timeout: float = 60.0) -> Iterator[Postgres]:
    """Start a throwaway server with the schema; stop it and delete its files after."""
    why = unavailable()
    if why:
        raise RuntimeError(why)
    import psycopg

    bin_dir = binaries()
    assert bin_dir is not None
    tmp = Path(tempfile.mkdtemp(prefix="squall-pg-"))
    pg = Postgres(tmp, user="postgres" if os.geteuid() == 0 else
                  pwd.getpwuid(os.geteuid()).pw_name)
    data, log = tmp / "data", tmp / "postgres.log"
    if os.geteuid() == 0:
        shutil.chown(tmp, "postgres", "postgres")
    try:
        init = _as_server_user([str(bin_dir / "initdb"), "-D", str(data), "-U", pg.user,
                                "--auth=trust", "--no-instructions", "-E", "UTF8"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out, _ = init.communicate(timeout=timeout)
        if init.returncode != 0:
            raise RuntimeError(f"initdb failed: {out.decode(errors='replace')[-500:]}")
        with open(log, "wb") as lf:
            if os.geteuid() == 0:
                shutil.chown(log, "postgres", "postgres")
            pg.proc = _as_server_user([
                str(bin_dir / "postgres"), "-D", str(data), "-k", str(tmp), "-h", "",
                "-c", "fsync=on", "-c", "synchronous_commit=on", "-c", "full_page_writes=on",
                "-c", "max_connections=40", "-c", "shared_buffers=128MB"],
                stdout=lf, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(pg.conninfo, autocommit=True) as c:
                    c.execute(SCHEMA)
                break
            except psycopg.OperationalError:
                if pg.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("postgres did not start: "
                                       + log.read_text(errors="replace")[-500:]) from None
                time.sleep(0.1)
        yield pg
    finally:
        if pg.proc is not None and pg.proc.poll() is None:
            pg.proc.terminate()  # SIGTERM: smart shutdown
            try:
                pg.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pg.proc.kill()
                pg.proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


def server_version(pg: Postgres) -> str:
    import psycopg

    with psycopg.connect(pg.conninfo, autocommit=True) as c:
        row = c.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else ""


# -- the workloads ------------------------------------------------------------------------
@dataclass
class Measured:
    """One loop: tasks done over the wall time, latency per call (or per task in D)."""

    n: int
    elapsed_s: float
    lats: list[float]
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    errors: int = 0
    note: str = ""

    @property
    def rate(self) -> float:
        return self.n / self.elapsed_s if self.elapsed_s > 0 else 0.0


def _connect(pg: Postgres) -> Any:
    import psycopg

    return psycopg.connect(pg.conninfo, autocommit=True, prepare_threshold=0)


def _cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _measure(pg: Postgres, limit_s: float, count: int, step: Callable[[int], int]
             ) -> Measured:
    """step(i) up to `count` times, each returning the tasks it did (0: stop), within
    `limit_s` (``timed_loop``), with the server's and this process's CPU seconds."""
    s0, c0, t0 = pg.cpu_s(), _cpu(), time.perf_counter()
    lats, n, _, _ = timed_loop(limit_s, count, step)
    el = time.perf_counter() - t0
    return Measured(n, el, lats, pg.cpu_s() - s0, _cpu() - c0)


def put_one(pg: Postgres, q: str, n: int, data: bytes, limit_s: float) -> Measured:
    """A: one INSERT per call (one transaction), one client."""
    with _connect(pg) as c:
        def put(i: int) -> int:
            c.execute(PUT1, (q, data))
            return 1
        return _measure(pg, limit_s, n, put)


def put_many(pg: Postgres, q: str, n: int, data: bytes, batch: int, limit_s: float) -> Measured:
    """B: one INSERT of ``batch`` rows per call (one transaction)."""
    with _connect(pg) as c:
        def put(i: int) -> int:
            k = min(batch, n - i * batch)
            c.execute(PUTN, (q, [data] * k))
            return k
        return _measure(pg, limit_s, -(-n // batch), put)


def lease_done(pg: Postgres, q: str, n: int, size: int, batch: int, limit_s: float) -> Measured:
    """Lease ``batch`` (one transaction) then delete them (another), until ``n`` are done;
    every payload's size is checked."""
    with _connect(pg) as c:
        bad, got = [0], [0]

        def take(i: int) -> int:
            if got[0] >= n:
                return 0
            rows = c.execute(LEASE, (LEASE_S, q, batch)).fetchall()
            bad[0] += sum(len(r[1]) != size for r in rows)
            if rows:
                c.execute(DONE, ([r[0] for r in rows],))
            got[0] += len(rows)
            return len(rows)
        m = _measure(pg, limit_s, n, take)
    m.errors = bad[0] + int(m.n != n)
    return m


def _producer(conninfo: str, q: str, n: int, size: int, go: Any, out: Any) -> None:
    import psycopg

    data = os.urandom(size)
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=0) as c:
        out.put(("ready", None))
        go.wait()
        t0, lats = time.monotonic(), []
        for _ in range(n):
            s = time.monotonic()
            c.execute(PUT1, (q, data))
            lats.append(time.monotonic() - s)
        out.put(("producer", {"first": t0, "last": time.monotonic(), "n": n, "lats": lats,
                              "cpu": _cpu()}))


def _consumer(conninfo: str, q: str, batch: int, size: int, go: Any, produced: Any,
              out: Any) -> None:
    """Lease up to ``batch`` (one transaction), delete them (another); poll every 2 ms
    while the queue is empty; stop once the producers are done and nothing is left."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=0) as c:
        out.put(("ready", None))
        go.wait()
        done, bad, last = 0, 0, time.monotonic()
        while True:
            rows = c.execute(LEASE, (LEASE_S, q, batch)).fetchall()
            if rows:
                bad += sum(len(r[1]) != size for r in rows)
                c.execute(DONE, ([r[0] for r in rows],))
                done += len(rows)
                last = time.monotonic()
                continue
            if produced.is_set():
                left = c.execute("SELECT count(*) FROM tasks WHERE queue = %s",
                                 (q,)).fetchone()
                if left is not None and left[0] == 0:
                    break
            time.sleep(0.002)
        out.put(("consumer", {"done": done, "bad": bad, "last": last, "cpu": _cpu()}))


def mixed(pg: Postgres, q: str, n: int, size: int, producers: int, consumers: int,
          batch: int, limit_s: float) -> Measured:
    """D: ``producers`` processes putting one task per call and ``consumers`` processes
    leasing up to ``batch`` and deleting them, at once; first put to last delete."""
    spawn = mp.get_context("spawn")
    go, produced, out = spawn.Event(), spawn.Event(), spawn.Queue()
    per = n // producers
    procs = [spawn.Process(target=_producer, args=(pg.conninfo, q, per, size, go, out))
             for _ in range(producers)]
    procs += [spawn.Process(target=_consumer, args=(pg.conninfo, q, batch, size, go, produced,
                                                    out)) for _ in range(consumers)]
    res: dict[str, list[dict[str, Any]]] = {"producer": [], "consumer": []}
    try:
        for p in procs:
            p.start()
        for _ in procs:
            out.get(timeout=60)
        s0 = pg.cpu_s()
        go.set()
        while len(res["producer"]) < producers:
            kind, r = out.get(timeout=limit_s + 60)
            res[kind].append(r)
        produced.set()
        while len(res["consumer"]) < consumers:
            kind, r = out.get(timeout=limit_s + 60)
            res[kind].append(r)
        srv = pg.cpu_s() - s0
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    pr, cr = res["producer"], res["consumer"]
    start = min(r["first"] for r in pr)
    el = max(r["last"] for r in cr) - start
    put_n, got = sum(r["n"] for r in pr), sum(r["done"] for r in cr)
    lats = [x for r in pr for x in r["lats"]]
    return Measured(got, el, lats, srv, sum(r["cpu"] for r in pr + cr),
                    errors=sum(r["bad"] for r in cr) + int(got != put_n),
                    note=f"{put_n} put, {got} deleted; consumers lease up to {batch} "
                    "and poll every 2 ms when empty; latency: the producers' puts")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pg_baseline",
                                 description="PostgreSQL SKIP LOCKED queue baseline")
    ap.add_argument("--quick", action="store_true", help="2,000 tasks instead of 20,000")
    a = ap.parse_args(argv)
    why = unavailable()
    if why:
        print(f"skipped: {why}", file=sys.stderr)
        return 0
    n, data = (2_000 if a.quick else 20_000), os.urandom(1024)
    with running_postgres() as pg:
        for name, m in (
            ("A.put", put_one(pg, "a", n, data, 120)),
            ("A.lease_done", lease_done(pg, "a", n, len(data), 1, 120)),
            ("B.put", put_many(pg, "b", n, data, 100, 120)),
            ("B.lease_done", lease_done(pg, "b", n, len(data), 100, 120)),
            ("D.4p4c", mixed(pg, "d", n, len(data), 4, 4, 16, 120)),
        ):
            print(f"{name:14} {m.rate:10,.1f} /s  n={m.n} errors={m.errors} "
                  f"server CPU {1e6 * m.server_cpu_s / max(1, m.n):.0f} us/task")
    return 0


if __name__ == "__main__":
    sys.exit(main())
