"""The master-set benchmark: a single master and a set of three, real processes on
127.0.0.1 with fsync on, measured in the same run, then failover times.

Run ``python -m bench.ha_bench [--tasks N] [--kills K] [--out DIR]`` (``make bench-ha``).

- **put**: batched enqueues, 100 pid-only tasks per request, one client, sequential;
  tasks/s with one master and with three members (target: the set at >= 0.8x).
- **lease+ack**: lease 100 and dequeue those 100 in one update, sequential; tasks/s.
- **failover**: K times, kill -9 the leader (file lease elector, lease 2 s) and time from
  the kill to the first acknowledged put on the new leader; p50 / p99 (target: p99 <=
  2 x lease + replay). The killed member is restarted and caught up between kills.

Every loop is bounded in count and time. Results: stdout and ``<out>/master-set.md`` and
``.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

import httpx

from squall.client import Client, NewTask, SquallError
from squall.common.security import auth
from tests.ha_kit import MasterSetProcs

AUTH = b"ed25519-private:YmVuY2gtYXV0aC1rZXktMDEyMzQ1Njc4OWFiY2RlZmc"  # the master's key


def master_set(root: str, n: int) -> MasterSetProcs:
    """`n` members started (one: a plain master), each requiring a token."""
    ps = MasterSetProcs(root, n)
    ps.env["SQUALL_AUTH_KEY"] = AUTH.decode()
    os.makedirs(ps.root)
    ps.start_all()
    return ps


def cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user + system, from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throughput(ps: MasterSetProcs, lead: int, token: str, tasks: int, queue: str
               ) -> dict[str, Any]:
    """Tasks/s of each workload, and the CPU milliseconds per request of 100 tasks spent
    by the leader, each standby (the mean of them) and this client."""
    pids = [ps.procs[i].pid for i in sorted(ps.procs)]

    def cpu() -> list[float]:
        return [cpu_s(p) for p in pids] + [time.process_time()]

    def per_request(c0: list[float], c1: list[float], requests: int) -> dict[str, float]:
        d = [1000 * (b - a) / max(1, requests) for a, b in zip(c0, c1, strict=True)]
        standbys = [x for i, x in enumerate(d[:-1]) if i != lead]
        return {"leader": d[lead], "client": d[-1],
                **({"standby": sum(standbys) / len(standbys)} if standbys else {})}

    with Client(ps.urls[lead], token=token, retries=0, timeout=30.0) as c:
        c0, t0 = cpu(), time.perf_counter()
        for b in range(0, tasks, 100):
            c.put_many(queue, [NewTask(pid=f"p{b + i:08d}") for i in range(100)],
                       batch_size=100)
        put_s = time.perf_counter() - t0
        c1, t0 = cpu(), time.perf_counter()
        done = rounds = 0
        leased = c.lease(queue, max_tasks=100, lease_secs=60)
        while leased and time.perf_counter() - t0 < 300:
            nxt = c.lease(queue, max_tasks=100, lease_secs=60, done=leased)
            done += len(leased)
            rounds += 1
            leased = nxt
        ack_s = time.perf_counter() - t0
        c2 = cpu()
    return {"put": tasks / put_s, "lease_ack": done / ack_s,
            "cpu_ms": {"put": per_request(c0, c1, -(-tasks // 100)),
                       "lease_ack": per_request(c1, c2, rounds + 1)}}


TIMINGS = ("squall_master_http_request_duration_seconds", "squall_wal_fsync_seconds",
           "squall_quorum_wait_seconds", "squall_journal_append_seconds")


def timings(url: str, token: str) -> dict[str, float]:
    """Mean milliseconds of the leader's TIMINGS histograms (all label sets together), from
    its /metrics: where a request's time goes."""
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {token}"},
                     timeout=10.0).text
    sums: dict[str, list[float]] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        base = name.split("{", 1)[0]
        for t in TIMINGS:
            if base in (t + "_sum", t + "_count"):
                sums.setdefault(t, [0.0, 0.0])[base.endswith("_count")] += float(value)
    return {t.removeprefix("squall_").removesuffix("_seconds"): 1000 * s / n
            for t, (s, n) in sums.items() if n}


