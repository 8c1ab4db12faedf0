"""Liveness, readiness and Prometheus metrics."""

from __future__ import annotations

from fastapi import Request
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import Response

from squall.master.http.answers import JSON
from squall.master.http.deps import MasterDep


async def healthz() -> JSON:
    """The process is up."""
    return JSON({"ok": True})


async def readyz(m: MasterDep) -> JSON:
    """Recovery is done and the WAL accepts writes (503 with the reason otherwise); in a
    master set: this member leads and its log is writable."""
    reason = m.ready()
    if m.ha is not None and m.ha.role != "leader":
        reason = f"standby of {m.ha.leader or 'an unknown leader'}, lag {m.ha.lag()} records"
    elif m.ha is not None and reason is None:
        reason = m.ha.failure()
    if reason is not None:
        return JSON({"ok": False, "reason": reason, "ticket": m.wal.last_ticket}, 503)
    return JSON({"ok": True, "ticket": m.wal.last_ticket, "recovery_secs": m.recovery_secs})


async def metrics(request: Request) -> Response:
    """Prometheus metrics (names and labels in docs/operations.md)."""
    return Response(request.app.state.metrics.body(), media_type=CONTENT_TYPE_LATEST)
