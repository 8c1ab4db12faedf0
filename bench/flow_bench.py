"""Flow-control benchmark: lease throughput with limits and fairness on, against the same
queue without them, in one run (one master process, fsync on).

Run ``python -m bench.flow_bench [--tasks N] [--keys K] [--rounds R] [--out DIR]``
(``make flow-bench``, part of ``make bench``). Every configuration gets its own queue of
`tasks` tasks; a client leases 100 and acknowledges them in the next lease's update
(one request a batch, sequential), until the queue is empty. Configurations:

- ``plain``    keyless tasks, no policy: the lease path as it was before keys existed
- ``keyed``    the same tasks with `keys` keys (round-robin over the pids), no policy
- ``limits``   keyed, ``key_limit`` 5 and ``queue_limit`` 10,000
- ``fair``     keyed, ``fair`` (weighted round-robin, weight 1)
- ``all``      keyed, limits and fairness together

Rounds alternate the configurations (plain, keyed, limits, fair, all, plain, ...) so load
changes on a shared machine hit them alike; each figure is the median over the rounds.
Target: ``all`` and ``limits`` at least 0.8x ``keyed`` (the same queue without flow
control). Results: ``<out>/flow.md`` and ``flow.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import DEFAULT_OUT, load1, machine_info, master_server, running
from squall.client import Client, NewTask

CONFIGS: dict[str, dict[str, Any] | None] = {
    "plain": None,
    "keyed": None,
    "limits": {"key_limit": 5, "queue_limit": 10_000},
    "fair": {"fair": True},
    "all": {"key_limit": 5, "queue_limit": 10_000, "fair": True},
}
TARGET = 0.8
LOOP_LIMIT_S = 300.0


def fill(c: Client, queue: str, n: int, keys: int, keyed: bool) -> None:
    c.put_many(queue, (NewTask(pid=f"t{i:07d}", key=f"tenant{i % keys}" if keyed else None)
                       for i in range(n)), batch_size=1000)


def drain(c: Client, queue: str, n: int) -> tuple[float, int]:
    """Lease 100 at a time, acking the previous batch in the same update; tasks/s."""
    t0 = time.perf_counter()
    done = 0
    prev: list[Any] = []
    while done < n and time.perf_counter() - t0 < LOOP_LIMIT_S:
        got = c.lease(queue, 100, lease_secs=300, done=prev)
        done += len(got)
        prev = got
        if not got:
            break
    if prev:
        c.done(prev)
    return done / (time.perf_counter() - t0), done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=20_000)
    ap.add_argument("--keys", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    rates: dict[str, list[float]] = {k: [] for k in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="squall-flow-bench-") as d:
        srv = master_server(Path(d) / "m", Path(d), "master")
        with running(srv), Client(srv.url) as c:
            for r in range(a.rounds):
                for name, pol in CONFIGS.items():
                    q = f"bench#{name}{r}"
                    if pol is not None:
                        c.set_policy(q, **pol)
                    fill(c, q, a.tasks, a.keys, keyed=name != "plain")
                    rate, n = drain(c, q, a.tasks)
                    if n != a.tasks:
                        print(f"{name}: leased {n} of {a.tasks}", file=sys.stderr)
                        return 1
                    rates[name].append(rate)
                    print(f"round {r + 1} {name:7s} {rate:9,.0f} tasks/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    vs_keyed = {k: med[k] / med["keyed"] for k in med}
    doc: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
           "machine": machine_info(), "load1_after": load1(), "args": vars(a) | {
               "out": str(a.out)}, "rates": rates, "median": med,
           "ratio_vs_keyed": vs_keyed,
           "ratio_vs_plain": {k: med[k] / med["plain"] for k in med}}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "flow.json").write_text(json.dumps(doc, indent=1))
    (a.out / "flow.md").write_text(render(doc))
    print(render(doc))
    ok = all(vs_keyed[k] >= TARGET for k in ("limits", "fair", "all"))
    return 0 if ok else 2


def render(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        "# squall flow-control benchmark",
        "",
        f"- date: {doc['date']}",
        f"- machine: {m.get('cpu', '')} nproc {m.get('nproc', '')}; "
        f"python {m.get('python', '')}; 1-minute load after: {doc['load1_after']:.2f}",
        f"- {doc['args']['tasks']:,} tasks per queue, {doc['args']['keys']:,} keys, "
        f"{doc['args']['rounds']} alternating rounds; lease 100 + ack of the previous 100 in "
        "one update, sequential, one master process with fsync",
        "",
        "| config | policy | tasks/s (median) | x keyed (no policy) | x plain (no keys) "
        "| target |",
        "|---|---|---|---|---|---|",
    ]
    for k, pol in CONFIGS.items():
        target = f">= {TARGET}x keyed" if k in ("limits", "fair", "all") else ""
        lines.append(f"| {k} | {json.dumps(pol) if pol else '-'} | "
                     f"{doc['median'][k]:,.0f} | {doc['ratio_vs_keyed'][k]:.2f} | "
                     f"{doc['ratio_vs_plain'][k]:.2f} | {target} |")
    lines += ["", "Every round's figures: " + "; ".join(
        f"{k} " + ", ".join(f"{x:,.0f}" for x in v) for k, v in doc["rates"].items()), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
