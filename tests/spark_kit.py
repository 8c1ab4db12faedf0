"""Shared pieces of the Spark tests: a real cluster (a master and data nodes as processes,
replication factor 2, heartbeats every 0.2 s) and small helpers. Each test module makes its
own cluster and one SparkSession (``local[2,2]``: two cores, a failed Spark task is tried
once more, as on a cluster)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from squall.client import Client, LeasedTask, NotFound
from squall.client.spark import local_session
from squall.common.wire.models import QueueStats
from tests.helpers import DataNodeProcess, MasterProcess, start_all, wait_for

KEY = "test-spark-key-0123456789abcdef01"
ENV = {"SQUALL_CLUSTER_KEY": KEY}
BEAT = ["--heartbeat-interval-s", "0.2"]
START_S = 120.0  # a server's start-up on a loaded two-core machine (a Spark JVM is starting)


class Cluster:
    def __init__(self, tmp: Path, nodes: int = 3) -> None:
        self.master = MasterProcess(str(tmp / "master"), env=ENV, extra=[
            *BEAT, "--dead-after-beats", "3", "--replication-factor", "2"]).start(START_S)
        self.nodes = [DataNodeProcess(str(tmp / f"dn{i}"), env=ENV,
                                      extra=["--master", self.master.url, *BEAT])
                      for i in range(nodes)]
        start_all(self.nodes, START_S)
        self.client = Client(self.master.url)
        wait_for(lambda: self.alive() == nodes, START_S, what="data nodes alive")

    @property
    def url(self) -> str:
        return self.master.url

    def alive(self) -> int:
        return sum(n.state == "alive" for n in self.client.cluster().nodes)

    def close(self) -> None:
        self.client.close()
        for p in [*self.nodes, self.master]:
            p.stop()


def expected(i: int, reps: int) -> bytes:
    return (hashlib.sha256(str(i).encode()).hexdigest() * reps).encode()


def total(c: Client, queue: str) -> int:
    try:
        st = c.stats(queue)
    except NotFound:
        return 0
    assert isinstance(st, QueueStats)
    return st.total


def lease_all(c: Client, queue: str, n: int) -> list[LeasedTask]:
    out: list[LeasedTask] = []
    while len(out) < n:
        got = c.lease(queue, max_tasks=1000, lease_secs=300)
        assert got, f"only {len(out)} of {n} tasks leasable"
        out += got
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    # Spark's scratch (block manager, shuffle) under the test's temp dir, removed with it
    scratch = str(tmp_path_factory.mktemp("spark-local"))
    s = local_session("squall-tests", "local[2,2]", conf={"spark.local.dir": scratch})
    try:
        yield s
    finally:
        s.stop()


def hold_until_renewed(master: str, queue: str, pid: str, times: int,
                       timeout: float = 90.0) -> None:
    """Hold a handler until the master has extended the lease of task `pid` of `queue`
    `times` times (the stage renews every lease_secs / 3): it outlives its lease, as the
    master counts it, with no clock of its own. Runs in Spark's Python workers too."""
    seen: list[float] = []
    with Client(master) as c:
        def renewed() -> bool:
            exp = c.task(queue, pid).expires_at
            if exp is not None and (not seen or exp > seen[-1]):
                seen.append(exp)
            return len(seen) > times

        wait_for(renewed, timeout, interval=0.05, what=f"{times} renewals of {pid}'s lease")
