"""An inverted index of the Python standard library, as a three-stage squall pipeline on
Spark (``make run``).

1. **ingest** (a Spark job): the executors read every ``.py`` file of the standard library
   and write one task per file into ``docs#raw`` with the ``squall`` data source: pid =
   the path relative to the library, payload = the file's bytes (they go from the
   executors straight to the data nodes; the driver only lists the paths).
2. **tokenise** (``run_stage``): each Spark task leases files, counts the identifiers of
   each (keywords, ``self`` and ``cls`` left out), and moves it to ``docs#terms`` (pid
   kept, payload = JSON term counts) with one atomic update per batch: dequeue from
   ``docs#raw`` + enqueue into ``docs#terms``.
3. **index** (a Spark job over ``spark.read.format("squall")``): explode the term counts
   into an inverted index (term -> files, occurrences) and print the top terms.

It checks its own result (every file exactly once in ``docs#terms`` by pid, none left in
``docs#raw``, none dead-lettered), prints the dashboard URL, and keeps the cluster
running until Ctrl-C (``--once``: stop at the end, for scripted runs).

    python examples/stdlib_index.py [--once] [--port 7470] [--master URL] [--data-dir D]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import keyword
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from squall.client import Client, NotFound
from squall.common.wire.models import QueueStats

RAW, TERMS = "docs#raw", "docs#terms"
WORD = re.compile(rb"[A-Za-z_][A-Za-z0-9_]{2,}")
KEYWORDS = frozenset([*keyword.kwlist, *keyword.softkwlist, "self", "cls"])
console = Console()


# -- the cluster ---------------------------------------------------------------------------
@contextlib.contextmanager
def dev_cluster(port: int, data_dir: Path, keep: bool) -> Iterator[str]:
    """``squall dev`` (a master and three data nodes) as a subprocess; its URL."""
    url = f"http://127.0.0.1:{port}"
    data_dir.mkdir(parents=True, exist_ok=True)
    log = open(data_dir / "squall-dev.log", "ab")  # noqa: SIM115 - the child writes it
    proc = subprocess.Popen(
        [sys.executable, "-c", "from squall.client.cli import main; main()", "dev",
         "--port", str(port), "--data-dir", str(data_dir), "--nodes", "3"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while not _alive(url, 3, data_dir):
            if proc.poll() is not None:
                sys.exit(f"squall dev exited ({proc.returncode}); see "
                         f"{data_dir / 'squall-dev.log'} (port {port} taken? use --port)")
            if time.monotonic() > deadline:
                sys.exit(f"squall dev did not come up in 90 s; see {data_dir}/squall-dev.log")
            time.sleep(0.2)
        console.print(f"[green]squall dev is up[/] at {url} (data and logs in {data_dir})")
        # the admin credential squall dev made: clients and Spark's workers read it from here
        cred = _credential(data_dir)
        if cred:
            os.environ["SQUALL_TOKEN"] = cred
        yield url
        if keep:
            console.print(f"\ndashboard: [bold]{url}/[/]   API docs: {url}/docs   "
                          "— the cluster keeps running; Ctrl-C to stop it")
            with contextlib.suppress(KeyboardInterrupt):
                while proc.poll() is None:
                    time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # squall dev stops its nodes, then the master
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        log.close()


def _credential(data_dir: Path) -> str | None:
    """The admin credential ``squall dev`` keeps under its data folder (none when the
    environment gave it its keys: then SQUALL_TOKEN must be set)."""
    path = data_dir / "keys" / "admin.credential"
    return path.read_text().strip() if path.exists() else None


def _alive(url: str, nodes: int, data_dir: Path) -> bool:
    token = _credential(data_dir) or os.environ.get("SQUALL_TOKEN")
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, OSError):
        info = httpx.get(url + "/v1/cluster", timeout=2,
                         headers={"Authorization": f"Bearer {token}"}).json()
        return sum(n["state"] == "alive" for n in info["nodes"]) >= nodes
    return False


def counts(c: Client, queue: str) -> tuple[int, int]:
    """(tasks in the queue, tasks ever enqueued into it)."""
    try:
        st = c.stats(queue)
    except NotFound:
        return 0, 0
    assert isinstance(st, QueueStats)
    return st.total, st.enqueued_total


@contextlib.contextmanager
def progress(c: Client, label: str, total: int, done: Any) -> Iterator[None]:
    """A progress bar fed by polling the master while a Spark job runs."""
    stop = threading.Event()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=False) as bar:
        task = bar.add_task(label, total=total)

        def poll() -> None:
            while not stop.wait(0.25):
                with contextlib.suppress(Exception):
                    bar.update(task, completed=done(c))

        t = threading.Thread(target=poll, daemon=True)
        t.start()
        try:
            yield
        finally:
            stop.set()
            t.join()
            bar.update(task, completed=done(c))


# -- the stages ----------------------------------------------------------------------------
def tokenise(pid: str, data: bytes) -> bytes:
    """Stage 2's handler: the identifiers of one file and how often each occurs."""
    words = (m.group().decode() for m in WORD.finditer(data))
    terms = Counter(w.lower() for w in words if w not in KEYWORDS)
    return json.dumps({"path": pid, "bytes": len(data), "terms": terms}).encode()


