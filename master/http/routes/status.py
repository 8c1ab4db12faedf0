"""The dashboard at ``/`` and the JSON it polls.

``GET /`` is a static page (``master/static/dashboard.html`` with its script and the
vendored uPlot, served under ``/static/dashboard/``): it holds no data, so it is the same
for everyone. It polls ``GET /v1/overview`` (cluster health, WAL state, totals, the largest
queues, dead-letter queues with reasons, and the history since the last point it has) and,
on a queue's page, ``GET /v1/overview/queues/{group}/{queue}``. Both read the telemetry
snapshot and the live counters of the few queues they return, never every queue, so a
refresh costs the event loop about the same with 100 or 100,000 queues
(``bench/dashboard_bench.py``). Actions on the page call the ordinary REST routes with the
credential the user pastes into the page (sent as a bearer header, never a cookie, so
another site cannot make a browser send it: that is the CSRF defence).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import Query, Request
from starlette.responses import Response
from starlette.staticfiles import StaticFiles

from squall.common.errors import NotFound
from squall.common.wire.names import join_queue
from squall.master.cluster.peek import PREVIEW_MAX, Peek
from squall.master.http.answers import JSON
from squall.master.http.deps import MasterDep, ReadMasterDep
from squall.master.http.metrics import wal_error
from squall.master.http.routes.tasks import GroupP, QueueP
from squall.master.service import Master
from squall.master.storage.records import STATE_NAMES
from squall.master.tasks import admin, batches, policies
from squall.master.telemetry import TOP_QUEUES, Telemetry, is_dead_letter_queue

STATIC = Path(__file__).resolve().parents[2] / "static"
SAMPLE = 10
# the page and its files: scripts, styles and data from this origin only (no inline code,
# no other site), never framed (clickjacking), content types taken as sent
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Frame-Options": "DENY",
                    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


class DashboardFiles(StaticFiles):
    """The dashboard's static files, with the page's security headers."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        r = super().file_response(*args, **kwargs)
        r.headers.update(SECURITY_HEADERS)
        return r


@functools.cache
def _page() -> bytes:
    return (STATIC / "dashboard.html").read_bytes()


async def dashboard() -> Response:
    """The dashboard page (static: read once, served from memory)."""
    return Response(_page(), media_type="text/html",
                    headers={"Cache-Control": "no-cache", **SECURITY_HEADERS})


def _tele(request: Request) -> Telemetry:
    t: Telemetry = request.app.state.telemetry
    return t


def _first_errors(m: Master, key: tuple[str, str], n: int) -> list[dict[str, Any]]:
    q = m.index.queues.get(key)
    if q is None:
        return []
    with m.index.env.begin() as txn:
        return [{"pid": t.pid, "error": (t.error or "")[:300], "origin": t.origin,
                 "attempts": t.attempts}
                for t in m.index.iter_tasks(txn, q, b"", n)]


async def overview(request: Request, m: MasterDep,
                   limit: Annotated[int, Query(ge=1, le=TOP_QUEUES)] = 100,
                   since: Annotated[float, Query(ge=0)] = 0.0) -> JSON:
    """Everything the dashboard shows on its front page: data nodes, WAL state, totals and
    counters, the `limit` largest queues and the dead-letter queues (with the last error of
    their first task), and the history points after `since` (one every 5 s, one hour)."""
    t = _tele(request)
    s = t.current()
    tot = m.index.totals
    now = time.time()
    w = m.wal
    return JSON({
        "now": now,
        "cluster": m.cluster.info(),
        "wal": {"ticket": w.last_ticket, "durable_ticket": w.durable_ticket,
                "syncs": w.syncs, "records": w.records, "error": wal_error(m),
                "checkpoints": m.checkpoints, "recovery_secs": round(m.recovery_secs, 3)},
        # exact now (kept as queues change), but dead letters: as of the last scan
        "totals": {"queues": tot.queues, "holding": tot.holding, "available": tot.available,
                   "leased": tot.leased, "delayed": tot.delayed, "completed": tot.completed,
                   "dead_letters": s.dead_letters, "scan_age_secs": round(now - s.at, 3),
                   "scan_secs": round(s.scan_secs, 3),
                   "rates": m.meters.total.snapshot(now), "counters": dict(m.meters.counts)},
        "rows_age_secs": round(now - t.rows_at, 3),
        "queues": t.rows[:limit],
        "dead_letter_queues": t.dead_rows,
        "batches": batches.overview(m.index),
        "history": [p for p in t.history if p["t"] > since],
        "master_set": _master_set(m),
    })


