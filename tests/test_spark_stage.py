"""``run_stage`` beyond the basics: a slow handler among fast ones never makes finished
results run again (the whole batch's leases are renewed), and Arrow-batched handlers."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql import SparkSession

from squall.client import Client, NewTask
from squall.client.spark import run_stage
from squall.client.spark._stage import StageLoop, StageSpec
from tests.spark_kit import Cluster, cluster, lease_all, spark, total

__all__ = ["cluster", "spark"]  # module fixtures


def test_slow_handler_among_fast_ones_runs_nothing_twice(cluster: Cluster) -> None:
    """One handler outlives the lease twice over while the others finish at once: every
    finished result is held (and its lease renewed) until the batch commits."""
    c, src, sink, n, lease = cluster.client, "slow#in", "slow#out", 10, 1.5
    c.put_many(src, [NewTask(str(i).encode(), pid=f"s{i:02d}") for i in range(n)])
    runs: list[str] = []
    lock = threading.Lock()
    slow_until = time.monotonic() + 2.5 * lease  # well past the lease of the fast ones

    def handler(pid: str, data: bytes) -> bytes:
        with lock:
            runs.append(pid)
        if pid == "s03":
            while time.monotonic() < slow_until:  # a deadline, not a synchronising sleep
                time.sleep(0.05)
        return data + b"!"

    spec = StageSpec(cluster.url, src, sink, lease, batch_size=n, threads=2, with_pid=True,
                     max_attempts=None, deadline=time.time() + 60)
    with Client(cluster.url) as own, httpx.Client(timeout=30) as http:
        res = StageLoop(own, spec, handler, http).run(None)
    assert (res.done, res.leased, res.lost, res.failed) == (n, n, 0, 0), res
    assert sorted(runs) == [f"s{i:02d}" for i in range(n)], "a handler ran twice"
    assert total(c, src) == 0 and total(c, sink) == n
    moved = lease_all(c, sink, n)
    assert {t.pid: t.payload() for t in moved} == {
        f"s{i:02d}": f"{i}!".encode() for i in range(n)}
    c.done(moved)


def test_slow_handler_on_spark_gives_done_equal_leased(spark: SparkSession, cluster: Cluster,
                                                       tmp_path: Path) -> None:
    """The issue's report as a user runs it: 10 tasks, one slow handler, two Spark tasks."""
    c, src, sink, n, lease = cluster.client, "slow2#in", "slow2#out", 10, 1.5
    c.put_many(src, [NewTask(b"x", pid=f"t{i:02d}") for i in range(n)])
    log = str(tmp_path / "runs")
    slow_until = time.time() + 2.5 * lease + 3  # + Spark's start-up

    def handler(pid: str, data: bytes) -> bytes:
        import os
        import time as t

        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{pid}\n".encode())
        os.close(fd)
        if pid == "t04":
            while t.time() < slow_until:
                t.sleep(0.05)
        return data

    res = run_stage(spark, src, handler, sink, parallelism=2, lease_secs=lease,
                    batch_size=10, with_pid=True, master=cluster.url, timeout_s=120)
    assert (res.done, res.leased, res.lost) == (n, n, 0), res
    assert sorted(Path(log).read_text().split()) == [f"t{i:02d}" for i in range(n)]
    assert total(c, sink) == n
