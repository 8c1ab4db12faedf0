"""squall on Spark: the ``squall`` data source and ``run_stage`` against a real cluster (a
master and three data nodes as processes, replication factor 2, heartbeats every 0.2 s) and
one real SparkSession ``local[2,2]`` (two cores; a failed Spark task is tried once more, as
on a cluster) for the whole module."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from squall.client import Backoff, LeasedTask, NewTask
from squall.client.spark import derived_pid, outputs, run_stage, save
from squall.client.spark._fetch import _groups
from squall.common.wire.models import PayloadRef, QueueStats
from tests.helpers import wait_for
from tests.spark_kit import Cluster, cluster, expected, lease_all, spark, total

__all__ = ["cluster", "spark"]  # module fixtures



def rows_df(spark: SparkSession, n: int, size: int, partitions: int = 2) -> DataFrame:
    """n rows: pid ``k%05d``, payload = the sha256 hex of the id repeated to `size` bytes."""
    return (spark.range(n, numPartitions=partitions)
            .select(F.format_string("k%05d", "id").alias("pid"),
                    F.expr(f"cast(repeat(sha2(cast(id as string), 256), {size // 64}) "
                           "as binary)").alias("payload")))


def write(df: DataFrame, url: str, queue: str, **opts: str) -> None:
    w = df.write.format("squall").option("master", url).option("queue", queue)
    for k, v in opts.items():
        w = w.option(k, v)
    w.mode("append").save()


# -- the data source -----------------------------------------------------------------------
def test_write_10k_rows_read_back_identical_then_rewrite_collapses(
        spark: SparkSession, cluster: Cluster) -> None:
    n, size, q = 10_000, 10_240, "ds#big"
    df = rows_df(spark, n, size)
    write(df, cluster.url, q, pid="pid")
    c = cluster.client
    assert total(c, q) == n

    tasks = lease_all(c, q, n)
    assert sorted(t.pid for t in tasks) == [f"k{i:05d}" for i in range(n)]
    with ThreadPoolExecutor(8) as pool:
        datas = list(pool.map(LeasedTask.payload, tasks))
    bad = [t.pid for t, d in zip(tasks, datas, strict=True) if d != expected(int(t.pid[1:]), 160)]
    assert not bad, f"{len(bad)} payloads differ, e.g. {bad[:3]}"
    for i in range(0, n, 1000):  # one update holds at most 1000 items
        c.release(tasks[i:i + 1000])

    # the same job again (a re-run, or every Spark task retried): every pid collapses
    before = c.stats(q)
    write(df, cluster.url, q, pid="pid")
    after = c.stats(q)
    assert isinstance(before, QueueStats) and isinstance(after, QueueStats)
    assert after.total == n and after.enqueued_total == before.enqueued_total


def test_reader_lists_tasks_and_payloads_without_leasing(spark: SparkSession,
                                                         cluster: Cluster) -> None:
    n, size, q = 1500, 1024, "ds#read"
    write(rows_df(spark, n, size), cluster.url, q, pid="pid")
    base = spark.read.format("squall").option("master", cluster.url).option("queue", q)
    meta = base.option("partition_size", "400").load()  # 1500 tasks
    assert meta.rdd.getNumPartitions() == 4
    agg = meta.agg(F.count("*"), F.countDistinct("pid"), F.sum("size"), F.max("attempts"),
                   F.min("state"), F.max("state")).collect()[0]
    assert tuple(agg) == (n, n, n * size, 0, "available", "available")
    assert "payload" not in meta.columns

    full = base.option("with_payload", "true").load()
    got = {r.pid: r.h for r in full.select("pid", F.sha2("payload", 256).alias("h")).collect()}
    assert got == {f"k{i:05d}": hashlib.sha256(expected(i, size // 64)).hexdigest()
                   for i in range(n)}
    assert total(cluster.client, q) == n
    assert cluster.client.stats(q).leased == 0  # type: ignore[union-attr]

    empty = spark.read.format("squall").option("master", cluster.url) \
        .option("queue", "ds#nothing-here").load()
    assert empty.count() == 0


def test_derived_pids_make_retries_collapse(spark: SparkSession, cluster: Cluster,
                                            tmp_path: Path) -> None:
    """Without a pid column: a Spark task that fails half-way is retried and its rows
    collapse into what the first attempt wrote; a re-run is a new job (new pids) unless it
    passes the same ``pid_prefix``."""
    marker = str(tmp_path / "failed-once")

    @F.udf(returnType="binary", useArrow=False)
    def flaky(i: int) -> bytes:
        from pyspark import TaskContext

        tc = TaskContext.get()
        if i == 700 and tc is not None and tc.attemptNumber() == 0:
            Path(marker).touch()
            raise RuntimeError("injected failure of the first attempt")
        return str(i).encode() * 10

    df = spark.range(1000, numPartitions=2).select(flaky("id").alias("payload"))
    c, q = cluster.client, "ds#nopid"
    write(df, cluster.url, q, pid_prefix="job1", batch_rows="50", inflight="1")
    assert os.path.exists(marker), "the injected failure did not happen"
    assert total(c, q) == 1000
    pids = sorted(t.pid for t in c.iter_tasks(q))
    assert pids[0] == derived_pid("job1", 0, 0) and len(set(pids)) == 1000

    write(df, cluster.url, q, pid_prefix="job1")
    assert total(c, q) == 1000
    write(df.limit(10).coalesce(1), cluster.url, q)  # a fresh job id: 10 new tasks
    assert total(c, q) == 1010


def test_bad_options_fail_at_save(spark: SparkSession, cluster: Cluster) -> None:
    df = rows_df(spark, 3, 64)
    with pytest.raises(Exception, match="append"):
        df.write.format("squall").option("master", cluster.url).option("queue", "ds#x") \
            .mode("overwrite").save()
    with pytest.raises(Exception, match="queue"):
        df.write.format("squall").option("master", cluster.url).mode("append").save()
    with pytest.raises(Exception, match="string column"):
        write(df, cluster.url, "ds#x", pid="nope")
    with pytest.raises(Exception, match="numeric column"):
        write(df, cluster.url, "ds#x", pid="pid", delay="pid")
    # an unreachable master fails on the driver, before any payload is uploaded
    with pytest.raises(Exception, match="does not answer"):
        write(df, "http://127.0.0.1:9", "ds#x", pid="pid")


def test_save_reports_new_and_collapsed_and_honours_delay(spark: SparkSession,
                                                          cluster: Cluster) -> None:
    c, q = cluster.client, "ds#sum"
    df = rows_df(spark, 40, 64).withColumn(
        "wait", F.when(F.col("pid") < "k00010", F.lit(3600.0)))
    first = save(df.limit(30), q, master=cluster.url, pid="pid", delay="wait")
    assert (first.rows, first.added, first.collapsed) == (30, 30, 0)
    again = save(df, q, master=cluster.url, pid="pid", delay="wait", batch_rows=7)
    assert (again.rows, again.added, again.collapsed, again.payload_bytes) == (
        40, 10, 30, 40 * 64)
    st = c.stats(q)
    assert isinstance(st, QueueStats)
    assert (st.total, st.delayed, st.available) == (40, 10, 30)
# -- run_stage -----------------------------------------------------------------------------
def test_stage_moves_tasks_once_and_dead_letters_failures(spark: SparkSession,
                                                          cluster: Cluster) -> None:
    c, src, sink, n = cluster.client, "st#in", "st#out", 300
    c.set_policy(src, max_attempts=3, backoff=Backoff(base_secs=0.05, cap_secs=0.2))
    c.put_many(src, [NewTask(str(i).encode(), pid=f"p{i:04d}") for i in range(n)])

    def handler(data: bytes) -> bytes:
        if int(data) % 10 == 7:
            raise ValueError(f"bad input {data!r}")
        return data * 2

    res = run_stage(spark, src, handler, sink, parallelism=2, lease_secs=30, batch_size=40,
                    master=cluster.url, timeout_s=120)
    bad = [i for i in range(n) if i % 10 == 7]
    assert (res.done, res.dead_lettered, res.failed, res.lost) == (
        n - len(bad), len(bad), 2 * len(bad), 0), res
    assert res.outputs == n - len(bad) and res.partitions == 2

    assert total(c, src) == 0
    out = c.stats(sink)
    assert isinstance(out, QueueStats)
    assert out.total == out.enqueued_total == n - len(bad)  # each enqueued exactly once
    moved = lease_all(c, sink, n - len(bad))
    assert sorted(t.pid for t in moved) == [f"p{i:04d}" for i in range(n) if i not in bad]
    assert all(t.payload() == str(int(t.pid[1:])).encode() * 2 for t in moved)
    c.done(moved)
    dead = c.dead_letters(src, limit=1000)
    assert sorted(t.pid for t in dead) == [f"p{i:04d}" for i in bad]
    assert all(t.attempts == 3 and "ValueError" in (t.error or "") for t in dead)


def test_stage_survives_a_dying_spark_task_and_honours_budget(
        spark: SparkSession, cluster: Cluster, tmp_path: Path) -> None:
    """A Python worker killed mid-batch loses nothing: its leases expire and the tasks are
    leased again (here by the retried Spark task). ``max_tasks`` stops a stage early."""
    c, src, sink, n = cluster.client, "st2#in", "st2#out", 60
    c.put_many(src, [NewTask(b"x", pid=f"q{i:03d}") for i in range(n)])
    marker = str(tmp_path / "died")

    def handler(pid: str, data: bytes) -> list[tuple[str, bytes]]:
        if pid == "q010" and not os.path.exists(marker):
            Path(marker).touch()
            os._exit(3)  # the Python worker dies with a leased batch
        return [(pid + ".a", data), (pid + ".b", data)]

    res = run_stage(spark, src, handler, sink, parallelism=1, lease_secs=2, batch_size=20,
                    with_pid=True, master=cluster.url, timeout_s=120)
    assert os.path.exists(marker)
    assert total(c, src) == 0 and total(c, sink) == 2 * n
    assert res.done <= n  # the dead attempt's counts are gone with it

    c.put_many(src, [NewTask(b"y", pid=f"r{i:03d}") for i in range(50)])
    res = run_stage(spark, src, lambda d: None, None, parallelism=2, batch_size=10,
                    max_tasks=20, master=cluster.url)
    assert res.done == 20 and total(c, src) == 30


# -- a data node dies during a write -------------------------------------------------------
def test_write_survives_a_data_node_killed_mid_write(spark: SparkSession,
                                                     tmp_path: Path) -> None:
    cl = Cluster(tmp_path)
    try:
        n, size, q = 4000, 4096, "kill#w"
        df = rows_df(spark, n, size)
        outcome: dict[str, Any] = {}
        done = threading.Event()

        def killer() -> None:  # the write stays in this thread: its session knows "squall"
            wait_for(lambda: done.is_set() or total(cl.client, q) >= 300, timeout=120,
                     interval=0.01, what="the write under way")
            if not done.is_set():
                cl.nodes[1].kill9()
                outcome["killed"] = True

        t = threading.Thread(target=killer)
        t.start()
        try:
            write(df, cl.url, q, pid="pid", batch_rows="25", inflight="1")
            outcome["ok"] = True
        except Exception as e:
            outcome["error"] = e
        finally:
            done.set()
            t.join(130)
        assert outcome.get("killed"), f"the write ended before the kill: {outcome}"
        wait_for(lambda: cl.alive() == 2, what="the master noticed the dead node")
        tasks = list(cl.client.iter_tasks(q))
        if "error" in outcome:  # allowed: a loud failure, but nothing acked may be lost
            assert tasks, outcome["error"]
        else:
            assert len(tasks) == n
        leased = lease_all(cl.client, q, len(tasks))
        with ThreadPoolExecutor(8) as pool:
            datas = list(pool.map(LeasedTask.payload, leased))
        assert all(d == expected(int(t.pid[1:]), size // 64)
                   for t, d in zip(leased, datas, strict=True))
        assert outcome.get("ok"), f"the write failed: {outcome.get('error')}"
    finally:
        cl.close()


# -- pieces without Spark ------------------------------------------------------------------
def test_outputs_of_a_handler() -> None:
    assert outputs("a", None, "g#o", "g") == []
    [one] = outputs("a", b"x", "g#o", "g")
    assert (one.queue, one.pid, one.payload) == ("g#o", "a", b"x")
    mine = NewTask(b"z", queue="side")
    many = outputs("a", [b"x", ("p", b"y"), mine], "g#o", "g")
    assert [(t.queue, t.pid) for t in many] == [("g#o", "a/000000"), ("g#o", "p"),
                                                ("side", "a/000002")]
    assert mine.pid is None  # the handler's own object is left alone
    with pytest.raises(TypeError, match="dict"):
        outputs("a", {"k": b"v"}, "g#o", "g")
    with pytest.raises(ValueError, match="no sink"):
        outputs("a", b"x", None, "g")
    with pytest.raises(ValueError, match="group"):
        outputs("a", NewTask(b"x", queue="other#q"), None, "g")


def test_batch_reads_group_small_payloads_by_node() -> None:
    def ref(i: int, node: str, size: int = 10) -> PayloadRef:
        return PayloadRef(blob_id=f"b{i}", size=size, crc32c=0, replicas=[node], token="t")

    refs = [ref(0, "n1"), None, ref(2, "n2"), ref(3, "n1"), ref(4, "n1", 1 << 20)]
    assert sorted(_groups(refs)) == [("n1", [0, 3]), ("n2", [2])]
    # lease answers' long read tokens (too long for a per-id list) group by token
    long_a, long_b = "a" * 5000, "b" * 5000
    for i, tok in ((5, long_a), (6, long_b), (7, long_a)):
        refs.append(ref(i, "n1").model_copy(update={"token": tok}))
    assert sorted(_groups(refs)) == [("n1", [0, 3]), ("n1", [5, 7]), ("n1", [6]),
                                     ("n2", [2])]


def test_importing_the_client_does_not_import_pyspark() -> None:
    code = "import sys, squall.client; assert 'pyspark' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_partition_rows_from_arrow_batches_and_rows() -> None:
    import datetime as dt

    import pyarrow as pa
    from pyspark.sql import Row

    from squall.client.spark._write import WriteOptions, partition_rows

    named = WriteOptions(None, "g#q", "k", "v", "job", delay_column="d",
                         not_before_column="nb")
    when = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    batch = pa.record_batch({"k": ["a", "b"], "v": [b"1", None], "d": [1.5, None],
                             "nb": [None, when]})
    got = list(partition_rows([batch, Row(k="c", v=b"3", d=None, nb=None)], named, 7))
    assert [(t.pid, t.payload, t.delay, t.not_before) for t in got] == [
        ("a", b"1", 1.5, None), ("b", None, None, when.timestamp()), ("c", b"3", None, None)]
    derived = WriteOptions(None, "g#q", None, None, "job")
    assert [t.pid for t in partition_rows([batch], derived, 7)] == [
        derived_pid("job", 7, 0), derived_pid("job", 7, 1)]
    plain = WriteOptions(None, "g#q", "k", "v", "job")
    with pytest.raises(ValueError, match="null pid"):
        list(partition_rows([pa.record_batch({"k": [None], "v": [b""]})], plain, 0))
    for bad in ("", "x" * 1025, "a\x00b"):  # checked before any payload is uploaded
        with pytest.raises(ValueError, match="row 0 of partition 0: bad pid"):
            list(partition_rows([pa.record_batch({"k": [bad], "v": [b""]})], plain, 0))
