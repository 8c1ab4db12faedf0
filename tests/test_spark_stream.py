"""Structured Streaming over a queue: ``readStream.format("squall")`` leases micro-batch by
micro-batch and dequeues at commit; ``writeStream.format("squall")`` collapses by pid. A
query killed (kill -9 of its whole driver) and restarted from its checkpoint moves every
task exactly once into the next queue; so does a query during which a data node dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from squall.client import NewTask
from squall.common.models import QueueStats
from tests.helpers import wait_for
from tests.spark_kit import Cluster, cluster, lease_all, spark, total

__all__ = ["cluster", "spark"]  # module fixtures


def start_query(spark: SparkSession, url: str, src: str, dst: str, ckpt: str,
                per_batch: int = 40) -> StreamingQuery:
    """src -> (payload + b"!") -> dst, keyed by the source pid."""
    df = (spark.readStream.format("squall").option("master", url).option("queue", src)
          .option("with_payload", "true").option("max_tasks_per_batch", str(per_batch))
          .option("lease_secs", "6").load())
    out = df.select("pid", F.concat("payload", F.lit("!").cast("binary")).alias("out"))
    return (out.writeStream.format("squall").option("master", url).option("queue", dst)
            .option("pid", "pid").option("payload", "out")
            .option("checkpointLocation", ckpt).trigger(processingTime="200 milliseconds")
            .start())


JOB = """
import sys, time
sys.path.insert(0, {root!r})
from squall.client.spark import local_session
from tests.test_spark_stream import start_query
spark = local_session("stream-job", "local[2]")
for attempt in range(5):  # a failed query restarts from its checkpoint, as its user would
    q = start_query(spark, {url!r}, {src!r}, {dst!r}, {ckpt!r})
    try:
        q.awaitTermination(600)
        break
    except Exception as e:  # e.g. a Python worker too slow to start on a loaded machine
        print("query failed; restarting from the checkpoint:", e, flush=True)
"""


def payloads(n: int, prefix: str) -> dict[str, bytes]:
    return {f"{prefix}{i:04d}": f"{prefix}-{i}".encode() * (1 + i % 50) for i in range(n)}


def check_exactly_once(cl: Cluster, dst: str, want: dict[str, bytes]) -> None:
    st = cl.client.stats(dst)
    assert isinstance(st, QueueStats)
    assert st.total == st.enqueued_total == len(want), st  # each enqueued once, none lost
    moved = lease_all(cl.client, dst, len(want))
    assert {t.pid: t.payload() for t in moved} == {p: v + b"!" for p, v in want.items()}
    cl.client.done(moved)


def drain(start: Callable[[], StreamingQuery], cl: Cluster, src: str, dst: str, n: int,
          restarts: int = 0) -> list[BaseException]:
    """Run the query until the source is empty (dequeues happen at commit) and the sink
    holds `n` tasks; a query that fails is restarted from its checkpoint up to `restarts`
    times (what its user would do). Returns the failures."""
    failures: list[BaseException] = []
    q = start()

    def finished() -> bool:
        nonlocal q
        if q.exception() is not None:
            failures.append(q.exception())  # type: ignore[arg-type]
            assert len(failures) <= restarts, f"the query failed: {failures}"
            q = start()
        return total(cl.client, src) == 0 and total(cl.client, dst) == n

    try:
        wait_for(finished, timeout=900, interval=0.2, what="the stream to drain the queue")
    finally:
        q.stop()
    return failures


@pytest.mark.timeout(1800)  # two Spark drivers start; slow on a loaded machine
def test_stream_killed_and_restarted_from_checkpoint_moves_each_task_once(
        spark: SparkSession, cluster: Cluster, tmp_path: Path) -> None:
    src, dst, ckpt = "str#in", "str#out", str(tmp_path / "ckpt")
    want = payloads(400, "s")
    cluster.client.put_many(src, [NewTask(v, pid=p) for p, v in want.items()])
    root = str(Path(__file__).resolve().parents[1])
    code = JOB.format(root=root, url=cluster.url, src=src, dst=dst, ckpt=ckpt)
    log = tmp_path / "job.log"
    with open(log, "wb") as out:
        job = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                               stdout=out, stderr=subprocess.STDOUT)
    try:
        try:
            wait_for(lambda: total(cluster.client, dst) >= 80 or job.poll() is not None,
                     timeout=600, interval=0.05, what="the first query under way")
        except TimeoutError as e:
            raise AssertionError(f"{e}: {log.read_text()[-3000:]}") from None
        assert job.poll() is None, f"the job ended by itself: {log.read_text()[-3000:]}"
        os.killpg(job.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    left = total(cluster.client, src)
    assert 0 < left < len(want), f"the kill came too late to test anything ({left} left)"

    # restarts from the checkpoint are allowed (a loaded machine can fail a micro-batch):
    # each one is another replay that must keep the result exactly once
    drain(lambda: start_query(spark, cluster.url, src, dst, ckpt), cluster, src, dst,
          len(want), restarts=3)
    check_exactly_once(cluster, dst, want)


@pytest.mark.slow  # a cluster of its own
@pytest.mark.timeout(1800)
def test_stream_survives_a_data_node_killed_mid_batch(spark: SparkSession,
                                                      tmp_path: Path) -> None:
    cl = Cluster(tmp_path)
    try:
        src, dst, ckpt = "strk#in", "strk#out", str(tmp_path / "ckpt")
        want = payloads(300, "k")
        cl.client.put_many(src, [NewTask(v, pid=p) for p, v in want.items()])
        killed = threading.Event()

        def killer() -> None:
            wait_for(lambda: total(cl.client, dst) >= 60, timeout=600, interval=0.02,
                     what="the query under way")
            cl.nodes[0].kill9()
            killed.set()

        t = threading.Thread(target=killer, daemon=True)
        t.start()
        # a micro-batch caught by the kill may fail the query (its Spark task's retry can
        # hit the dead node too): a restart from the checkpoint must then finish the job,
        # still exactly once
        drain(lambda: start_query(spark, cl.url, src, dst, ckpt, per_batch=20), cl, src,
              dst, len(want), restarts=3)
        t.join(5)
        assert killed.is_set(), "the query finished before the kill"
        check_exactly_once(cl, dst, want)
    finally:
        cl.close()
