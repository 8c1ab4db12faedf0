"""The soak's figures as markdown (bench/results/soak.md)."""

from __future__ import annotations

import platform
import time
from collections import defaultdict
from typing import Any


def _fmt(xs: list[float]) -> str:
    if not xs:
        return "-"
    return f"{min(xs):.1f} / {sum(xs) / len(xs):.1f} / {max(xs):.1f}"


def _other(kind: str, es: list[dict[str, Any]]) -> list[str]:
    """The notes column of one fault kind's row."""
    never = sum(1 for e in es if "to_rf_s" in e and e["to_rf_s"] is None)
    other = []
    if never:
        other.append(f"{never} never back at RF within 120 s")
    if any("declared_dead" in e for e in es):
        other.append(f"declared dead {sum(bool(e.get('declared_dead')) for e in es)}"
                     f"/{len(es)}, copies seen {sum(bool(e.get('copies_seen')) for e in es)}"
                     f"/{len(es)}")
    if any("repair_seen" in e for e in es):
        other.append(f"second kill during copies {sum(bool(e.get('repair_seen')) for e in es)}"
                     f"/{len(es)}")
    errs = [e["error"] for e in es if "error" in e]
    if errs:
        other.append(f"errors: {errs[:2]}")
    if kind == "kill_master":
        other.append(f"restart s {_fmt([e['restart_s'] for e in es if 'restart_s' in e])}")
    for note, label in (("failover_s", "failover s"), ("step_down_s", "stepped down s"),
                        ("stopped_s", "stopped s"), ("caught_up_s", "re-added to in sync s"),
                        ("standby_again_s", "standby again s"),
                        *([("restart_s", "restarted to in sync s")]
                          if kind == "kill_leader" else [])):
        xs = [e[note] for e in es if e.get(note) is not None]
        if xs:
            other.append(f"{label} {_fmt(xs)}")
    if kind == "stop_leader":
        other.append(f"answers to a put sent while stopped: {[e.get('late_put') for e in es]}")
    if kind == "fill_master_disk":
        other.append("writes resumed after free s: "
                     f"{[e.get('writes_resume_s') for e in es]}; restarted by the harness: "
                     f"{sum(1 for e in es if e.get('restarted_by_harness'))}")
    return other


def write_report(path: str, s: dict[str, Any]) -> None:
    eps = s.get("episodes", [])
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in eps:
        by_kind[e["kind"]].append(e)
    led = s.get("ledger", {})
    la = s.get("load_average", (0, 0, 0))
    out = [
        "# Chaos soak",
        "",
        f"Run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.machine()}, "
        f"{s.get('seconds_total', 0):.0f} s in all; load average at the end "
        f"{la[0]:.2f} / {la[1]:.2f} / {la[2]:.2f} (a shared 2-core machine: other jobs ran "
        f"alongside). Replay: `{s.get('replay')}` (see docs/testing.md).",
        "",
        f"- seed **{s['seed']}**; network namespaces and tmpfs disks: "
        f"{'yes' if s.get('netns') else 'no (127.0.0.1, no partitions or disk faults)'}",
        *([f"- a master set of {s['masters']}, elected by {s.get('elector')}"]
          if s.get("masters", 1) > 1 else []),
        *[f"- fault kind `{k}` skipped: {why}" for k, why in
          (s.get("skipped_kinds") or {}).items()],
        f"- verdict: **{'FAILED' if s.get('failures') else 'passed'}**",
        "",
        "## Ledger",
        "",
        "| what | count |",
        "|---|---:|",
    ]
    for k in ("acked_puts", "ambiguous_puts", "refused_puts", "refused_applied", "tasks",
              "deliveries", "duplicate_deliveries", "acked_dones", "ambiguous_dones",
              "refused_dones", "auto_dones", "lost", "after_done", "differing",
              "unknown_deliveries"):
        out.append(f"| {k.replace('_', ' ')} | {led.get(k, '-')} |")
    out += ["", "`tasks` = acknowledged puts plus ambiguous ones that were delivered; "
            "`duplicate deliveries` = deliveries beyond the first of a task (at-least-once: "
            "killed workers, expired or lost leases, refused dones).", "",
            "## Counters against the ledger (after the drain)", "",
            "| queue | master completed | master enqueued_total | ledger tasks | left |",
            "|---|---:|---:|---:|---:|"]
    for q, c in s.get("counters", {}).items():
        if isinstance(c, dict):
            out.append(f"| {q} | {c['completed']} | {c['enqueued_total']} | "
                       f"{c['ledger_tasks']} | {c['left']} |")
    for name in ("squall_tasks_completed_total", "squall_tasks_enqueued_total"):
        out.append(f"\n`{name}` = {s.get('counters', {}).get(name)}")
    out.append("")
    out += ["## Fault episodes", "",
            "| fault | episodes | hold s (min/mean/max) | time to RF s (min/mean/max) | "
            "other |", "|---|---:|---|---|---|"]
    for kind, es in sorted(by_kind.items()):
        rf = [e["to_rf_s"] for e in es if e.get("to_rf_s") is not None]
        other = _other(kind, es)
        out.append(f"| {kind} | {len(es)} | {_fmt([e['hold_s'] for e in es])} | {_fmt(rf)} | "
                   f"{'; '.join(other)} |")
    out += ["", f"Worker processes SIGKILLed: {s.get('worker_kills', 0)}. Time to RF: from "
            "the fault until the master reports every node alive, nothing under-replicated "
            "or lost and no copy in flight (for short holds the node is often back before "
            "it is declared dead).", ""]
    sw = s.get("swarm")
    if sw:
        out += ["## 128 concurrent clients", "",
                f"{sw.get('clients')} `AsyncClient`s in one process (half putting, half "
                f"leasing and dequeueing `soak#swarm`) for {sw.get('secs')} s, during the "
                "fault schedule:", "",
                "| puts | leases | put p50 / p99 ms | lease p50 / p99 ms | errors |",
                "|---:|---:|---|---|---|",
                f"| {sw.get('puts')} | {sw.get('leases')} | {sw.get('put_p50_ms')} / "
                f"{sw.get('put_p99_ms')} | {sw.get('lease_p50_ms')} / {sw.get('lease_p99_ms')} "
                f"| {sw.get('errors')} |", ""]
        out += [f"- {k}: `{v}`" for k, v in sw.get("error_examples", {}).items()] + [""]
    out += ["## Replication and settling", "",
            f"- settle after the faults: {s.get('settle_s')} s; drain: {s.get('drain_s')} s",
            f"- RF check: {s.get('rf_check')}", ""]
    if s.get("failures"):
        out += ["## Failures", ""] + [f"- {f}" for f in s["failures"]] + [""]
    with open(path, "w") as f:
        f.write("\n".join(out))
