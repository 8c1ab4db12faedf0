"""``run_stage`` beyond the basics: a slow handler among fast ones never makes finished
results run again (the whole batch's leases are renewed), and Arrow-batched handlers."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql import SparkSession

from squall.client import Client, NewTask
from squall.client.spark import run_stage
from squall.client.spark._stage import StageLoop, StageSpec
from tests.spark_kit import Cluster, cluster, hold_until_renewed, lease_all, spark, total

__all__ = ["cluster", "spark"]  # module fixtures


def test_slow_handler_among_fast_ones_runs_nothing_twice(cluster: Cluster) -> None:
    """One handler outlives the lease twice over while the others finish at once: every
    finished result is held (and its lease renewed) until the batch commits."""
    c, src, sink, n, lease = cluster.client, "slow#in", "slow#out", 10, 1.5
    c.put_many(src, [NewTask(str(i).encode(), pid=f"s{i:02d}") for i in range(n)])
    runs: list[str] = []
    lock = threading.Lock()

    def handler(pid: str, data: bytes) -> bytes:
        with lock:
            runs.append(pid)
        if pid == "s03":  # its lease renewed 8 times (every lease / 3): 2.7 leases long
            hold_until_renewed(cluster.url, src, pid, 8)
        return data + b"!"

    spec = StageSpec(cluster.url, src, sink, lease, batch_size=n, threads=2, with_pid=True,
                     max_attempts=None, deadline=time.time() + 60)
    with Client(cluster.url) as own:
        res = StageLoop(own, spec, handler).run(None)
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
    log, url = str(tmp_path / "runs"), cluster.url

    def handler(pid: str, data: bytes) -> bytes:
        import os

        from tests.spark_kit import hold_until_renewed

        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{pid}\n".encode())
        os.close(fd)
        if pid == "t04":  # 2.7 leases long, as the master counts it
            hold_until_renewed(url, src, pid, 8)
        return data

    res = run_stage(spark, src, handler, sink, parallelism=2, lease_secs=lease,
                    batch_size=10, with_pid=True, master=cluster.url, timeout_s=120)
    assert (res.done, res.leased, res.lost) == (n, n, 0), res
    assert sorted(Path(log).read_text().split()) == [f"t{i:02d}" for i in range(n)]
    assert total(c, sink) == n


SIZES = [0, 1, 1 << 20, 100, 65_536, 0, 1 << 20, 7, 256 << 10, (256 << 10) + 1]


def test_arrow_batched_handler_moves_each_batch_atomically(spark: SparkSession,
                                                           cluster: Cluster,
                                                           tmp_path: Path) -> None:
    """Mixed payloads (0 B to 1 MiB) reach the handler as one RecordBatch per leased batch;
    a batch whose handler raises is released whole and done again; outputs of a batch
    land with its dequeues."""
    c, src, sink = cluster.client, "arrow#in", "arrow#out"
    n = 2 * len(SIZES)
    payloads = {f"b{i:02d}": bytes([i]) * SIZES[i % len(SIZES)] for i in range(n)}
    c.put_many(src, [NewTask(p, pid=pid) for pid, p in payloads.items()])
    marker = str(tmp_path / "failed-once")

    def handler(batch):  # type: ignore[no-untyped-def]
        import hashlib
        import os

        import pyarrow as pa

        assert isinstance(batch, pa.RecordBatch)
        assert batch.schema.names == ["pid", "payload", "attempts"]
        if "b07" in batch.column("pid").to_pylist() and not os.path.exists(marker):
            open(marker, "w").close()
            raise RuntimeError("the first batch holding b07 fails")
        return pa.table({
            "pid": [p + ".sum" for p in batch.column("pid").to_pylist()],
            "payload": [hashlib.sha256(d).hexdigest().encode() + b"/" + str(len(d)).encode()
                        + b"/" + str(len(batch)).encode()
                        for d in batch.column("payload").to_pylist()]})

    res = run_stage(spark, src, handler, sink, parallelism=2, batch_size=5, batch=True,
                    lease_secs=30, master=cluster.url, timeout_s=120)
    assert os.path.exists(marker)
    assert (res.done, res.failed, res.lost, res.outputs) == (n, 5, 0, n), res
    assert total(c, src) == 0 and total(c, sink) == n
    moved = lease_all(c, sink, n)
    got = {t.pid: t.payload().split(b"/") for t in moved}
    for pid, p in payloads.items():
        digest, size, batch_len = got[pid + ".sum"]
        assert digest == hashlib.sha256(p).hexdigest().encode() and int(size) == len(p)
        assert 1 <= int(batch_len) <= 5
    c.done(moved)


def test_batch_outputs_shapes() -> None:
    import pyarrow as pa

    from squall.client.spark._arrow import batch_outputs

    assert batch_outputs(None, "g#o", "g") == []
    outs = batch_outputs(pa.record_batch({"pid": ["x"], "payload": [b"1"]}), "g#o", "g")
    assert [(t.queue, t.pid, t.payload) for t in outs] == [("g#o", "x", b"1")]
    outs = batch_outputs({"pid": ["y"], "payload": [b"2"], "queue": ["g#side"]}, None, "g")
    assert [(t.queue, t.pid) for t in outs] == [("g#side", "y")]
    assert [t.pid for t in batch_outputs([("z", b"3")], "g#o", "g")] == ["z"]
    with pytest.raises(ValueError, match="no pid"):
        batch_outputs([b"anonymous"], "g#o", "g")
    with pytest.raises(ValueError, match="'pid' and 'payload'"):
        batch_outputs({"payload": [b"1"]}, "g#o", "g")
    with pytest.raises(TypeError, match="RecordBatch"):
        batch_outputs(42, "g#o", "g")
