"""Metrics, the dashboard's JSON, offline API docs and the cancel verb, against an in-process
master on an injected clock: counters only grow (a deleted queue does not lower them),
per-queue series are bounded, a cancelled task is gone and a leased one refused."""

from __future__ import annotations

import re
from typing import Any

import pytest

from squall.client import AsyncClient
from squall.common.clock import ManualClock
from squall.master import telemetry
from tests.test_admin import Api, ok
from tests.test_api import lease, put, update


def metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pat = rf"^{re.escape(name)}" + (rf"\{{{re.escape(want)}\}}" if labels else "") + r" (\S+)$"
    m = re.search(pat, text, re.M)
    assert m, (name, labels)
    return float(m.group(1))


async def test_counters_never_decrease_and_series_are_bounded(api: Api, clock: ManualClock,
                                                              monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    c, m = api
    monkeypatch.setattr(telemetry, "METRIC_QUEUES", 3)
    monkeypatch.setattr("squall.master.http.metrics.METRIC_QUEUES", 3)
    await put(c, "big", *({"pid": f"{i:02d}"} for i in range(10)))
    for i in range(6):
        await put(c, f"small{i}", {"pid": "x"})
    [a, b] = await lease(c, "big", 2, secs=5)
    r = await update(c, dequeue=[{"queue": "big", "pid": a["pid"], "token": a["token"]}],
                     release=[{"queue": "big", "pid": b["pid"], "token": b["token"]}])
    assert r.status_code == 200
    await lease(c, "big", 1, secs=5)
    clock.advance(10)
    await m.tick()  # the lease expires
    text = (await c.get("/metrics")).text
    assert metric(text, "squall_tasks_enqueued_total") == 16
    assert metric(text, "squall_tasks_leased_total") == 3
    assert metric(text, "squall_tasks_completed_total") == 1
    assert metric(text, "squall_tasks_released_total") == 1
    assert metric(text, "squall_leases_expired_total") == 1
    assert metric(text, "squall_queue_available", group="g", queue="big") == 9
    # 3 labelled queues plus "other" per per-queue metric, whatever the number of queues
    assert len(re.findall(r"^squall_queue_available\{", text, re.M)) == 4
    assert metric(text, "squall_queue_available", group="", queue="__other__") == 4
    assert metric(text, "squall_tasks", state="available") == 15
    # the tick's cluster work held the event loop this long (no heartbeat came yet)
    assert metric(text, "squall_master_cluster_work_seconds_count", kind="tick") >= 1
    assert metric(text, "squall_master_cluster_work_seconds_count", kind="heartbeat") == 0
    for name in ("process_cpu_seconds_total", "python_info", "squall_master_build_info",
                 "squall_wal_fsync_seconds_bucket", "squall_wal_write_seconds_count",
                 "squall_master_http_request_duration_seconds_bucket",
                 "squall_datanodes", "squall_blobs_under_replicated", "squall_copies_in_flight"):
        assert re.search(rf"^{name}", text, re.M), name
    # the master's view of each node has names of its own: the nodes export
    # squall_datanode_*, and a sum over every target must count a node once
    assert "# TYPE squall_cluster_node_used_bytes gauge" in text
    assert "squall_datanode_" not in text
    assert re.search(r'^squall_master_http_requests_total\{method="POST",'
                     r'route="/v1/groups/\{group\}/queues/\{queue\}/lease",status="2xx"\} 2\.0',
                     text, re.M)
    await ok(await c.delete("/v1/groups/g/queues/big"))
    after = (await c.get("/metrics")).text
    for name in ("squall_tasks_enqueued_total", "squall_tasks_completed_total",
                 "squall_tasks_leased_total"):
        assert metric(after, name) == metric(text, name), name


async def test_dead_letters_counted_and_shown(api: Api) -> None:
    c, m = api
    await ok(await c.put("/v1/groups/g/queues/q/policy", json={"max_attempts": 1}))
    await put(c, "q", {"pid": "doomed"})
    [t] = await lease(c, "q")
    r = await update(c, release=[{"queue": "q", "pid": "doomed", "token": t["token"],
                                  "error": "ValueError: <b>bad</b>"}])
    assert r.status_code == 200
    text = (await c.get("/metrics")).text
    assert metric(text, "squall_tasks_dead_lettered_total") == 1
    assert metric(text, "squall_dead_letters") == 1
    assert metric(text, "squall_queue_dead_letters", group="g", queue="q.dead") == 0
    await m.commit.settled()  # the reasons are read from the index: once the release is in
    o = await ok(await c.get("/v1/overview"))
    [d] = o["dead_letter_queues"]
    assert d["queue"] == "g#q.dead" and d["total"] == 1
    assert "ValueError: <b>bad</b>" in d["reasons"][0]["error"]
    assert [r["dead_letter_queue"] for r in o["queues"]] == [True]
    qo = await ok(await c.get("/v1/overview/queues/g/q"))
    assert qo["dead_letters"] == 1 and qo["dead_letter_queue"] == "g#q.dead"
    assert qo["policy"]["max_attempts"] == 1
    assert qo["dead_letter_sample"][0]["pid"] == "doomed"


async def test_overview_matches_the_api(api: Api) -> None:
    c, _ = api
    await put(c, "a", *({"pid": f"{i}"} for i in range(5)))
    await put(c, "b", {"pid": "1"})
    await lease(c, "a", 2, secs=100)
    o = await ok(await c.get("/v1/overview?limit=1"))
    assert [r["queue"] for r in o["queues"]] == ["g#a"]
    row = o["queues"][0]
    s = await ok(await c.get("/v1/groups/g/queues/a"))
    for k in ("available", "leased", "delayed", "total", "completed"):
        assert row[k] == s[k], k
    cs = await ok(await c.get("/v1/cluster/stats"))
    assert (o["totals"]["available"], o["totals"]["leased"]) == (cs["available"], cs["leased"])
    assert o["totals"]["holding"] == 2 and o["wal"]["error"] is None
    assert o["cluster"]["under_replicated"] == 0
    qo = await ok(await c.get("/v1/overview/queues/g/a"))
    assert len(qo["leased_sample"]) == 2 and [h["pid"] for h in qo["head"]][:2] == ["0", "1"]
    assert (await c.get("/v1/overview/queues/g/nope")).status_code == 404
    assert o["batches"] == []
    await ok(await c.post("/v1/groups/g/batches", json={
        "id": "b1", "tasks": [{"queue": "m", "pid": "x"}, {"queue": "m", "pid": "y"}],
        "callback": {"queue": "cb"}}))
    [t] = await lease(c, "m", 1)
    await update(c, dequeue=[{"queue": "m", "pid": t["pid"], "token": t["token"]}])
    assert (await ok(await c.get("/v1/groups/g/batches/b1")))["done"] == 1  # (index read)
    [b] = (await ok(await c.get("/v1/overview")))["batches"]  # the dashboard's batch row
    assert (b["batch"], b["group"], b["state"], b["done"], b["total"]) == ("b1", "g", "open",
                                                                          1, 2)
    page = await c.get("/")
    assert page.status_code == 200 and "dashboard.js" in page.text
    assert (await c.get("/static/dashboard/vendor/uPlot.iife.min.js")).status_code == 200


async def test_telemetry_scan_is_paced_and_complete(api: Api, monkeypatch: pytest.MonkeyPatch
                                                    ) -> None:
    c, m = api
    monkeypatch.setattr(telemetry, "SCAN_SLICE", 3)
    for i in range(10):
        await put(c, f"q{i:02d}", *({"pid": str(j)} for j in range(i + 1)))
    t: telemetry.Telemetry = telemetry.Telemetry(m)
    slices = 0
    while not t.scan_slice():
        slices += 1
    assert slices == 3  # 10 queues, 3 at a time
    s = t.snapshot
    assert (s.queues, s.holding, s.available) == (10, 10, 55)
    assert s.top[0] == ("g", "q09")


async def test_offline_docs(api: Api) -> None:
    c, _ = api
    page = await c.get("/docs")
    assert page.status_code == 200
    assert "cdn" not in page.text.lower()
    js = re.search(r'src="([^"]+swagger-ui-bundle\.js)"', page.text)
    assert js and js.group(1).startswith("/static/")
    r = await c.get(js.group(1))
    assert r.status_code == 200 and len(r.content) > 500_000


async def test_cancel_a_queued_task(api: Api, clock: ManualClock) -> None:
    c, m = api
    await put(c, "q", {"pid": "a"}, {"pid": "b"}, {"pid": "..", "delay_secs": 60})
    [held] = await lease(c, "q", 1, secs=30)
    r = await c.delete("/v1/groups/g/queues/q/tasks/a")
    assert r.status_code == 409 and "leased" in r.json()["error"]["message"]
    res = await ok(await c.delete("/v1/groups/g/queues/q/tasks/b"))
    assert res["cancelled"] == "b" and res["state"] == "available" and res["ticket"] > 0
    assert (await c.delete("/v1/groups/g/queues/q/tasks/b")).status_code == 404
    assert (await c.get("/v1/groups/g/queues/q/tasks/b")).status_code == 404
    # through the client: the pid ".." is one path segment, not "the parent"
    async with AsyncClient("http://127.0.0.1", transport=c._transport) as ac:
        assert (await ac.task("g#q", "..")).state == "delayed"
        assert (await ac.cancel("g#q", "..")).state == "delayed"
        clock.advance(31)
        await m.tick()
        assert (await ac.cancel("g#q", "a")).cancelled == "a"  # its lease expired
    s = await ok(await c.get("/v1/groups/g/queues/q"))
    assert s["total"] == 0 and s["completed"] == 0
    assert held["pid"] == "a"
    text = (await c.get("/metrics")).text
    assert metric(text, "squall_tasks_cancelled_total") == 3




async def test_a_failed_wal_shows(api: Api) -> None:
    c, m = api
    o = await ok(await c.get("/v1/overview"))
    assert o["wal"]["error"] is None
    m.wal._error = "WAL write failed (No space left on device)"  # as the writer sets it
    try:
        o = await ok(await c.get("/v1/overview"))
        assert "No space left on device" in o["wal"]["error"]
        assert metric((await c.get("/metrics")).text, "squall_wal_healthy") == 0
    finally:
        m.wal._error = None


def test_fast_exposition_matches_prometheus_client() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    from squall.common.server.metrics import Hist, hist_text, render

    h = Hist()
    for v in (0.003, 100.0, 0.0, 0.001):
        h.observe(v)

    def fams(text: bool) -> Any:
        g = GaugeMetricFamily("a_b", "doc \\ x\nnl", labels=["q", "n"])
        g.add_metric(["x#y", 'we"i\\rd\n'], 3)
        g.add_metric(["", "z"], 1.5e20)
        yield g
        yield CounterMetricFamily("c", "cnt", value=7)
        if text:
            yield hist_text("h_seconds", "hist", [({"route": "/a/{b}", "method": "GET"}, h)])
        else:
            fam = HistogramMetricFamily("h_seconds", "hist", labels=["route", "method"])
            h.add_to(fam, ["/a/{b}", "GET"])
            yield fam

    class Source:
        def collect(self) -> Any:
            return fams(text=False)

    reg = CollectorRegistry()
    reg.register(Source())  # type: ignore[arg-type]
    assert render(fams(text=True)) == generate_latest(reg).decode()


async def test_retry_one_task(api: Api, clock: ManualClock) -> None:
    """The dashboard's retry: a dead letter goes back into its queue (attempts reset), a
    delayed task becomes available now; anything else is refused with what it is."""
    c, m = api
    await ok(await c.put("/v1/groups/g/queues/q/policy", json={"max_attempts": 1}))
    await put(c, "q", {"pid": "doomed"}, {"pid": "later", "delay_secs": 600})
    [t] = await lease(c, "q")
    await ok(await update(c, release=[{"queue": "q", "pid": "doomed", "token": t["token"],
                                       "error": "ValueError: bad"}]))
    assert m.queue("g", "q.dead").size == 1  # type: ignore[union-attr]
    r = await ok(await c.post("/v1/groups/g/queues/q.dead/retry", json={"pid": "doomed"}))
    assert (r["retried"], r["queue"], r["was"]) == ("doomed", "g#q", "dead letter")
    assert m.queue("g", "q.dead").size == 0  # type: ignore[union-attr]
    back = (await ok(await c.get("/v1/groups/g/queues/q/tasks/doomed")))
    assert back["state"] == "available" and back["attempts"] == 0 and not back["error"]
    r = await ok(await c.post("/v1/groups/g/queues/q/retry", json={"pid": "later"}))
    assert r["was"] == "delayed"
    assert [x["pid"] for x in await lease(c, "q", 5)] == ["doomed", "later"]
    r = await c.post("/v1/groups/g/queues/q/retry", json={"pid": "later"})  # leased now
    assert r.status_code == 409 and "leased" in r.json()["error"]["message"]
    r = await c.post("/v1/groups/g/queues/q/retry", json={"pid": "nope"})
    assert r.status_code == 404


async def test_workers_view(api: Api) -> None:
    c, m = api
    await put(c, "a", *({"pid": str(i)} for i in range(5)))
    await put(c, "b", {"pid": "1"})
    await lease(c, "a", 3, worker="w-1")
    await lease(c, "b", 1, worker="w-1")
    await lease(c, "a", 1, worker="w\u202e2")
    await m.commit.settled()  # the view reads the index: once the last lease is in it
    w = await ok(await c.get("/v1/overview/workers"))
    [one, two] = w["workers"]
    assert (one["worker"], one["tasks"]) == ("w-1", 4)
    assert one["queues"] == [{"queue": "g#a", "tasks": 3}, {"queue": "g#b", "tasks": 1}]
    assert one["since"] <= one["last_lease"] and one["oldest"]["queue"] in ("g#a", "g#b")
    assert (two["worker"], two["tasks"]) == ("w\u202e2", 1)


async def test_dashboard_security_headers(api: Api) -> None:
    c, _ = api
    for path in ("/", "/static/dashboard/dashboard.js", "/static/dashboard/vendor/uPlot.min.css"):
        r = await c.get(path)
        assert r.status_code == 200, path
        assert "script-src 'self'" in r.headers["content-security-policy"], path
        assert "frame-ancestors 'none'" in r.headers["content-security-policy"], path
        assert r.headers["x-frame-options"] == "DENY", path
        assert r.headers["x-content-type-options"] == "nosniff", path


async def test_payload_preview_says_why_it_has_none(api: Api) -> None:
    """The drawer's preview (a real replica's bytes: tests/test_dashboard_browser.py): a
    task without a payload, a payload no live node holds, an unknown task, a bad size."""
    c, _ = api
    await put(c, "q", {"pid": "bare"},
              {"pid": "held", "payload": {"blob_id": "b1", "size": 3, "crc32c": 0}})
    base = "/v1/overview/queues/g/q/payload"
    r = await ok(await c.get(base, params={"pid": "bare"}))
    assert (r["size"], r["shown"], r["error"]) == (0, 0, None)
    r = await ok(await c.get(base, params={"pid": "held"}))
    assert r["size"] == 3 and r["shown"] == 0 and "no live replica" in r["error"]
    assert (await c.get(base, params={"pid": "nope"})).status_code == 404
    assert (await c.get(base, params={"pid": "held", "bytes": 0})).status_code in (400, 422)
    assert (await c.get(base, params={"pid": "held", "bytes": 1 << 20})).status_code in (400,
                                                                                          422)