def source_files(root: Path) -> list[str]:
    """The ``.py`` files under `root` (relative paths), without site-packages. Listed here,
    read on the executors: Spark's own file listing would skip ``__init__.py`` and every
    other name starting with ``_``."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                  if "site-packages" not in p.parts and p.is_file())


def ingest(spark: Any, url: str, root: Path) -> int:
    from pyspark.sql import functions as F

    paths = source_files(root)
    base = str(root)
    read = F.udf(lambda rel: Path(base, rel).read_bytes(), "binary", useArrow=False)
    df = (spark.createDataFrame([(p,) for p in paths], "pid string").repartition(4)
          .select("pid", read("pid").alias("payload")))
    n = len(paths)
    console.print(f"[bold]stage 1[/] ingest: {n} .py files → {RAW}  ({root})")
    with Client(url) as c, progress(c, "  ingested", n, lambda c: counts(c, RAW)[1]):
        (df.write.format("squall").option("master", url).option("queue", RAW)
         .option("pid", "pid").option("payload", "payload").mode("append").save())
        queued = counts(c, RAW)[0]
    if queued != n:
        sys.exit(f"CHECK FAILED: {queued} tasks in {RAW} after writing {n} files")
    return n


def tokenise_stage(spark: Any, url: str, n: int) -> Any:
    from squall.client.spark import run_stage

    console.print(f"[bold]stage 2[/] tokenise: run_stage {RAW} → {TERMS}")
    with Client(url) as c, progress(c, "  tokenised", n, lambda c: counts(c, TERMS)[1]):
        res = run_stage(spark, RAW, tokenise, TERMS, parallelism=2, batch_size=50,
                        lease_secs=120, with_pid=True, master=url)
    console.print(f"  {res.done} moved, {res.failed} failed, {res.dead_lettered} "
                  f"dead-lettered in {res.seconds:.1f} s ({res.tasks_per_s:.0f} files/s)")
    return res


def index(spark: Any, url: str, top: int) -> list[Any]:
    from pyspark.sql import functions as F

    console.print(f"[bold]stage 3[/] index: read {TERMS} (payloads) and aggregate")
    docs = (spark.read.format("squall").option("master", url).option("queue", TERMS)
            .option("with_payload", "true").load()
            .select("pid", F.from_json(F.col("payload").cast("string"),
                                       "path string, bytes long, terms map<string,int>")
                    .alias("doc")))
    postings = docs.select("pid", F.explode("doc.terms").alias("term", "n"))
    idx = (postings.groupBy("term")
           .agg(F.count("*").alias("files"), F.sum("n").alias("occurrences"),
                F.slice(F.sort_array(F.collect_list("pid")), 1, 2).alias("e.g."))
           .orderBy(F.desc("files"), F.desc("occurrences")))
    rows = idx.limit(top).collect()
    table = Table(title=f"top {top} terms of the standard library (by files containing them)")
    for col in ("term", "files", "occurrences", "e.g."):
        table.add_column(col, justify="right" if col in ("files", "occurrences") else "left")
    for r in rows:
        table.add_row(r["term"], f"{r['files']:,}", f"{r['occurrences']:,}",
                      ", ".join(r["e.g."]))
    console.print(table)
    console.print(f"  {idx.count():,} distinct terms")
    return rows


def check(url: str, spark: Any, n_files: int, res: Any) -> list[str]:
    """Every file exactly once in docs#terms, by pid; nothing left behind."""
    from pyspark.sql import functions as F

    problems = []
    with Client(url) as c:
        raw_left = counts(c, RAW)[0]
        terms, terms_in = counts(c, TERMS)
        dead = len(c.dead_letters(RAW, limit=1000))
    if raw_left:
        problems.append(f"{raw_left} tasks left in {RAW}")
    if dead or res.dead_lettered:
        problems.append(f"{dead} dead-lettered files")
    if not terms == terms_in == res.done == n_files:
        problems.append(f"{TERMS} holds {terms} (enqueued {terms_in}), stage moved "
                        f"{res.done}, files {n_files}")
    got = (spark.read.format("squall").option("master", url).option("queue", TERMS).load()
           .agg(F.count("*"), F.countDistinct("pid")).collect()[0])
    if tuple(got) != (n_files, n_files):
        problems.append(f"{TERMS} lists {got[0]} tasks, {got[1]} distinct pids")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--once", action="store_true", help="stop the cluster at the end")
    ap.add_argument("--port", type=int, default=7470, help="master port (nodes: +1..+3)")
    ap.add_argument("--data-dir", type=Path, default=Path(".squall/example"))
    ap.add_argument("--master", help="use this running cluster instead of starting one")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--root", type=Path, default=Path(sysconfig.get_paths()["stdlib"]),
                    help="the folder to index (default: the standard library)")
    args = ap.parse_args(argv)
    if shutil.which("java") is None and not _java_home():
        sys.exit("Spark needs Java 17+: install a JDK (e.g. apt-get install openjdk-17-jre) "
                 "or set JAVA_HOME")
    from squall.client.spark import local_session

    t0 = time.monotonic()
    cm = (contextlib.nullcontext(args.master) if args.master
          else dev_cluster(args.port, args.data_dir, keep=not args.once))
    with cm as url:
        with Client(url) as c:  # a fresh run: drop what an earlier run left
            for q in (RAW, TERMS, RAW + ".dead"):
                with contextlib.suppress(NotFound):
                    c.delete(q)
        console.print("starting Spark (local[2]) …")
        spark = local_session("squall-example-stdlib-index", "local[2]")
        try:
            n = ingest(spark, url, args.root)
            res = tokenise_stage(spark, url, n)
            index(spark, url, args.top)
            problems = check(url, spark, n, res)
        finally:
            spark.stop()
        if problems:
            for p in problems:
                console.print(f"[red]CHECK FAILED[/]: {p}")
            return 1
        console.print(f"[green]check passed[/]: each of the {n} files was tokenised exactly "
                      f"once (by pid); total {time.monotonic() - t0:.0f} s")
        if args.master:  # our own cluster: dev_cluster prints it as it waits (or stops it)
            console.print(f"dashboard: [bold]{url}/[/]")
    if args.once and not args.master:
        console.print("the cluster is stopped (--once); its data stays in "
                      f"{args.data_dir}: `make run` starts it again")
    return 0


def _java_home() -> bool:
    import os

    home = os.environ.get("JAVA_HOME")
    return home is not None and Path(home, "bin", "java").exists()


if __name__ == "__main__":
    sys.exit(main())
