"""The live status page at `/`: cluster totals and the busiest queues, refreshing itself."""

from __future__ import annotations

import heapq
from html import escape

from fastapi import APIRouter
from starlette.responses import HTMLResponse

from squall.common.names import join_queue
from squall.master.deps import MasterDep

router = APIRouter(tags=["health"])
TOP_QUEUES = 50

_STYLE = """body{font:14px system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse}td,th{padding:3px 10px;text-align:right;border-bottom:1px solid #ddd}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}.k{color:#666}"""


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
async def status_page(m: MasterDep) -> HTMLResponse:
    qs = list(m.index.queues.values())
    now = m.clock.now()
    total = m.meters.total.snapshot(now)
    busiest = heapq.nlargest(TOP_QUEUES, (q for q in qs if q.size), key=lambda q: q.size)
    rows = []
    for q in busiest:
        r = m.meters.get((q.group, q.name)).snapshot(now)
        rows.append(
            f"<tr><td>{escape(join_queue(q.group, q.name))}</td><td>{q.available}</td>"
            f"<td>{q.leased}</td><td>{q.delayed}</td><td>{q.completed}</td>"
            f"<td>{r['enqueue_1m']:.1f}</td><td>{r['lease_1m']:.1f}</td>"
            f"<td>{r['dequeue_1m']:.1f}</td></tr>")
    facts = {
        "queues holding tasks": sum(1 for q in qs if q.size),
        "available": sum(q.available for q in qs), "leased": sum(q.leased for q in qs),
        "delayed": sum(q.delayed for q in qs), "completed": sum(q.completed for q in qs),
        "enqueue/s (1m)": f"{total['enqueue_1m']:.1f}",
        "dequeue/s (1m)": f"{total['dequeue_1m']:.1f}",
        "WAL ticket": m.wal.last_ticket, "WAL fsyncs": m.wal.syncs,
        "WAL records": m.wal.records, "checkpoints": m.checkpoints,
        "recovery (s)": f"{m.recovery_secs:.2f}", "tasks reaped": m.reaped,
    }
    facts_html = "".join(f"<tr><td class=k>{escape(k)}</td><td>{v}</td></tr>"
                         for k, v in facts.items())
    html = f"""<!doctype html><html><head><meta charset=utf-8>
<meta http-equiv=refresh content=2><title>squall master</title><style>{_STYLE}</style></head>
<body><h1>squall master</h1><table>{facts_html}</table>
<h2>Busiest queues</h2><table><tr><th>queue</th><th>available</th><th>leased</th>
<th>delayed</th><th>completed</th><th>enq/s</th><th>lease/s</th><th>deq/s</th></tr>
{''.join(rows) or '<tr><td colspan=8>no tasks queued</td></tr>'}</table>
<p class=k>API: <a href="/docs">/docs</a> · <a href="/openapi.json">/openapi.json</a> ·
<a href="/metrics">/metrics</a></p></body></html>"""
    return HTMLResponse(html)
