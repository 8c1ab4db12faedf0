"""What ``GET /v1/cluster/stats`` costs the master's event loop with 100,000 queues: the
handler now (totals kept as queues change, ``Index.totals``) against the sum over every
queue it did before, in one process on a master's index holding that many queue records
(in memory: the handler never reads LMDB). Bounded: 20 calls of the old sum, 2,000 of the
handler. Writes ``bench/results/cluster-stats.md``.

    .venv/bin/python -m bench.cluster_stats_bench [--queues 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from squall.common.clock import ManualClock
from squall.master.http.routes.queues import cluster_stats
from squall.master.service import Master, MasterSettings
from squall.master.storage.index import Totals
from squall.master.storage.records import QueueRec

OUT = Path(__file__).resolve().parent / "results" / "cluster-stats.md"


def summed(m: Master) -> dict[str, Any]:
    """The handler as it was: five passes over every queue."""
    qs = m.index.queues.values()
    return {"queues": sum(1 for q in qs if q.size), "available": sum(q.available for q in qs),
            "leased": sum(q.leased for q in qs), "delayed": sum(q.delayed for q in qs),
            "completed": sum(q.completed for q in qs),
            "rates": m.meters.total.snapshot(m.clock.now()), "wal_ticket": m.wal.last_ticket}


async def run(queues: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as d:
        m = Master(MasterSettings(data_dir=d, require_receipts=False), ManualClock())
        try:
            for i in range(queues):
                q = QueueRec("g", f"q{i:06d}", i + 1, available=i % 7, leased=i % 3,
                             completed=i % 5)
                m.index.queues[("g", q.name)] = q
            m.index.totals = Totals.of(m.index.queues.values())
            t = time.perf_counter()
            for _ in range(20):
                summed(m)
            before = (time.perf_counter() - t) / 20
            t = time.perf_counter()
            for _ in range(2000):
                await cluster_stats(m)
            now = (time.perf_counter() - t) / 2000
        finally:
            m.close()
    return before, now


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queues", type=int, default=100_000)
    a = ap.parse_args()
    before, now = asyncio.run(run(a.queues))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()
    OUT.write_text(
        "# GET /v1/cluster/stats with many queues\n\n"
        f"{time.strftime('%Y-%m-%d')}, commit {commit}, {platform.machine()}, "
        f"{platform.python_version()}, load {Path('/proc/loadavg').read_text().split()[0]}"
        f" (`bench/cluster_stats_bench.py`, in one process).\n\n"
        f"| {a.queues:,} queues | event-loop time per call |\n|---|---|\n"
        f"| summed over every queue (before) | {before * 1000:.1f} ms |\n"
        f"| totals kept as queues change (now) | {now * 1e6:.1f} µs |\n\n"
        f"Now: {before / now:,.0f} times less per call; the cost no longer depends on the "
        "number of queues.\n")
    print(OUT.read_text())


if __name__ == "__main__":
    main()
