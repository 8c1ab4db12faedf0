"""Many long-polling consumers on one queue: the master's CPU per task.

``python -m bench.lease_herd [--waiters 4,50] [--tasks 1000]`` starts a real master
(fsync on) and one data node, runs `waiters` async consumers that each loop
``lease(1, wait_secs=2)`` → ``done()``, and puts `tasks` payload-less tasks one at a time
(2 ms apart, so the consumers are parked when each arrives). It prints, and writes to
``bench/results/lease-herd.md``, the master's CPU per task (put + lease + done) and the
leases tried by woken parked requests (``squall_lease_wait_attempts_total``). Before
targeted wake-ups every new task woke every parked lease (``master/tasks/waiters.py``).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx

from bench.dn_cluster import AUTH, ClusterSpec, running_cluster
from bench.harness import proc_cpu_s
from squall.client import AsyncClient

OUT = Path(__file__).parent / "results" / "lease-herd.md"


async def _run(url: str, master_pid: int, waiters: int, tasks: int) -> dict[str, float]:
    async with AsyncClient(url, max_connections=waiters + 20) as c:
        got, stop = [0], asyncio.Event()

        async def consumer() -> None:
            while not stop.is_set():
                for t in await c.lease("herd#q", 1, 60, wait_secs=2):
                    await t.done()
                    got[0] += 1

        consumers = [asyncio.create_task(consumer()) for _ in range(waiters)]
        await asyncio.sleep(1.0)  # every consumer parked
        tried0 = _attempts(url)
        c0, t0 = proc_cpu_s(master_pid), time.perf_counter()
        for _ in range(tasks):
            await c.put("herd#q", None)
            await asyncio.sleep(0.002)
        while got[0] < tasks and time.perf_counter() - t0 < 60:
            await asyncio.sleep(0.01)
        el, cpu = time.perf_counter() - t0, proc_cpu_s(master_pid) - c0
        stop.set()
        await asyncio.wait(consumers, timeout=5)
        for t in consumers:
            t.cancel()
        return {"done": got[0], "s": el, "cpu_ms": cpu / tasks * 1e3,
                "woken_tries": (_attempts(url) - tried0) / tasks}


def _attempts(url: str) -> float:
    text = httpx.get(url + "/metrics", headers=AUTH, timeout=10).text
    for line in text.splitlines():
        if line.startswith("squall_lease_wait_attempts_total"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")  # a master without the metric (before targeted wake-ups)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--waiters", default="4,50", help="comma-separated consumer counts")
    ap.add_argument("--tasks", type=int, default=1000)
    a = ap.parse_args(argv)
    rows = []
    for n in (int(x) for x in a.waiters.split(",")):
        with tempfile.TemporaryDirectory() as tmp, \
                running_cluster(ClusterSpec(nodes=1, rf=1), Path(tmp)) as cl:
            r = asyncio.run(_run(cl.url, cl.pids()["master"], n, a.tasks))
        line = (f"| {n} | {r['done']:.0f} | {r['s']:.1f} | {r['cpu_ms']:.2f} | "
                f"{r['woken_tries']:.2f} |")
        print(line, flush=True)
        rows.append(line)
    OUT.write_text("# Long-polling consumers on one queue (bench/lease_herd.py)\n\n"
                   f"- date: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}, {a.tasks} tasks\n\n"
                   "| waiters | tasks done | s | master CPU ms/task | woken tries/task |\n"
                   "|---:|---:|---:|---:|---:|\n" + "\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