def failovers(ps: MasterSetProcs, token: str, kills: int) -> list[float]:
    out: list[float] = []
    for k in range(kills):
        lead = ps.wait_leader()
        ps.kill(lead)
        t0 = time.monotonic()
        deadline = t0 + 120
        done = False
        while not done and time.monotonic() < deadline:
            for i in range(ps.n):
                if i == lead:
                    continue
                try:
                    with Client(ps.urls[i], token=token, retries=0, timeout=2.0) as c:
                        c.put("bench#fo", None, pid=f"k{k}")
                    done = True
                    break
                except (SquallError, OSError):
                    pass
            time.sleep(0.01)
        if not done:
            raise TimeoutError("no acknowledged write after a kill")
        out.append(time.monotonic() - t0)
        ps.start(lead)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # back and caught up before the next kill
            if (ps.info(lead) or {}).get("role") == "standby":
                break
            time.sleep(0.05)
    return out


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=20000)
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--out", default="bench/results")
    a = ap.parse_args()
    token = auth.mint(auth.parse_keys(AUTH), ["admin"], 86400, time.time())
    root = tempfile.mkdtemp(prefix="squall-ha-bench-")
    rows: dict[str, list[dict[str, Any]]] = {"1": [], "3": []}
    fo: list[float] = []
    where: dict[str, dict[str, float]] = {}
    sets: dict[int, MasterSetProcs] = {}
    try:
        # both run side by side, idle while the other is measured; rounds alternate, so a
        # busy moment of the machine hits both, and each round gives one pair of figures
        for n in (1, 3):
            sets[n] = master_set(os.path.join(root, f"n{n}"), n)
        leads = {n: ps.wait_leader() for n, ps in sets.items()}
        for n, ps in sets.items():  # warm: connections, imports, the first index pages
            throughput(ps, leads[n], token, min(a.tasks, 2000), "warm#q")
        for r in range(a.rounds):
            for n in ((1, 3) if r % 2 == 0 else (3, 1)):
                rows[str(n)].append(throughput(sets[n], leads[n], token, a.tasks,
                                               f"b#r{r}"))
        where = {str(n): timings(ps.urls[leads[n]], token) for n, ps in sets.items()}
        if a.kills:
            sets[1].stop()
            fo = failovers(sets[3], token, a.kills)
    finally:
        for ps in sets.values():
            ps.stop()
        shutil.rmtree(root, ignore_errors=True)
    best = {n: {k: max(x[k] for x in v) for k in ("put", "lease_ack")}
            for n, v in rows.items()}
    pairs = {k: sorted(b[k] / s[k] for s, b in zip(rows["1"], rows["3"], strict=True))
             for k in ("put", "lease_ack")}
    cpu = {n: {k: {role: median([x["cpu_ms"][k][role] for x in v])
                   for role in v[0]["cpu_ms"][k]} for k in ("put", "lease_ack")}
           for n, v in rows.items()}
    doc: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load "
                   f"{os.getloadavg()[0]:.1f}", "tasks": a.tasks, "rounds": a.rounds,
        "single": best["1"], "set3": best["3"],
        "ratio": {k: best["3"][k] / best["1"][k] for k in best["1"]},
        "pair_ratio_median": {k: v[len(v) // 2] for k, v in pairs.items()},
        "rounds_single": rows["1"], "rounds_set3": rows["3"], "mean_ms": where,
        "cpu_ms_per_request": cpu,
        "failover_s": {"n": len(fo), "p50": pct(fo, 0.5) if fo else None,
                       "p99": pct(fo, 0.99) if fo else None, "all": fo},
        "lease_s": 2.0}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "master-set.json").write_text(json.dumps(doc, indent=2) + "\n")
    f = doc["failover_s"]
    md = [
        "# Master set: three members vs one master, and failover",
        "",
        f"{doc['date']}, {doc['machine']}. `python -m "
        f"bench.ha_bench --tasks {a.tasks} --rounds {a.rounds} --kills {a.kills}`: real "
        "processes on loopback, fsync on; one client, sequential, 100 tasks per request; "
        "the single master and the set run side by side and are measured in alternating "
        "rounds.",
        "",
        "| workload | 1 master, best (tasks/s) | 3 members, best (tasks/s) | best / best | "
        "median of the rounds' ratios (target >= 0.8) |",
        "|---|---|---|---|---|",
        *(f"| {k} | {best['1'][k]:,.0f} | {best['3'][k]:,.0f} | "
          f"{doc['ratio'][k]:.2f}x | {doc['pair_ratio_median'][k]:.2f}x |"
          for k in ("put", "lease_ack")),
        "",
        "Where the time goes (the leaders' own histograms over every round, mean ms): "
        + "; ".join(f"{'1 master' if n == '1' else '3 members'}: "
                    + ", ".join(f"{k} {v:.2f}" for k, v in sorted(w.items()))
                    for n, w in where.items()) + ".",
        "",
        "CPU per request of 100 tasks (ms, the median over the rounds; from /proc and the "
        "client's own clock): where the set's time goes on a machine whose cores its "
        "members share.",
        "",
        "| workload | members | leader | each standby | client | all |",
        "|---|---|---:|---:|---:|---:|",
        *(f"| {k} | {n} | {c[k]['leader']:.2f} | "
          + (f"{c[k]['standby']:.2f}" if "standby" in c[k] else "-")
          + f" | {c[k]['client']:.2f} | "
          f"{c[k]['leader'] + (int(n) - 1) * c[k].get('standby', 0) + c[k]['client']:.2f} |"
          for k in ("put", "lease_ack") for n, c in cpu.items()),
        "",
        f"Failover (leader killed with SIGKILL -> first acknowledged put on the new "
        f"leader), {f['n']} kills, elector lease 2 s (file lease): p50 "
        + (f"{f['p50']:.2f} s, p99 {f['p99']:.2f} s" if f["n"] else "not measured")
        + " (target p99 <= 2 x lease + replay = about 4 s).",
        "",
    ]
    (out / "master-set.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
