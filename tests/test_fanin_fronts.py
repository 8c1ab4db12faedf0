"""Batches, unique tasks and trace context through every front, with real processes: the
CLI, the async client, the master's and a data node's spans, the data node's front door
(debounce replacing a payload). The crash test and the trace round trip are
tests/test_fanin_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from squall.client import Client, NewTask, NotFound
from tests.helpers import MasterProcess, wait_for


def test_cli_batch_and_unique(tmp_path: Path) -> None:
    import json

    from typer.testing import CliRunner

    from squall.client.cli import app

    runner = CliRunner()
    m = MasterProcess(str(tmp_path / "master")).start()

    def sq(*args: str, code: int = 0) -> str:
        r = runner.invoke(app, [*args, "--master", m.url])
        assert r.exit_code == code, (r.output, r.exception)
        return r.output

    try:
        assert "batch cli#b1: 3 member(s)" in sq("batch", "create", "cli#w", "--count", "3",
                                                 "--callback", "cli#cb", "--id", "b1")
        info = json.loads(sq("batch", "show", "cli#b1", "--json"))
        assert (info["total"], info["done"], info["state"]) == (3, 0, "open")
        assert "b1" in sq("batch", "list", "cli")
        with Client(m.url) as c:
            for t in c.lease("cli#w", max_tasks=3):
                t.set_result({"pid": t.pid})
                t.done()
            (cb,) = c.lease("cli#cb")
            assert cb.batch_id == "cli#b1"
        rows = json.loads(sq("batch", "results", "cli#b1"))
        assert len(rows) == 3 and rows[0]["result"] == {"pid": rows[0]["pid"]}
        assert "open" not in sq("batch", "show", "cli#b1")
        first = sq("put", "cli#u", "--count", "1", "--key", "k", "--unique", "queued")
        assert "collapsed" in sq("put", "cli#u", "--count", "1", "--key", "k", "--unique",
                                 "queued")
        assert first.split()[1] in sq("put", "cli#u", "--count", "1", "--key", "k",
                                      "--unique", "active")
        out = sq("put", "cli#u", "--count", "1", "--unique", "queued", code=2)
        assert "key" in out
        assert "deleted batch cli#b1" in sq("batch", "delete", "cli#b1")
        assert "not" in sq("batch", "show", "cli#b1", code=1)
    finally:
        m.stop()


def test_master_spans_when_an_exporter_is_configured(tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk.trace",
                        reason="opentelemetry-sdk (the dev extra) is not installed")
    from squall.common.server.tracing import Spans

    assert Spans("master", env={}).tracer is None  # the default: nothing at all
    assert Spans("master", env={"OTEL_TRACES_EXPORTER": "none"}).tracer is None
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "50",
           "OTEL_SERVICE_NAME": "squall-test-master"}
    m = MasterProcess(str(tmp_path / "master"), env=env).start()
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    try:
        with Client(m.url) as c:
            c.put("sp#q", pid="x", traceparent=tp)
            (t,) = c.lease("sp#q")
            t.done()

        def spans() -> list[str]:
            text = Path(m.log_path).read_text(errors="replace")
            return [n for n in ("squall enqueue sp#q", "squall lease sp#q", "squall update sp")
                    if f'"name": "{n}"' in text]

        assert len(wait_for(lambda: len(spans()) == 3 and spans(), 30,
                            what="three spans in the log")) == 3
        text = Path(m.log_path).read_text(errors="replace")
        assert "0x4bf92f3577b34da6a3ce929d0e0e4736" in text  # linked to the producer
        assert "squall-test-master" in text
    finally:
        m.stop()


def test_async_client_batch_unique_and_results(tmp_path: Path) -> None:
    import asyncio

    from squall.client import AsyncClient

    m = MasterProcess(str(tmp_path / "master")).start()

    async def main() -> None:
        async with AsyncClient(m.url) as c:
            r = await c.batch([NewTask(pid=f"p{i}", queue="as#w") for i in range(3)],
                              NewTask(pid="cb", queue="as#cb"), on_dead="ignore")
            assert r.batch.startswith("as#b") and len(r.enqueued) == 3
            assert (await c.batch_info(r.batch)).pending == 3
            assert [b.batch for b in await c.list_batches("as")] == [r.batch[3:]]
            for t in await c.lease("as#w", max_tasks=3):
                assert t.batch == r.batch[3:]
                t.set_result([t.pid])
                await t.done()
            (cb,) = await c.lease("as#cb")
            assert cb.batch_id == r.batch
            assert await c.batch_results(r.batch) == {("w", f"p{i}"): [f"p{i}"]
                                                      for i in range(3)}
            await cb.done()
            with pytest.raises(NotFound):
                await c.batch_info(r.batch)
            a = await c.put("as#u", key="k", unique="queued")
            assert (await c.put("as#u", key="k", unique="queued")).pid == a.pid

    try:
        asyncio.run(main())
    finally:
        m.stop()


def test_front_door_extras_and_data_node_spans(tmp_path: Path) -> None:
    """Payloads through a data node's front door: debounce replaces the payload, unique
    and trace context pass through, and the node emits its enqueue span."""
    pytest.importorskip("opentelemetry.sdk.trace",
                        reason="opentelemetry-sdk (the dev extra) is not installed")
    from tests.helpers import DataNodeProcess

    key_env = {"SQUALL_CLUSTER_KEY": "test-cluster-key-0123456789abcdef"}
    otel = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "50"}
    m = MasterProcess(str(tmp_path / "master"), env=key_env, extra=[
        "--replication-factor", "1", "--heartbeat-interval-s", "0.2"]).start()
    dn = DataNodeProcess(str(tmp_path / "dn"), env={**key_env, **otel}, extra=[
        "--master", m.url, "--heartbeat-interval-s", "0.2"]).start()
    tp = "00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    try:
        with Client(m.url) as c:
            wait_for(lambda: any(n.state == "alive" for n in c.cluster().nodes),
                     what="the data node alive")
            first = c.put("dn#d", b"v1", key="doc", debounce=0.3, traceparent=tp)
            for v in (b"v2", b"v3"):
                r = c.put("dn#d", v, key="doc", debounce=0.3)
                assert r.collapsed and r.pid == first.pid
            got = wait_for(lambda: c.lease("dn#d", payloads=True), 30, what="the task")
            assert [t.payload() for t in got] == [b"v3"] and got[0].traceparent == tp
            got[0].done()
            a = c.put("dn#u", b"x", key="k", unique="active")
            assert c.put("dn#u", b"y", key="k", unique="active").pid == a.pid
        wait_for(lambda: '"name": "squall enqueue dn#d"' in Path(dn.log_path).read_text(
            errors="replace"), 30, what="the data node's enqueue span")
        assert "0x5bf92f3577b34da6a3ce929d0e0e4736" in Path(dn.log_path).read_text()
    finally:
        dn.stop()
        m.stop()
