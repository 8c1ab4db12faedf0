"""Workload R of the data node benchmark: re-replication after kill -9 of a data node, and
foreground put latency during the repair (see bench/README.md): large blobs (MB/s) and
many 1 KiB blobs (blobs/s, copied many per node-to-node request)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import httpx

from bench.dn_cluster import ClusterSpec, CpuMeter, Payloads, running_cluster
from bench.dn_rows import Ctx, Row, ms
from bench.harness import AUTH, pct


class Foreground:
    """Paced foreground puts (allocate → PUT → enqueue) in a thread, latencies kept."""

    def __init__(self, url: str, size: int, interval_s: float) -> None:
        self.cli = Payloads(url, "fg")
        self.data = os.urandom(size)
        self.interval_s = interval_s
        self.lats: list[tuple[float, float]] = []  # (start, latency)
        self.steps: list[dict[str, float]] = []  # each put's seconds per step, as lats
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, daemon=True)
        self._i = 0

    def _run(self) -> None:
        nxt = time.perf_counter()
        while not self._stop.is_set() and len(self.lats) < 100_000:
            s = time.perf_counter()
            before = dict(self.cli.phases)
            try:
                self.cli.put(f"fg{self._i:07d}", self.data)
                self.lats.append((s, time.perf_counter() - s))
                self.steps.append({k: v - before.get(k, 0.0) for k, v in self.cli.phases.items()})
            except Exception as e:  # noted, not fatal: the node may be dying under it
                self.errors.append(repr(e)[:200])
            self._i += 1
            nxt += self.interval_s
            self._stop.wait(max(0.0, nxt - time.perf_counter()))

    def start(self) -> Foreground:
        self._th.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._th.join(60)
        self.cli.close()

    def p99(self, t0: float, t1: float) -> tuple[float | None, int]:
        xs = [lat for s, lat in self.lats if t0 <= s <= t1]
        return pct(xs, 99), len(xs)

    def slowest(self, t0: float, t1: float, k: int = 3) -> str:
        """The `k` slowest puts in [t0, t1], each split into its steps (ms)."""
        got = sorted(((lat, st) for (s, lat), st in zip(self.lats, self.steps, strict=True)
                      if t0 <= s <= t1), key=lambda x: -x[0])[:k]
        return "; ".join(f"{lat * 1e3:.0f} ms (" + " ".join(
            f"{n} {v * 1e3:.0f}" for n, v in st.items()) + ")" for lat, st in got)


def _slow_wal_syncs(c: httpx.Client, url: str) -> str:
    """The master's WAL fsyncs slower than 50 ms so far (its histogram), of all, and what
    held its event loop over 25 and 50 ms: cluster work (heartbeats, repair ticks) and
    garbage collections."""
    try:
        text = c.get(url + "/metrics").text
    except httpx.HTTPError as e:
        return f"? ({e})"
    le50 = total = 0.0
    work: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if line.startswith('squall_wal_fsync_seconds_bucket{le="0.05"}'):
            le50 = float(line.split()[-1])
        elif line.startswith("squall_wal_fsync_seconds_count"):
            total = float(line.split()[-1])
        elif line.startswith(("squall_master_cluster_work_seconds_bucket",
                               "squall_master_cluster_work_seconds_count",
                               "squall_gc_pause_seconds_bucket",
                               "squall_gc_pause_seconds_count")):
            kind = (line.split('kind="', 1)[1].split('"', 1)[0] if 'kind="' in line
                    else "gc gen " + line.split('generation="', 1)[1].split('"', 1)[0])
            le = line.split('le="', 1)[1].split('"', 1)[0] if 'le="' in line else "count"
            work.setdefault(kind, {})[le] = float(line.split()[-1])
    slow = "; ".join(f"{k}: {w.get('count', 0) - w.get('0.025', 0):.0f} over 25 ms, "
                     f"{w.get('count', 0) - w.get('0.05', 0):.0f} over 50 ms of "
                     f"{w.get('count', 0):.0f}" for k, w in sorted(work.items()))
    return (f"{total - le50:.0f} of {total:.0f}; master's event loop held (whole run, "
            f"start included) by {slow}")


def _load_large(cli: Payloads, n: int, size: int, limit_s: float) -> dict[str, int]:
    data = os.urandom(size)
    holders: dict[str, int] = {}
    deadline = time.monotonic() + limit_s
    for i in range(n):
        res = cli.put(f"r{i:05d}", data)
        for s in res.stored:
            holders[s.address] = holders.get(s.address, 0) + 1
        if time.monotonic() > deadline:
            break
    return holders


def _load_small(cli: Payloads, n: int, size: int, limit_s: float) -> dict[str, int]:
    holders: dict[str, int] = {}
    deadline = time.monotonic() + limit_s
    for i in range(0, n, 1000):
        k = min(1000, n - i)
        res = cli.put_batch([f"s{j:06d}" for j in range(i, i + k)],
                            [os.urandom(size) for _ in range(k)])
        for b in res.blobs:
            for s in b.stored:
                holders[s.address] = holders.get(s.address, 0) + 1
        if time.monotonic() > deadline:
            break
    return holders


def workload_r(ctx: Ctx) -> list[Row]:
    z = ctx.sizes
    rows = _repair(ctx, "R", "copy", z.r_blobs, z.r_bytes, _load_large)
    rows += _repair(ctx, "R.small", "small", z.s_blobs, z.s_bytes, _load_small)
    return rows


def _repair(ctx: Ctx, tag: str, name: str, count: int, size: int, load: Any) -> list[Row]:
    z = ctx.sizes
    small = size < (1 << 20)
    what = f"{count} x {size >> 10} KiB" if small else f"{count} x {size >> 20} MiB"
    ctx.say(f"{tag}: {what} at RF 2, kill -9 a holder, --max-copies-per-node "
            f"{z.copies_per_node}, --max-repair-bytes-per-node {z.repair_bytes >> 20} MiB")
    spec = ClusterSpec(rf=2, copies_per_node=z.copies_per_node, beat_s=0.5,
                       repair_bytes=z.repair_bytes, node_extra=(
                           "--repair-bytes-per-s", str(z.repair_pace)))
    rows: list[Row] = []
    with running_cluster(spec, ctx.fresh(name)) as cl, httpx.Client(timeout=10, headers=AUTH) as mc:
        cli = Payloads(cl.url, name)
        holders = load(cli, count, size, z.loop_limit_s)
        cli.close()
        victim_url = max(holders, key=lambda u: holders[u])
        lost = holders[victim_url]
        victim = cl.node_by_url(victim_url)
        fg = Foreground(cl.url, z.fg_bytes, z.fg_interval_s).start()
        time.sleep(z.fg_idle_s)
        t_idle1 = time.perf_counter()
        fg.stop()
        idle_p99, idle_n = fg.p99(0, t_idle1)
        idle_p50 = pct([lat for _, lat in fg.lats], 50)
        ctx.say(f"{tag}: killing {victim.name} ({lost} blobs); idle fg p99 {ms(idle_p99)} ms")
        victim.kill9()
        t_kill = time.perf_counter()
        t_notice = t_done = 0.0
        seen_work = False
        fg2: Foreground | None = None
        cpu = CpuMeter(cl.pids())
        with cpu.measure(), ctx.prof.record(f"{tag}.copy", cl.nodes[0].pid
                                            if cl.nodes[0] is not victim else cl.nodes[1].pid):
            while time.perf_counter() - t_kill < z.loop_limit_s:
                info = cl.info(mc)
                now = time.perf_counter()
                if not t_notice and any(n["address"] == victim_url and n["state"] == "dead"
                                        for n in info["nodes"]):
                    t_notice = now
                    fg2 = Foreground(cl.url, z.fg_bytes, z.fg_interval_s).start()
                if t_notice:
                    busy = (info["under_replicated"] or info["copies_in_flight"]
                            or info.get("copies_waiting", 0))
                    seen_work = seen_work or bool(busy)
                    if not busy and (seen_work or now - t_notice > 5.0):
                        t_done = now
                        break
                time.sleep(0.05)  # the master's status, 20 times a second
        if fg2 is not None:
            fg2.stop()
        slow_syncs = _slow_wal_syncs(mc, cl.url)
        truncated = not t_done
        el = (t_done or time.perf_counter()) - (t_notice or t_kill)
        rep_p99, rep_n = fg2.p99(t_notice, t_done or 1e18) if fg2 else (None, 0)
        nbytes = lost * size
        value = (lost / el if small else nbytes / el / 1e6) if el > 0 else 0.0
        rid = f"{tag}" if small else f"{tag}.copy"
        rows.append(Row(rid, f"re-replication of {what} blobs after kill -9 (master noticed "
                        "→ under_replicated 0, no copies in flight or waiting)",
                        round(value, 1), "blobs/s" if small else "MB/s", lost,
                        round(el, 2), cpu_s=cpu.used, truncated=truncated,
                        note=f"{lost} blobs ({nbytes / 1e6:.1f} MB) to copy; noticed "
                             f"{t_notice - t_kill:.2f}s after the kill; "
                             f"--max-copies-per-node {z.copies_per_node}, "
                             f"--max-repair-bytes-per-node {z.repair_bytes >> 20} MiB, "
                             f"data nodes' --repair-bytes-per-s {z.repair_pace or 'unpaced'}, "
                             f"0.5 s heartbeats").judge())
        fg_errs = fg.errors + (fg2.errors if fg2 else [])
        ratio = (rep_p99 / idle_p99) if rep_p99 and idle_p99 else 0.0
        rows.append(Row(f"{tag}.fg_p99_ratio" if not small else f"{tag}_fg_p99_ratio",
                        f"foreground put ({z.fg_bytes >> 10} KiB, "
                        f"{1 / z.fg_interval_s:.0f}/s) p99 during repair of {what} / idle",
                        round(ratio, 2), "x", rep_n, round(el, 2), ms(idle_p50),
                        ms(rep_p99), errors=len(fg_errs), truncated=truncated,
                        note=f"idle p99 {ms(idle_p99)} ms over {idle_n} puts; repair p99 "
                             f"{ms(rep_p99)} ms over {rep_n} puts; slowest idle: "
                             f"{fg.slowest(0, t_idle1)}; slowest in repair: "
                             + (fg2.slowest(t_notice, t_done or 1e18) if fg2 else "-")
                             + f"; master WAL fsyncs over 50 ms in the run: {slow_syncs}"
                             + (f"; errors: {fg_errs[:2]}" if fg_errs else "")).judge())
    return rows