async def workers(request: Request, m: MasterDep) -> JSON:
    """Who holds what, since when: the workers holding leases in the largest queues (a
    sample: each queue's recent leases that are still live), with their address, tasks
    held per queue, their oldest lease and their latest. Recomputed at most every second
    in the background, with the dashboard's rows (so it may miss the last second's
    leases); served while the index is behind the log, like the rest of the overview."""
    t = _tele(request)
    t.current()
    now = time.time()
    return JSON({"now": now, "age_secs": round(now - t.rows_at, 3), "workers": t.workers})


async def payload_preview(
        group: GroupP, queue: QueueP, request: Request, m: ReadMasterDep,
        pid: Annotated[str, Query(min_length=1, max_length=4096, description="the task's pid")],
        n: Annotated[int, Query(alias="bytes", ge=1, le=PREVIEW_MAX)] = 512) -> JSON:
    """The first `bytes` bytes of a task's payload (admins: the task drawer), read by the
    master from a live replica: as text (UTF-8, undecodable bytes replaced), whether that
    decoding was clean, and the first 256 bytes in hex. `error` says why no replica
    answered."""
    t = m.task_info(group, queue, pid)
    p = t["payload"]
    out: dict[str, Any] = {"pid": t["pid"], "size": p["size"] if p else 0, "shown": 0,
                           "text": "", "utf8": True, "hex": "", "replica": None, "error": None}
    if p is None:
        return JSON(out)
    peek: Peek = request.app.state.peek
    data, source = await peek.first_bytes(p, n)
    if data is None:
        out["error"] = f"no replica gave the payload: {source}"
        return JSON(out)
    try:
        text, clean = data.decode("utf-8"), True
    except UnicodeDecodeError as e:
        # a character cut by the preview's end is still text; anything else is not
        cut = e.reason == "unexpected end of data" and len(data) < out["size"]
        text = data[:e.start].decode("utf-8") if cut else data.decode("utf-8", "replace")
        clean = cut
    out.update(shown=len(data), text=text, utf8=clean, hex=data[:256].hex(" "),
               replica=source)
    return JSON(out)


def _master_set(m: Master) -> dict[str, object] | None:
    """A master set's members, leader, epoch, each member's lag and the elector (None on a
    single master)."""
    ha = m.ha
    if ha is None:
        return None
    v = ha.view()
    log = v.get("log") or {}
    members = [{"url": u, "leader": u == v["leader"],
                **({k: (log.get("members") or {}).get(u, {}).get(k)
                    for k in ("in_sync", "lag", "status")})} for u in v["members"]]
    return {"leader": v["leader"], "epoch": v["epoch"], "role": v["role"], "me": v["me"],
            "elector": v["elector"], "members": members, "failovers": v["failovers"]}


async def queue_overview(group: GroupP, queue: QueueP, request: Request, m: ReadMasterDep,
                         since: Annotated[float, Query(ge=0)] = 0.0) -> JSON:
    """A queue's dashboard page: counts, rates, oldest age, leased sample (worker,
    address, since, expires), effective policy, the group's schedules that feed it, its
    dead-letter queue with sample reasons, and its history (if it is among the largest)."""
    t = _tele(request)
    key = (group, queue)
    q = m.queue(group, queue)
    if q is None:
        raise NotFound(f"queue {join_queue(group, queue)} does not exist")
    now = time.time()
    row = t.queue_row(key, now) or {}
    details = m.queue_details(q)
    pol = m.engine.policy(q)
    dlq = policies.dead_letter_queue(pol, queue)
    dq = m.index.queues.get((group, dlq))
    scheds = [admin.describe_schedule(n, s) for (g, n), s in m.index.schedules.items()
              if g == group and s.get("queue") == queue][:50]
    with m.index.env.begin() as txn:
        head = [{"pid": x.pid, "state": STATE_NAMES[x.state], "attempts": x.attempts,
                 "worker": x.worker, "error": (x.error or "")[:300] or None}
                for x in m.index.iter_tasks(txn, q, b"", SAMPLE)] if q.size else []
    return JSON({
        **row, "mean_lease_secs": details["mean_lease_secs"], "rates": details["rates"],
        "leased_sample": details["leased_sample"], "head": head, "policy": pol,
        "dead_letter_queue": join_queue(group, dlq), "dead_letters": dq.size if dq else 0,
        "dead_letter_sample": _first_errors(m, (group, dlq), SAMPLE),
        **m.flow_details(q),
        "is_dead_letter_queue": is_dead_letter_queue(m, group, queue),
        "schedules": scheds,
        "history": [p for p in t.queue_history.get(join_queue(group, queue), ())
                    if p[0] > since],
        "history_fields": ["t", "available", "leased", "delayed", "oldest_age_secs",
                           "enqueue_1m", "lease_1m", "dequeue_1m"],
    })
