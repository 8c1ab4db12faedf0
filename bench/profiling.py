"""Optional profiling of a benchmark's server with py-spy (``--profile``, needs root).

:class:`Profiler` records raw collapsed stacks of a server process during measured loops;
:func:`summarize_profile` turns one recording into busy samples by module and by hot-path
function. Kept apart from :mod:`bench.harness` so each module stays small.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.harness import ROOT


class Profiler:
    """`py-spy record` on the server during measured loops; raw collapsed stacks."""

    def __init__(self, out_dir: Path | None) -> None:
        self.out_dir = out_dir
        self.summaries: dict[str, dict[str, Any]] = {}

    @contextlib.contextmanager
    def record(self, label: str, pid: int) -> Iterator[None]:
        if self.out_dir is None:
            yield
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        out = self.out_dir / f"{label}.txt"
        try:
            with py_spy(out, pid, 100):
                yield
        finally:
            if out.exists():
                self.summaries[label] = summarize_profile(out)


@contextlib.contextmanager
def py_spy(out: Path, pid: int, rate: int, *extra: str, attach_s: float = 0.5
           ) -> Iterator[None]:
    """``py-spy record`` of `pid` (raw collapsed stacks, with thread ids) into `out` while
    the block runs; `extra`: more of py-spy's options (``--subprocesses``)."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    log = out.with_name(out.name + ".log")  # py-spy's messages (a pipe nobody reads could fill)
    with log.open("wb") as err:
        p = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", str(rate),
                              "--format", "raw", "--threads", *extra, "-o", str(out)],
                             stdout=subprocess.DEVNULL, stderr=err)
    time.sleep(attach_s)  # let py-spy attach
    if p.poll() is not None:
        lines = log.read_text(errors="replace").splitlines()
        why = next((x for x in lines if x.startswith("Error")), lines[0] if lines else "")
        raise RuntimeError(f"py-spy exited: {why[:300]} (it needs root or ptrace rights, "
                           f"and process {pid} alive)")
    try:
        yield
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()


def _frame_module(frame: str) -> str:
    """'func (path:line)' -> squall.master.storage.wal for squall, else the top-level package."""
    m = re.search(r"\((.*?):\d+\)$", frame)
    path = (m.group(1) if m else frame).split("site-packages/")[-1]
    if "/squall/" in "/" + path:
        return "squall." + path.split("squall/", 1)[1].removesuffix(".py").replace("/", ".")
    if path.startswith(str(ROOT)):
        return "squall." + path[len(str(ROOT)) + 1 :].removesuffix(".py").replace("/", ".")
    return path.split("/", 1)[0].removesuffix(".py")


# leaf frames that are a thread waiting (uvloop's C loop shows as Runner.run)
IDLE_LEAVES = ("Runner.run (", "Condition.wait (", "Queue.get (", "Event.wait (",
               "select (", "Thread.join (")


# functions whose inclusive share is reported: where a request's time goes
WATCH = frozenset((
    "RequestResponseCycle.run_asgi", "HttpToolsProtocol.data_received",
    "RequestResponseCycle.send", "solve_dependencies", "run_in_threadpool",
    "request_body_to_args", "request_params_to_args", "Request.json", "Request.body",
    "run_endpoint_function", "Master._execute", "Engine.plan_enqueue", "Engine.plan_update",
    "Engine.plan_lease", "Engine.sweep", "Engine.apply", "apply", "Index.put_task",
    "Index.delete_task", "WAL.append", "WAL.durable", "WAL._write", "WAL._run", "JSON.render",
))


def summarize_profile(path: Path, top: int = 12) -> dict[str, Any]:
    """Per thread: samples; busy samples (leaf not a wait) by module of the innermost frame,
    and by function inclusive. Busy excludes uvloop's own C work (it shows as Runner.run)."""
    self_by_mod: Counter[str] = Counter()
    incl_by_fn: Counter[str] = Counter()
    by_thread: Counter[str] = Counter()
    total = busy = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        k = int(n)
        frames = stack.split(";")
        thread = "?"
        if frames[0].startswith("thread ("):
            thread = frames[0].split(": ", 1)[-1]
            frames = frames[1:]
        total += k
        idle = not frames or frames[-1].startswith(IDLE_LEAVES)
        by_thread[f"{thread} {'idle' if idle else 'busy'}"] += k
        if idle:
            continue
        busy += k
        self_by_mod[_frame_module(frames[-1])] += k
        for fn in {f.split(" (", 1)[0] for f in frames}:
            if fn in WATCH:
                incl_by_fn[fn] += k

    def share(c: Counter[str]) -> list[tuple[str, float]]:
        return [(name, round(100 * v / max(1, busy), 1)) for name, v in c.most_common(top)]

    return {"samples": total, "busy_samples": busy, "by_thread": dict(by_thread),
            "busy_self_by_module_pct": share(self_by_mod),
            "busy_inclusive_by_function_pct": share(incl_by_fn)}

