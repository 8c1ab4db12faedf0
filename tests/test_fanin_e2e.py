"""Batches, unique tasks, debounce and trace context with real processes.

- A batch of 1,000 members run by Worker processes, two of them killed (kill -9) mid-batch
  and the master killed and restarted too: the callback is enqueued exactly once, after
  every member, and reads all 1,000 results.
- Unique and debounce through HTTP (the client against a master process; the CLI, the
  async client, the front door and server spans are in tests/test_fanin_fronts.py); a bad
  traceparent is a 400.
- Trace context round trip: a producer span around ``put``, a Worker's consumer span linked
  to it (a child of it on the first attempt, a new trace with a link on a retry), through
  opentelemetry-sdk's in-memory exporter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from squall.client import Client, NewTask, NotFound, Worker
from tests.helpers import ADMIN, MasterProcess, wait_for

WORK, MERGE = "fan#work", "fan#merge"
N = 1000

WORKER = textwrap.dedent("""
    import json, sys, time
    from squall.client import Client, Worker

    master, log = sys.argv[1], sys.argv[2]
    f = open(log, "a", buffering=1)

    def handler(task):
        if task.callback_of is not None:  # the batch's callback: read every result
            with Client(master) as c:
                info = c.batch_info(task.batch_id)
                results = c.batch_results(task.batch_id)
            f.write(json.dumps({"callback": task.pid, "done": info.done,
                                "n": len(results), "sum": sum(results.values())}) + "\\n")
            return None
        time.sleep(0.004)
        task.set_result(int(task.pid[1:]))
        f.write(json.dumps({"member": task.pid}) + "\\n")
        return None

    Worker(Client(master), [sys.argv[3], sys.argv[4]], handler, concurrency=8,
           lease_secs=2.0, wait_s=0.2, grace_s=0.5).run()
