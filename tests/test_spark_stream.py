"""Structured Streaming over a queue: ``readStream.format("squall")`` leases micro-batch by
micro-batch and dequeues ("settles") a micro-batch once the sink committed it;
``writeStream.format("squall")`` collapses by pid.

The offset protocol is tested first without Spark (the calls Spark makes, in its order,
against a real master); then end to end: a query killed with kill -9 of its whole driver
in the middle of a micro-batch (part of the batch's outputs already in the sink) and
restarted from its checkpoint moves every task exactly once into the next queue, and so
does a query during whose micro-batch a data node is killed. A micro-batch is held open at
a chosen task by a UDF waiting on a gate file, so the kill lands where the test says, not
where the scheduler happens to be."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql import Column, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.streaming.datasource import ReadMaxRows

from squall.client import Client, NewTask
from squall.client.spark._stream import SquallStreamReader, StreamOptions, TasksPartition
from squall.common.wire.models import QueueStats
from tests.helpers import MasterProcess, wait_for
from tests.spark_kit import Cluster, cluster, lease_all, spark, total

__all__ = ["cluster", "spark"]  # module fixtures

N, PER_BATCH, PER_PART = 120, 20, 5  # 6 micro-batches of 4 Spark partitions


def stats(c: Client, queue: str) -> QueueStats:
    st = c.stats(queue)
    assert isinstance(st, QueueStats)
    return st


# -- the offset protocol, as Spark drives it (no Spark needed) ---------------------------
def reader(url: str, queue: str, lease_secs: float = 30.0) -> SquallStreamReader:
    return SquallStreamReader(StreamOptions(master=url, queue=queue, max_tasks_per_batch=3,
                                            lease_secs=lease_secs))


def pids(offset: dict[str, Any]) -> list[str]:
    return [p for p, _ in offset["tasks"]]


def test_last_micro_batch_is_settled_without_new_data(master_proc: MasterProcess) -> None:
    """Spark commits a micro-batch's source offsets only when it constructs the next one;
    the next trigger's latestOffset settles it instead, so the queue drains."""
    c, q = Client(master_proc.url), "sp#in"
    c.put_many(q, [NewTask(pid=f"t{i}") for i in range(5)])
    r = reader(master_proc.url, q)
    try:
        o0 = r.initialOffset()
        o1 = r.latestOffset(o0, ReadMaxRows(3))
        assert pids(o1) == ["t0", "t1", "t2"] and o1["batch"] == 1
        assert [len(p.tasks) for p in r.partitions(o0, o1)  # type: ignore[attr-defined]
                ] == [3]
        o2 = r.latestOffset(o1, ReadMaxRows(3))  # batch 1 is in the commit log by now
        assert pids(o2) == ["t3", "t4"] and stats(c, q).completed == 3
        r.commit(o1)  # Spark's own commit of batch 1: already settled, a no-op
        assert r.latestOffset(o2, ReadMaxRows(3)) == o2  # no new data: no new micro-batch
        st = stats(c, q)
        assert (st.total, st.completed) == (0, 5), st
        r.commit(o2)
        assert r.latestOffset(o2, ReadMaxRows(3)) == o2
    finally:
        r.stop()
        c.close()


def test_restart_settles_with_expired_tokens_before_leasing(master_proc: MasterProcess
                                                             ) -> None:
    """A query killed mid-batch whose leases expired while it was down: the restarted one
    re-runs the logged micro-batch with the dead query's tokens, then settles it with them,
    and only then leases: no task is leased twice, none is lost."""
    c, q = Client(master_proc.url), "sp#re"
    c.put_many(q, [NewTask(pid=f"t{i}") for i in range(6)])
    dead = reader(master_proc.url, q, lease_secs=1.0)
    o0 = dead.initialOffset()
    o1 = dead.latestOffset(o0, None)
    dead.stop()  # killed: its renewals stop, its leases run out
    wait_for(lambda: all(c.task(q, p).state == "available" for p in pids(o1)), 30,
             what="the dead query's leases to expire")
    r = reader(master_proc.url, q, lease_secs=1.0)
    try:
        parts = r.partitions(o0, o1)  # the replay of the logged micro-batch
        rows = [row for p in parts for row in r.read(p)]
        assert sorted(row[1] for row in rows) == pids(o1)
        o2 = r.latestOffset(o1, None)  # batch 1 committed: settle it, then lease
        assert set(pids(o2)).isdisjoint(pids(o1)), "a task of a logged batch leased again"
        assert sorted(pids(o2)) == ["t3", "t4", "t5"] and stats(c, q).completed == 3
        # a later replay of an already settled micro-batch reads nothing twice
        assert [row for row in r.read(TasksPartition(o1["tasks"]))] == []
        r.latestOffset(o2, None)
        assert stats(c, q).completed == 6 and total(c, q) == 0
    finally:
        r.stop()
        c.close()


