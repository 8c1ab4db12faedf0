"""End to end against a real local cluster (a master and data nodes as subprocesses, as
`squall dev` starts them): a 3-stage pipeline of 10,000 tasks with atomic transitions,
payloads through a pipeline, reads that fail over when a data node dies, and `squall dev`
itself as a real subprocess."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import squall.client as sc
from squall.client import AsyncClient, Client, NewTask, Worker
from squall.client.cli.dev import DevCluster
from tests.helpers import cluster_fixture, free_port_block, start_cluster, wait_for

cluster = cluster_fixture("e2e", heartbeat_interval_s=0.5)


def test_pipeline_of_10000_tasks_none_lost_or_duplicated(cluster: DevCluster) -> None:
    n = 10_000
    finished: list[str] = []
    with Client(cluster.master_url) as c:
        assert c.put_many("pipe#s1", (NewTask(pid=f"t{i:05d}") for i in range(n)),
                          batch_size=1000) == n

    async def stage(task: sc.AsyncLeasedTask) -> NewTask | None:
        if task.name == "s1":
            return NewTask(pid=task.pid, queue="s2")
        if task.name == "s2":
            return NewTask(pid=task.pid, queue="s3")
        finished.append(task.pid)
        return None

    async def main() -> list[sc.client.worker.runtime.WorkerStats]:  # type: ignore[name-defined]
        async with AsyncClient(cluster.master_url) as ac:
            workers = [Worker(ac, ["pipe#s3", "pipe#s2", "pipe#s1"], stage, concurrency=100,
                              burst=True) for _ in range(2)]
            return list(await asyncio.wait_for(asyncio.gather(
                *(w.arun(install_signals=False) for w in workers)), 120))

    stats = asyncio.run(main())
    assert len(finished) == n and set(finished) == {f"t{i:05d}" for i in range(n)}
    assert sum(s.done for s in stats) == 3 * n
    assert sum(s.failed + s.lost for s in stats) == 0
    with Client(cluster.master_url) as c:
        for q in ("pipe#s1", "pipe#s2", "pipe#s3"):
            s = c.stats(q)
            assert (s.total, s.completed) == (0, n), q


def test_payloads_through_a_pipeline(cluster: DevCluster, tmp_path: Path) -> None:
    blobs = {f"p{i:03d}": os.urandom(1024 + i) for i in range(300)}
    big = os.urandom(5 << 20)
    (tmp_path / "file").write_bytes(big[:3 << 20])
    with Client(cluster.master_url) as c:
        c.put_many("data#in", (NewTask(v, pid=k) for k, v in blobs.items()))
        c.put("data#in", big, pid="zbig")
        c.put("data#in", tmp_path / "file", pid="zfile")  # streamed from the file
        c.put("data#in", (big[i:i + 999_999] for i in range(0, len(big), 999_999)),
              pid="zgen")  # streamed from an iterable
        info = c.task("data#in", "p000")
        assert info.payload is not None and len(info.payload.replicas) == 2
    out: dict[str, bytes] = {}

    def transform(task: sc.LeasedTask) -> NewTask | None:
        if task.name == "in":
            if task.pid.startswith("z"):
                return NewTask(b"".join(task.iter_payload(1 << 20)), pid=task.pid,
                               queue="out")
            return NewTask(task.payload()[::-1], pid=task.pid, queue="out")
        out[task.pid] = task.payload()
        return None

    with Client(cluster.master_url) as c:
        Worker(c, ["data#out", "data#in"], transform, concurrency=8, burst=True).run()
    assert out.pop("zbig") == big and out.pop("zgen") == big
    assert out.pop("zfile") == big[:3 << 20]
    assert out == {k: v[::-1] for k, v in blobs.items()}


def test_reads_fail_over_when_a_data_node_dies(tmp_path: Path) -> None:
    cl = start_cluster(tmp_path / "cl", 3, heartbeat_interval_s=0.5)
    try:
        with Client(cl.master_url) as c:
            small = {f"s{i:02d}": os.urandom(2000) for i in range(40)}
            c.put_many("fo#q", (NewTask(v, pid=k) for k, v in small.items()))
            big = os.urandom(24 << 20)
            c.put("fo#q", big, pid="zz")
            tasks = c.lease("fo#q", 100, 120)
            [tbig] = [t for t in tasks if t.pid == "zz"]
            assert tbig.payload_ref is not None
            first = tbig.payload_ref.replicas[0]
            victim = next(i for i in cl.node_procs if cl.node_url(i) == first)
            stream = tbig.iter_payload(256 << 10)
            got = [next(stream)]
            cl.kill_node(victim)  # mid-stream: the read resumes on the other replica
            got += list(stream)
            assert b"".join(got) == big
            assert first in c._core.blobs.nodes._failed  # it did switch replicas
            for t in tasks:
                if t.pid != "zz":
                    assert t.payload() == small[t.pid]  # every blob has a live copy
            c.done(tasks)
            # the master notices the death and re-replicates: nothing stays under-replicated
            wait_for(lambda: c.cluster().under_replicated == 0 and sum(
                n.state == "alive" for n in c.cluster().nodes) == 2, 60,
                what="re-replication after the node died")
    finally:
        cl.stop()


def test_squall_dev_subprocess_restart_keeps_data(tmp_path: Path) -> None:
    squall = [sys.executable, "-c", "from squall.client.cli import main; main()"]
    port = free_port_block(3)
    data = tmp_path / "dev"
    env = {**os.environ, "SQUALL_MASTER": f"http://127.0.0.1:{port}"}

    def start() -> subprocess.Popen[str]:
        p = subprocess.Popen([*squall, "dev", "--nodes", "2", "--data-dir", str(data),
                              "--port", str(port)], stdout=subprocess.PIPE, text=True, env=env)
        assert p.stdout is not None
        deadline = time.monotonic() + 60
        for line in p.stdout:
            if "is up" in line or time.monotonic() > deadline:
                break
        assert p.poll() is None, "squall dev exited"
        return p

    def cli(*args: str, stdin: str | None = None) -> str:
        r = subprocess.run([*squall, *args], capture_output=True, text=True, env=env,
                           input=stdin, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout

    def stop(p: subprocess.Popen[str]) -> None:
        p.send_signal(signal.SIGINT)
        rest, _ = p.communicate(timeout=60)
        assert p.returncode == 0 and "stopped" in rest

    p = start()
    try:
        assert "enqueued 2 task(s)" in cli("put", "demo#x", "hello", "world")
        assert "enqueued 3 task(s)" in cli("put", "demo#x", "--lines", "-", stdin="a\nb\nc\n")
        rows = json.loads(cli("lease", "demo#x", "-n", "1", "--payload", "--done", "--json"))
        assert rows[0]["payload"] == "hello"
        assert "data nodes" in cli("nodes")
    finally:
        stop(p)
    assert not [ln for ln in (data / "logs" / "master.log").read_text().splitlines()
                if "Traceback" in ln]
    p = start()
    try:
        rows = json.loads(cli("lease", "demo#x", "-n", "10", "--payload", "--done", "--json"))
        assert [r["payload"] for r in rows] == ["world", "a", "b", "c"]
    finally:
        stop(p)
