"""Shared pieces of the data node benchmark: targets, sizes, result rows and the results
files (table, JSON, Markdown)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench.dn_cluster import MIB, Payloads
from bench.harness import load1
from bench.profiling import Profiler

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "bench" / "results"
WORKLOADS = ("C", "D", "R")
TARGETS: dict[str, tuple[str, float, str]] = {
    "C.rf1.put": (">=", 276, "RabbitMQ put, fsync on"),
    "C.rf1.get": (">=", 1200, "Redis drain"),
    "C.rf2.put": (">=", 150, "disk ~370 MB/s with fsync, every byte written twice"),
    "D.batch.put": (">=", 32_000, "Redis AOF-always batch"),
    "D.batch.drain": (">=", 32_000, "Redis AOF-always batch"),
    "D.4x4.put": (">=", 1_000, ""),
    "D.4x4.drain": (">=", 1_000, ""),
    "R.copy": (">=", 100, "disk speed"),
    "R.fg_p99_ratio": ("<=", 2.0, "p99 during repair / p99 idle"),
    "R.small": (">=", 2_000, "1 KiB blobs re-replicated per second"),
    "R.small_fg_p99_ratio": ("<=", 2.0, "p99 during repair / p99 idle"),
}


@dataclass(frozen=True)
class Sizes:
    c_blobs: int = 200
    c_bytes: int = 4 * MIB
    c_lease: int = 10
    d_tasks: int = 20_000
    d_batch: int = 100
    d_bytes: int = 1024
    procs: int = 4
    threads: int = 4
    r_blobs: int = 256
    r_bytes: int = 4 * MIB
    fg_bytes: int = 64 << 10
    fg_interval_s: float = 0.025
    fg_idle_s: float = 8.0
    s_blobs: int = 20_000
    s_bytes: int = 1024
    copies_per_node: int = 5000
    repair_bytes: int = 64 << 20
    repair_pace: int = 0  # the data nodes' --repair-bytes-per-s in R (0: unpaced)
    loop_limit_s: float = 300.0

    def quick(self) -> Sizes:
        return replace(self, c_blobs=40, d_tasks=2_000, r_blobs=64, s_blobs=4_000,
                       fg_idle_s=4.0,
                       loop_limit_s=120.0)


@dataclass
class Row:
    id: str
    what: str
    value: float
    unit: str
    n: int = 0
    elapsed_s: float = 0.0
    p50_ms: float | None = None
    p99_ms: float | None = None
    target: float | None = None
    op: str = ""
    ratio: float | None = None  # value / target (target / value for "<=")
    passed: bool | None = None
    cpu_s: dict[str, float] = field(default_factory=dict)
    load1: float = 0.0
    errors: int = 0
    truncated: bool = False
    note: str = ""

    def judge(self) -> Row:
        if self.id in TARGETS:
            self.op, self.target, _ = TARGETS[self.id]
            good = self.value >= self.target if self.op == ">=" else self.value <= self.target
            self.passed = good and not self.errors and not self.truncated
            if self.value:
                self.ratio = round(self.value / self.target if self.op == ">="
                                   else self.target / self.value, 3)
        self.load1 = load1()
        return self


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1000, 2)


def phases(cli: Payloads, n: int) -> str:
    """The client's time per step, in ms per item (then cleared)."""
    out = ", ".join(f"{k} {1000 * v / max(1, n):.2f}" for k, v in cli.phases.items())
    cli.phases.clear()
    return f"ms per item: {out}"


@dataclass
class Ctx:
    sizes: Sizes
    tmp: Path
    prof: Profiler
    say: Any
    n: int = 0

    def fresh(self, name: str) -> Path:
        self.n += 1
        d = self.tmp / f"{self.n:02d}-{name}"
        d.mkdir(parents=True)
        return d



# -- results ---------------------------------------------------------------------------------
def _fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 10 else f"{v:,.0f}"
    if isinstance(v, dict):
        return " ".join(f"{k}:{x:g}" for k, x in v.items())
    return str(v)


COLUMNS = [("id", "id"), ("value", "value"), ("unit", "unit"), ("target", "target"),
           ("ratio", "ratio"), ("passed", "met"), ("p50_ms", "p50 ms"), ("p99_ms", "p99 ms"),
           ("elapsed_s", "s"), ("cpu_s", "CPU s"), ("load1", "load")]


def _cell(r: dict[str, Any], k: str) -> str:
    if k == "target":
        return f"{r['op']} {_fmt(r['target'])}" if r.get("target") is not None else ""
    return _fmt(r.get(k))


def render_md(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [f"# squall data node benchmark ({doc['mode']})", "",
             f"- date: {doc['date']}",
             f"- machine: nproc {m['nproc']}, {m['cpu']}, {m['mem_gb']} GB RAM; "
             f"{m['platform']}; python {m['python']}",
             f"- commit {m['commit']}; fdatasync of 100 B: p50 {m['fdatasync_ms']['p50']} ms",
             f"- load average at start {', '.join(f'{x:.2f}' for x in m['load_at_start'])}, "
             f"at end {', '.join(f'{x:.2f}' for x in m.get('load_at_end', []))} (2 cores "
             "shared with other work: the `load` column is the 1-minute load after each "
             "figure)",
             f"- niceness {doc.get('nice', 0)}; sizes: "
             + ", ".join(f"{k}={v}" for k, v in doc["sizes"].items()), "",
             "| " + " | ".join(h for _, h in COLUMNS) + " |",
             "|" + "|".join("---" for _ in COLUMNS) + "|"]
    for r in doc["rows"]:
        lines.append("| " + " | ".join(_cell(r, k).replace("|", "/") for k, _ in COLUMNS)
                     + " |")
    lines += ["", "What each row measures, and notes:", ""]
    lines += [f"- **{r['id']}**: {r['what']}" + (f". {r['note']}" if r.get("note") else "")
              for r in doc["rows"]]
    lines += ["", "Targets:", ""]
    lines += [f"- {k} {op} {v:,} {why}" for k, (op, v, why) in TARGETS.items()]
    if doc.get("profiles"):
        lines += ["", "Profiles (py-spy of one data node, busy samples by module):", ""]
        for label, s in doc["profiles"].items():
            top = ", ".join(f"{n} {p}%" for n, p in s["busy_self_by_module_pct"][:8])
            lines.append(f"- {label} ({s['busy_samples']} busy of {s['samples']}): {top}")
    return "\n".join(lines) + "\n"


def print_table(rows: list[dict[str, Any]]) -> None:
    widths = [max(len(h), *(len(_cell(r, k)) for r in rows)) for k, h in COLUMNS]
    print("  ".join(h.ljust(w) for (_, h), w in zip(COLUMNS, widths, strict=True)))
    for r in rows:
        print("  ".join(_cell(r, k).ljust(w) for (k, _), w in zip(COLUMNS, widths,
                                                                  strict=True)))


def write_results(out: Path, stem: str, doc: dict[str, Any], merge: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    jpath = out / f"{stem}.json"
    if merge and jpath.exists():
        try:
            old = json.loads(jpath.read_text())
            ran = {r["id"].split(".")[0] for r in doc["rows"]}
            doc["rows"] = sorted([r for r in old["rows"] if r["id"].split(".")[0] not in ran]
                                 + doc["rows"], key=lambda r: WORKLOADS.index(r["id"][0]))
        except (ValueError, KeyError):
            pass
    jpath.write_text(json.dumps(doc, indent=2) + "\n")
    (out / f"{stem}.md").write_text(render_md(doc))