""")


def start_worker(master: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", WORKER, master, str(log), WORK, MERGE],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def lines(logs: Path) -> list[dict[str, Any]]:
    import json

    out = []
    for p in logs.glob("*.log"):
        for line in p.read_text().splitlines():
            if line.endswith("}"):
                out.append(json.loads(line))
    return out


def done_members(c: Client) -> int:
    try:
        return c.batch_info("fan#big").done
    except NotFound:
        return N


def test_batch_of_1000_with_workers_killed_has_one_callback(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    m = MasterProcess(str(tmp_path / "master")).start()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with Client(m.url) as c:
            res = c.batch([NewTask(pid=f"m{i:04d}", queue=WORK) for i in range(N)],
                          NewTask(pid="merge", queue=MERGE), batch_id="big")
            assert res.batch == "fan#big" and len(res.enqueued) == N
            procs = [start_worker(m.url, logs / f"w{i}.log") for i in range(4)]
            wait_for(lambda: done_members(c) >= 200, 120, what="200 members done")
            for p in procs[:2]:
                p.kill()  # kill -9 mid-batch: their leased tasks come back after 2 s
            wait_for(lambda: done_members(c) >= 500, 120, what="500 members done")
            m.kill9()  # and the master, mid-batch
        m = MasterProcess(str(tmp_path / "master"), port=m.port).start()
        procs += [start_worker(m.url, logs / f"w{i}.log") for i in range(4, 6)]
        with Client(m.url) as c:
            wait_for(lambda: any("callback" in x for x in lines(logs)), 180,
                     what="the callback ran")
            wait_for(lambda: c.stats(MERGE).completed == 1, 60, what="the callback acked")
            with pytest.raises(NotFound):  # its callback done: the batch is gone
                c.batch_info("fan#big")
            callbacks = [x for x in lines(logs) if "callback" in x]
            assert len(callbacks) == 1
            # after every member, with every member's result
            assert callbacks[0] == {"callback": "merge", "done": N, "n": N,
                                    "sum": N * (N - 1) // 2}
            st = c.stats(MERGE)
            assert st.enqueued_total == 1 and st.total == 0  # enqueued exactly once
            assert c.stats(WORK).completed == N
            members = {x["member"] for x in lines(logs) if "member" in x}
            assert members == {f"m{i:04d}" for i in range(N)}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait(30)
        m.stop()


def test_unique_and_debounce_through_http(tmp_path: Path) -> None:
    m = MasterProcess(str(tmp_path / "master")).start()
    try:
        with Client(m.url) as c:
            a = c.put("u#q", key="acct-1", unique="active")
            b = c.put("u#q", key="acct-1", unique="active")
            assert not a.collapsed and b.collapsed and b.pid == a.pid
            (t,) = c.lease("u#q", max_tasks=5)
            assert c.put("u#q", key="acct-1", unique="active").collapsed  # it runs
            assert not c.put("u#q", key="acct-1", unique="queued").collapsed
            t.done()
            first = c.put("u#d", key="doc-9", debounce=0.3, debounce_max=30)
            for _ in range(4):
                r = c.put("u#d", key="doc-9", debounce=0.3)
                assert r.collapsed and r.pid == first.pid
            assert c.lease("u#d") == []  # still held back
            info = c.task("u#d", first.pid)
            assert info.state == "delayed"
            got = wait_for(lambda: c.lease("u#d"), 30, what="the debounced task")
            assert [x.pid for x in got] == [first.pid]
            assert not c.put("u#d", key="doc-9", debounce=0.3).collapsed  # it runs: new
            tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            c.put("u#t", pid="traced", traceparent=tp)
            (lt,) = c.lease("u#t")
            assert lt.traceparent == tp
            for bad in (tp.upper(), tp[:-1], "00-" + "0" * 32 + tp[35:], "x" * 10_000):
                r = httpx.post(m.url + "/v1/groups/u/queues/t/tasks",
                               json={"tasks": [{"traceparent": bad}]}, headers=ADMIN,
                               timeout=10)
                assert r.status_code == 400, (bad[:60], r.text)
                assert "traceparent" in r.text
    finally:
        m.stop()


def test_trace_context_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk.trace",
                        reason="opentelemetry-sdk (the dev extra) is not installed")
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    # the Worker and the client use the global provider: set it for this test only
    old = trace._TRACER_PROVIDER
    trace._TRACER_PROVIDER = provider
    m = MasterProcess(str(tmp_path / "master")).start()
    try:
        with Client(m.url) as c:
            c.set_policy("tr#q", max_attempts=5)
            with tracer.start_as_current_span("produce") as producer:
                c.put("tr#q", pid="a")
                c.put("tr#q", pid="b")
            seen: dict[str, list[Any]] = {"a": [], "b": []}

            def handler(task: Any) -> None:
                seen[task.pid].append(trace.get_current_span().get_span_context())
                if task.pid == "b" and task.attempts == 1:
                    raise RuntimeError("first attempt fails")

            Worker(c, ["tr#q"], handler, concurrency=2, burst=True, lease_secs=10.0,
                   wait_s=0.1).run()
            wait_for(lambda: c.stats("tr#q").completed == 2, 30, what="both tasks done")
            if len(seen["b"]) < 2:
                Worker(c, ["tr#q"], handler, burst=True).run()
        pctx = producer.get_span_context()
        spans = [s for s in exporter.get_finished_spans() if s.name == "process tr#q"]
        assert len(spans) == 3  # a, b's failed attempt, b's retry
        for s in spans:
            assert s.kind == trace.SpanKind.CONSUMER
            assert [lk.context.span_id for lk in s.links] == [pctx.span_id]
            assert s.attributes["messaging.destination.name"] == "tr#q"
        by_attempt = sorted(spans, key=lambda s: s.attributes["messaging.squall.attempts"])
        first, retry = by_attempt[0], by_attempt[-1]
        assert first.context.trace_id == pctx.trace_id and first.parent is not None
        assert first.parent.span_id == pctx.span_id  # the first attempt: a child
        assert retry.attributes["messaging.squall.attempts"] == 2
        assert retry.context.trace_id != pctx.trace_id and retry.parent is None  # new trace
        # the handler ran inside its span (a sync handler: in the Worker's thread)
        assert seen["a"][0].span_id in {s.context.span_id for s in spans}
    finally:
        trace._TRACER_PROVIDER = old
        m.stop()
