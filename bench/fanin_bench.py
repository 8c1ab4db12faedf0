"""The cost of a task's extras (trace context, batch membership) on the master's hot path,
in process: enqueue, lease and ack 20,000 tasks (1,000 a request, no fsync), plain tasks
against tasks with a traceparent and members of one batch, alternating rounds.

    .venv/bin/python -m bench.fanin_bench [--rounds 4] [--tasks 20000]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time

from squall.common.wire.models import (
    BatchRequest,
    EnqueueItem,
    LeaseRequest,
    TaskRef,
    TaskSpec,
    UpdateRequest,
)
from squall.master.service import Master, MasterSettings

TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def run(kind: str, n: int) -> float:
    d = tempfile.mkdtemp(prefix="squall-fanin-bench-")
    m = Master(MasterSettings(data_dir=d, fsync=False, index_sync=False))
    loop = asyncio.new_event_loop()
    try:
        t0 = time.perf_counter()
        for i in range(0, n, 1000):
            pids = [f"{j:08d}" for j in range(i, min(n, i + 1000))]
            if kind == "batch":
                loop.run_until_complete(m.create_batch("g", BatchRequest(
                    tasks=[EnqueueItem(queue="q", pid=p) for p in pids],
                    callback=EnqueueItem(queue="cb"))))
            else:
                extra = {"traceparent": TP} if kind == "traced" else {}
                loop.run_until_complete(m.enqueue(
                    "g", "q", [TaskSpec.model_validate({"pid": p, **extra}) for p in pids]))
        while True:
            got = loop.run_until_complete(
                m.lease("g", "q", LeaseRequest(max_tasks=1000), ""))["tasks"]
            if not got:
                break
            loop.run_until_complete(m.update("g", UpdateRequest(dequeue=[
                TaskRef(queue="q", pid=t["pid"], token=t["token"], result="1")
                for t in got])))
        return n / (time.perf_counter() - t0)
    finally:
        m.close()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--tasks", type=int, default=20_000)
    a = ap.parse_args()
    kinds = ("plain", "traced", "batch")
    res: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(a.rounds):
        for k in kinds:
            res[k].append(run(k, a.tasks))
    base = statistics.median(res["plain"])
    for k in kinds:
        med = statistics.median(res[k])
        print(f"{k:7s} {med:9,.0f} tasks/s  x plain {med / base:.2f}  rounds "
              + ", ".join(f"{x:,.0f}" for x in res[k]))


if __name__ == "__main__":
    main()