# -- end to end, on Spark ------------------------------------------------------------------
def concat_bang() -> Column:
    return F.concat("payload", F.lit("!").cast("binary"))


def start_query(spark: SparkSession, url: str, src: str, dst: str, ckpt: str,
                out: Callable[[], Column] = concat_bang) -> StreamingQuery:
    """src -> (payload + b"!") -> dst, keyed by the source pid."""
    df = (spark.readStream.format("squall").option("master", url).option("queue", src)
          .option("with_payload", "true").option("max_tasks_per_batch", str(PER_BATCH))
          .option("tasks_per_partition", str(PER_PART)).option("lease_secs", "6").load())
    return (df.select("pid", out().alias("out")).writeStream.format("squall")
            .option("master", url).option("queue", dst)
            .option("pid", "pid").option("payload", "out")
            .option("checkpointLocation", ckpt).trigger(processingTime="100 milliseconds")
            .start())


def gated(hold_pid: str, blocked: str, gate: str) -> Callable[[], Column]:
    """payload + b"!", but the task `hold_pid` waits (in its Python UDF worker) until the
    file `gate` exists, having created `blocked`: its micro-batch stays open until then."""
    def out() -> Column:
        def bang(pid: str, payload: bytes) -> bytes:
            import os

            from tests.helpers import wait_for

            if pid == hold_pid:
                open(blocked, "w").close()
                wait_for(lambda: os.path.exists(gate), 300, what="the test to open the gate")
            return payload + b"!"

        return F.udf(bang, "binary", useArrow=False)("pid", "payload")

    return out


JOB = """
import sys
sys.path.insert(0, {root!r})
from squall.client.spark import local_session
from tests.test_spark_stream import gated, start_query
spark = local_session("stream-job", "local[2]")
q = start_query(spark, {url!r}, {src!r}, {dst!r}, {ckpt!r}, gated({hold!r}, {blocked!r}, "/"))
q.awaitTermination(300)
"""


def payloads(prefix: str) -> dict[str, bytes]:
    return {f"{prefix}{i:04d}": f"{prefix}-{i}".encode() * (1 + i % 50) for i in range(N)}


def check_exactly_once(c: Client, src: str, dst: str, want: dict[str, bytes]) -> None:
    st = stats(c, dst)
    assert st.total == st.enqueued_total == len(want), st  # each enqueued once, none lost
    assert stats(c, src).completed == len(want)  # each left the source once
    moved = lease_all(c, dst, len(want))
    assert {t.pid: t.payload() for t in moved} == {p: v + b"!" for p, v in want.items()}
    c.done(moved)


def drain(start: Callable[[], StreamingQuery], c: Client, src: str, dst: str, n: int,
          restarts: int = 0, timeout: float = 240) -> list[BaseException]:
    """Run the query until the source is empty and the sink holds `n` tasks; a query that
    fails is restarted from its checkpoint up to `restarts` times (what its user would do).
    Returns the failures."""
    failures: list[BaseException] = []
    q = start()

    def finished() -> bool:
        nonlocal q
        if q.exception() is not None:
            failures.append(q.exception())  # type: ignore[arg-type]
            if len(failures) > restarts:
                raise AssertionError(f"the query failed: {failures}")
            q = start()
        return total(c, src) == 0 and total(c, dst) == n

    try:
        wait_for(finished, timeout=timeout, interval=0.1, what="the stream to drain")
    except TimeoutError as e:
        if isinstance(e.__cause__, AssertionError):
            raise e.__cause__ from None
        raise
    finally:
        q.stop()
    return failures


