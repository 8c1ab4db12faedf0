"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.responses import Response

from squall.master.deps import MasterDep
from squall.master.http import JSON
from squall.master.service import Master

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> JSON:
    """The process is up."""
    return JSON({"ok": True})


@router.get("/readyz")
async def readyz(m: MasterDep) -> JSON:
    """Recovery is done and the WAL accepts writes."""
    return JSON({"ok": True, "ticket": m.wal.last_ticket, "recovery_secs": m.recovery_secs})


class MasterCollector:
    """Reads the master's counters at scrape time (no per-request metric cost)."""

    def __init__(self, m: Master) -> None:
        self.m = m

    def collect(self):  # type: ignore[no-untyped-def]
        m = self.m
        qs = list(m.index.queues.values())
        g = GaugeMetricFamily("squall_tasks", "tasks by state", labels=["state"])
        g.add_metric(["available"], sum(q.available for q in qs))
        g.add_metric(["leased"], sum(q.leased for q in qs))
        g.add_metric(["delayed"], sum(q.delayed for q in qs))
        yield g
        yield GaugeMetricFamily("squall_queues", "queues holding tasks",
                                value=sum(1 for q in qs if q.size))
        yield CounterMetricFamily("squall_tasks_completed", "tasks dequeued",
                                  value=sum(q.completed for q in qs))
        yield CounterMetricFamily("squall_wal_records", "WAL records written",
                                  value=m.wal.records)
        yield CounterMetricFamily("squall_wal_syncs", "WAL fdatasync calls", value=m.wal.syncs)
        yield CounterMetricFamily("squall_checkpoints", "checkpoints", value=m.checkpoints)
        yield CounterMetricFamily("squall_tasks_reaped", "tasks of deleted queues reaped "
                                  "since start", value=m.reaped)
        yield GaugeMetricFamily("squall_wal_ticket", "last WAL ticket", value=m.wal.last_ticket)
        yield GaugeMetricFamily("squall_lease_waiting", "leases parked waiting for a task "
                                "(wait_secs)", value=m.waiters.total)
        yield CounterMetricFamily("squall_lease_waits_refused", "waiting leases refused by "
                                  "the per-queue or total bound", value=m.waiters.refused)


@router.get("/metrics", response_class=Response)
async def metrics(m: MasterDep) -> Response:
    """Prometheus metrics."""
    reg = CollectorRegistry()
    reg.register(MasterCollector(m))  # type: ignore[arg-type]
    return Response(generate_latest(reg), media_type=CONTENT_TYPE_LATEST)
