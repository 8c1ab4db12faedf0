"""Spark benchmark: the ``squall`` data source and ``run_stage`` on Spark ``local[2]``.

    .venv/bin/python -m bench.spark_bench            # 20,000 x 100 KiB; 20,000 stage tasks
    .venv/bin/python -m bench.spark_bench --quick    # 10x smaller (results in spark-quick.*)
    .venv/bin/python -m bench.spark_bench --nice 10  # priority over other work (root)

A master (``--fsync``) and three data nodes (replication factor 2) as real processes on
127.0.0.1, and one SparkSession ``local[2]`` in this process (UI off). Workloads:

- **write**: ``df.write.format("squall")`` of N rows with 100 KiB payloads (generated in the
  JVM from the row id, so Spark has no input to read), pid column, 2 partitions. Target:
  >= 80 MB/s of payload (MB = 10^6 bytes).
- **put_many**: the same rows (same sizes, distinct bytes) written by ``Client.put_many``
  from this one process (batches of 80 rows: about the data source's 8 MiB), replication
  factor 2, in the same run: the write's target is >= 0.8x this.
- **baseline**: the same DataFrame through ``foreachPartition`` with one plain ``httpx`` PUT
  per row to a single data node (blob ids and a write token from one master allocation per
  1,000 rows; replication factor 1, no enqueue): the naive way, for comparison.
- **stage**: ``run_stage`` with a no-op handler over N tasks with 1 KiB payloads (written
  beforehand with ``Client.put_many``), sink none. Target: >= 5,000 tasks/s.

Each figure is over the wall time of the Spark job after a warm-up job (Python workers
already started); ``loop`` figures exclude Spark's job scheduling (the slowest Spark task's
own time). Results: ``bench/results/spark.json`` and ``spark.md`` with the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from bench.dn_cluster import ClusterSpec, running_cluster
from bench.harness import AUTH, raise_priority
from bench.master_bench import machine_info
from squall.client import Client, NewTask

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
KIB = 1024
MB = 1_000_000
TARGET_WRITE_MB_S = 80.0
TARGET_STAGE_TASKS_S = 5000.0
TARGET_WRITE_VS_PUT_MANY = 0.8
ALL = ("write", "put_many", "baseline", "stage")


@dataclass
class Figure:
    name: str
    items: int
    payload_bytes: int
    seconds: float
    value: float
    unit: str
    target: float | None
    load1_after: float
    notes: str = ""
    load1_before: float = 0.0

    @property
    def ratio(self) -> float | None:
        return round(self.value / self.target, 2) if self.target else None


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def payload_df(spark: Any, rows: int, size: int, partitions: int, offset: int = 0) -> Any:
    """rows x `size` bytes: the hex of a sha256 of the id, repeated (distinct per row)."""
    from pyspark.sql import functions as F

    reps = size // 64
    return (spark.range(offset, offset + rows, numPartitions=partitions)
            .select(F.format_string("r%09d", "id").alias("pid"),
                    F.expr(f"cast(repeat(sha2(cast(id as string), 256), {reps}) as binary)")
                    .alias("payload")))


def bench_write(spark: Any, url: str, rows: int, size: int, partitions: int) -> Figure:
    payload_df(spark, 200, size, partitions, offset=10**8).write.format("squall") \
        .option("master", url).option("queue", "bench#warm").option("pid", "pid") \
        .mode("append").save()
    df = payload_df(spark, rows, size, partitions)
    t0 = time.perf_counter()
    (df.write.format("squall").option("master", url).option("queue", "bench#write")
     .option("pid", "pid").mode("append").save())
    secs = time.perf_counter() - t0
    with Client(url) as c:
        n = c.stats("bench#write").total
    assert n == rows, f"{n} tasks queued, {rows} rows written"
    return Figure("write (data source, RF 2)", rows, rows * size, secs,
                  round(rows * size / MB / secs, 1), "MB/s", TARGET_WRITE_MB_S, load1(),
                  f"{partitions} partitions; batches of 8 MiB (81 rows), 3 in flight each")


def bench_put_many(url: str, rows: int, size: int) -> Figure:
    import hashlib

    reps = size // 64

    def items() -> Any:
        for i in range(2 * 10**9, 2 * 10**9 + rows):
            data = (hashlib.sha256(str(i).encode()).hexdigest() * reps).encode()
            yield NewTask(data, pid=f"r{i:010d}")

    with Client(url) as c:
        c.put_many("bench#warmput", [NewTask(b"x" * size) for _ in range(80)], batch_size=80)
        t0 = time.perf_counter()
        added = c.put_many("bench#putmany", items(), batch_size=80)
        secs = time.perf_counter() - t0
    assert added == rows, f"{added} of {rows} new"
    return Figure("put_many (Client, one process, RF 2)", rows, rows * size, secs,
                  round(rows * size / MB / secs, 1), "MB/s", None, load1(),
                  "batches of 80 rows (8 MiB); payload made in Python as it goes")


def write_vs_put_many(figs: list[Figure]) -> Figure | None:
    by = {f.name.split(" ")[0]: f for f in figs}
    if "write" not in by or "put_many" not in by:
        return None
    w, p = by["write"], by["put_many"]
    return Figure("write / put_many (same run)", w.items, w.payload_bytes, w.seconds,
                  round(w.value / p.value, 2), "x", TARGET_WRITE_VS_PUT_MANY, load1(),
                  f"{w.value} vs {p.value} MB/s")


def _naive_partition(url: str, node: str, rows: Any) -> None:
    with httpx.Client(timeout=120, headers=AUTH) as http:  # AUTH: for the master only
        batch: list[bytes] = []

        def flush() -> None:
            r = http.post(url + "/v1/blobs/allocate",
                          json={"count": len(batch), "size_bytes": len(batch[0])})
            if r.status_code != 200:
                raise RuntimeError(f"allocate: {r.status_code} {r.text}")
            a = r.json()
            auth = {"Authorization": f"Bearer {a['token']}"}
            for b, data in zip(a["blobs"], batch, strict=True):
                r = http.put(f"{node}/v1/blobs/{b['blob_id']}", content=data, headers=auth,
                             params={"quorum": "1"})
                r.raise_for_status()
            batch.clear()

        for row in rows:
            batch.append(bytes(row.payload))
            if len(batch) == 1000:
                flush()
        if batch:
            flush()


def bench_baseline(spark: Any, url: str, node: str, rows: int, size: int, partitions: int
                   ) -> Figure:
    df = payload_df(spark, rows, size, partitions, offset=10**9)
    t0 = time.perf_counter()
    df.foreachPartition(lambda it: _naive_partition(url, node, it))
    secs = time.perf_counter() - t0
    return Figure("baseline (foreachPartition, httpx PUT, 1 node, RF 1)", rows, rows * size,
                  secs, round(rows * size / MB / secs, 1), "MB/s", None, load1(),
                  "no enqueue, no replication: payload bytes only")


def noop(_: bytes) -> None:
    return None


def bench_stage(spark: Any, url: str, tasks: int, size: int, partitions: int) -> list[Figure]:
    from squall.client.spark import run_stage

    with Client(url) as c:
        c.put_many("bench#warmstage", [NewTask(b"x", pid=f"w{i:04d}") for i in range(200)])
        run_stage(spark, "bench#warmstage", noop, parallelism=partitions, master=url)
        blob = os.urandom(size)
        c.put_many("bench#stage", (NewTask(blob, pid=f"t{i:07d}") for i in range(tasks)),
                   batch_size=500)
    res = run_stage(spark, "bench#stage", noop, parallelism=partitions, master=url,
                    batch_size=500, threads=4)
    assert res.done == tasks, res
    with Client(url) as c:
        left = c.stats("bench#stage").total
    assert left == 0, f"{left} tasks left"
    note = f"{partitions} Spark tasks, batch 500, 4 threads each; {size} B payloads"
    return [Figure("stage (run_stage, no-op handler)", tasks, tasks * size, res.seconds,
                   round(tasks / res.seconds), "tasks/s", TARGET_STAGE_TASKS_S, load1(), note),
            Figure("stage loop only (slowest Spark task)", tasks, tasks * size,
                   res.loop_seconds, round(tasks / res.loop_seconds), "tasks/s", None,
                   load1(), "without Spark's job scheduling")]


def write_results(figs: list[Figure], info: dict[str, Any], name: str, merge: bool) -> None:
    """Write the results; with `merge` (``--only``), keep the figures of workloads that did
    not run from the previous file."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    rows = [{**asdict(f), "ratio_to_target": f.ratio, "date": time.strftime("%Y-%m-%d %H:%M")}
            for f in figs]
    if merge and path.exists():
        ran = {f.name for f in figs}
        old = json.loads(path.read_text()).get("figures", [])
        rows = [r for r in old if r["name"] not in ran] + rows
        rows.sort(key=lambda r: next((i for i, w in enumerate(ALL)
                                      if r["name"].startswith(w)), len(ALL)))
    data = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": info, "figures": rows}
    path.write_text(json.dumps(data, indent=2) + "\n")
    lines = [f"# Spark benchmark ({data['date']})", "",
             f"{info['nproc']} CPUs ({info['cpu']}), Python {info['python']}, commit "
             f"{info['commit']}; load average at start {info['load_at_start'][0]:.2f}, "
             f"niceness {info['nice']}. Spark local[2], a master with --fsync and 3 data "
             "nodes on the same machine (which other work shares).", "",
             "| workload | items | MB | s | value | target | x target | load1 start / after "
             "| run at | notes |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        target = f"{r['target']:,.0f}" if r["target"] else "-"
        lines.append(f"| {r['name']} | {r['items']:,} | {r['payload_bytes'] / MB:,.0f} | "
                     f"{r['seconds']:.1f} | {r['value']:,} {r['unit']} | {target} | "
                     f"{r['ratio_to_target'] or '-'} | {r['load1_before']} / "
                     f"{r['load1_after']} | {r['date']} | {r['notes']} |")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10x smaller counts")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--only", default=",".join(ALL))
    ap.add_argument("--nice", type=int, default=0, metavar="N",
                    help="raise this process's priority by N (root), inherited by the servers "
                         "and Spark: on a machine other work shares")
    args = ap.parse_args(argv)
    args.nice = raise_priority(args.nice, print)
    scale = 10 if args.quick else 1
    rows, tasks = 20_000 // scale, 20_000 // scale
    only = set(args.only.split(","))
    info = {**machine_info(), "nice": -args.nice}
    from squall.client.spark import local_session

    figs: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="squall-spark-bench-") as tmp, \
            running_cluster(ClusterSpec(nodes=3, rf=2), Path(tmp)) as cluster:
        spark = local_session("squall-bench", "local[2]")
        try:
            node = cluster.nodes[0].url
            runs = {"write": lambda: [bench_write(spark, cluster.url, rows, 100 * KIB,
                                                  args.partitions)],
                    "put_many": lambda: [bench_put_many(cluster.url, rows, 100 * KIB)],
                    "baseline": lambda: [bench_baseline(spark, cluster.url, node, rows,
                                                        100 * KIB, args.partitions)],
                    "stage": lambda: bench_stage(spark, cluster.url, tasks, KIB,
                                                 args.partitions)}
            for name, run in runs.items():
                if name in only:
                    before = load1()
                    for f in run():
                        f.load1_before = before
                        figs.append(f)
                        print(f, flush=True)
        finally:
            spark.stop()
    ratio = write_vs_put_many(figs)
    if ratio is not None:
        figs.append(ratio)
    write_results(figs, info, "spark-quick" if args.quick else "spark",
                  merge=set(args.only.split(",")) != set(ALL))
    return 0


if __name__ == "__main__":
    sys.exit(main())