def logged(ckpt: str, kind: str) -> set[str]:
    d = Path(ckpt) / kind
    return {f.name for f in d.iterdir() if f.name.isdigit()} if d.exists() else set()


@pytest.mark.timeout(420)  # two Spark drivers start (one of them twice as slow under load)
def test_stream_killed_mid_batch_and_restarted_moves_each_task_once(
        spark: SparkSession, cluster: Cluster, tmp_path: Path) -> None:
    src, dst, ckpt = "str#in", "str#out", str(tmp_path / "ckpt")
    want = payloads("s")
    cluster.client.put_many(src, [NewTask(v, pid=p) for p, v in want.items()])
    blocked = tmp_path / "blocked"
    # micro-batch 2 = s0040..s0059 in 4 Spark tasks; the last one is held at s0055
    code = JOB.format(root=str(Path(__file__).resolve().parents[1]), url=cluster.url,
                      src=src, dst=dst, ckpt=ckpt, hold="s0055", blocked=str(blocked))
    log = tmp_path / "job.log"
    with open(log, "wb") as out:
        job = subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                               stdout=out, stderr=subprocess.STDOUT)
    try:
        try:  # the other three Spark tasks of micro-batch 2 reached the sink
            wait_for(lambda: (blocked.exists() and total(cluster.client, dst) >= 55)
                     or job.poll() is not None, timeout=300, interval=0.05,
                     what="micro-batch 2 held open with part of it in the sink")
        except TimeoutError as e:
            raise AssertionError(f"{e}: {log.read_text()[-3000:]}") from None
        assert job.poll() is None, f"the job ended by itself: {log.read_text()[-3000:]}"
        os.killpg(job.pid, signal.SIGKILL)  # the driver, its JVM and its Python workers
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    # killed in the middle of micro-batch 2: logged as an offset, not committed
    assert (logged(ckpt, "offsets"), logged(ckpt, "commits")) == ({"0", "1", "2"},
                                                                  {"0", "1"})
    assert stats(cluster.client, src).completed == 2 * PER_BATCH  # batch 1 settled at 2
    drain(lambda: start_query(spark, cluster.url, src, dst, ckpt), cluster.client, src,
          dst, N)
    check_exactly_once(cluster.client, src, dst, want)


@pytest.mark.timeout(300)
def test_stream_survives_a_data_node_killed_mid_batch(spark: SparkSession,
                                                      tmp_path: Path) -> None:
    cl = Cluster(tmp_path)
    try:
        src, dst, ckpt = "strk#in", "strk#out", str(tmp_path / "ckpt")
        want = payloads("k")
        cl.client.put_many(src, [NewTask(v, pid=p) for p, v in want.items()])
        blocked, gate = tmp_path / "blocked", tmp_path / "gate"
        # micro-batch 1's first Spark task is held at k0020 while the node dies; the rest
        # of that micro-batch and every later one read and write with one node gone
        out = gated("k0020", str(blocked), str(gate))

        def start() -> StreamingQuery:
            return start_query(spark, cl.url, src, dst, ckpt, out)

        q = start()
        try:
            wait_for(lambda: blocked.exists() or q.exception() is not None, 120,
                     interval=0.05, what="micro-batch 1 held open")
            assert q.exception() is None, q.exception()
            cl.nodes[0].kill9()
            gate.touch()
        finally:
            q.stop()  # a stop is no crash, but the rest runs on a fresh query either way
        assert "1" in logged(ckpt, "offsets")
        # a micro-batch caught by the kill may fail the query (its Spark task's retry can
        # hit the dead node too): a restart from the checkpoint must then finish the job,
        # still exactly once
        drain(start, cl.client, src, dst, N, restarts=2)
        check_exactly_once(cl.client, src, dst, want)
    finally:
        cl.close()
