"""``spark.read.format("squall")``: partitions follow the master's own order (pid keys), so
long pids that the master orders by hash are neither skipped nor repeated; the number of
partitions comes from the queue's size and the session's parallelism."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from collections import Counter

from pyspark.sql import SparkSession

from squall.client import Client, NewTask
from squall.client.spark._read import ReadOptions, partition_size, plan_bounds, read_range
from squall.common.wire.names import pid_key
from squall.master.storage.records import pidkey
from tests.spark_kit import Cluster, cluster, spark

__all__ = ["cluster", "spark"]  # module fixtures

LONG = ["P" * 460 + c for c in "gfedcba"] + ["Q" * 999 + "1", "Q" * 999 + "2", "a", "b",
        "é" * 230 + "x", "é" * 230 + "y", "日本" * 80]


def test_pid_key_is_the_masters_key() -> None:
    for pid in [*LONG, "", "x" * 448, "x" * 449, "é" * 224, "é" * 225]:
        assert pid_key(pid) == pidkey(pid.encode()), pid[:20]


@pytest.fixture(scope="module")
def long_queue(cluster: Cluster) -> str:
    q = "rd#long"
    cluster.client.put_many(q, [NewTask(p.encode()[:50], pid=p) for p in LONG])
    return q


def test_every_partition_size_reads_every_long_pid_once(cluster: Cluster,
                                                        long_queue: str) -> None:
    with Client(cluster.url) as c:
        for size in range(1, len(LONG) + 2):
            opts = ReadOptions(cluster.url, long_queue, payload=True, partition_size=size)
            bounds = plan_bounds(c, opts)
            assert len(bounds) == -(-len(LONG) // size), size
            rows = [r for a, b in bounds for r in read_range(opts, a, b)]
            got = Counter(r[1] for r in rows)
            assert got == Counter(LONG), f"partition_size={size}: {got - Counter(LONG)} " \
                                         f"extra, {Counter(LONG) - got} missing"
            assert all(r[-1] == r[1].encode()[:50] for r in rows)


def test_spark_read_of_long_pids_at_every_partition_size(spark: SparkSession,
                                                         cluster: Cluster,
                                                         long_queue: str) -> None:
    base = spark.read.format("squall").option("master", cluster.url) \
        .option("queue", long_queue)
    for size in range(1, len(LONG) + 1):
        df = base.option("partition_size", str(size)).load()
        assert df.rdd.getNumPartitions() == -(-len(LONG) // size)
        assert Counter(r.pid for r in df.select("pid").collect()) == Counter(LONG), size
    # the deprecated read option `payload=true` still works, `with_payload` is its name now
    for opt in ("with_payload", "payload"):
        df = base.option(opt, "true").load()
        assert {r.pid: r.payload for r in df.collect()} == {
            p: p.encode()[:50] for p in LONG}


def test_automatic_partitions_from_size_and_parallelism() -> None:
    def parts(total: int, **kw: int) -> int:
        opts = ReadOptions(None, "g#q", **kw)  # type: ignore[arg-type]
        return -(-total // partition_size(total, opts)) if total else 1

    assert parts(0, parallelism=2) == 1
    assert parts(100, parallelism=2) == 1  # too small to be worth splitting
    assert parts(1000, parallelism=2) == 4  # two per core
    assert parts(10_000, parallelism=4) == 8
    assert parts(1_000_000, parallelism=2) == 50  # at most 20,000 tasks per partition
    assert parts(1000, parallelism=2, partitions=3) == 3
    assert parts(1000, parallelism=2, partition_size=100) == 10


def test_spark_read_partitions_automatically(spark: SparkSession, cluster: Cluster) -> None:
    q, n = "rd#auto", 1200
    cluster.client.put_many(q, [NewTask(b"", pid=f"a{i:05d}") for i in range(n)])
    df = spark.read.format("squall").option("master", cluster.url).option("queue", q).load()
    assert df.rdd.getNumPartitions() == 2 * spark.sparkContext.defaultParallelism
    assert sorted(r.pid for r in df.select("pid").collect()) == [f"a{i:05d}" for i in range(n)]
