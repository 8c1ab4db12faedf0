"""The servers' runtime settings (common/server/runtime.py): run in a fresh interpreter, so that
the test process keeps Python's defaults."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from squall.common.server import runtime

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import gc, json, platform, sys
from squall.common.server import runtime
from tests.helpers import wait_for  # before the tuning: its collections are not the timer's
runtime.serve_tuning(full_every_s=0.05)
runtime.serve_tuning()  # idempotent: one callback, one timer
before = runtime.PAUSES[2].counts[:]
wait_for(lambda: sum(runtime.PAUSES[2].counts) >= sum(before) + 2, 30, interval=0.01,
         what="two full collections by the timer")
print(json.dumps({"frozen": gc.get_freeze_count(), "threshold": gc.get_threshold(),
                  "switch": sys.getswitchinterval(), "callbacks": gc.callbacks.count(
                      runtime._observe), "full": sum(runtime.PAUSES[2].counts),
                  "text": runtime.metric(), "glibc": platform.libc_ver()[0] == "glibc",
                  "kept": runtime.keep_freed_memory()}))
"""


def test_serve_tuning_freezes_startup_objects_and_times_full_collections() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=60, check=True, cwd=ROOT)  # tests.helpers importable
    got = json.loads(out.stdout)
    assert got["frozen"] > 1000  # the imports' objects left every later collection
    assert got["threshold"] == [runtime.GEN0, runtime.GEN1, runtime.GEN2]
    assert got["switch"] == runtime.SWITCH_INTERVAL_S
    assert got["callbacks"] == 1
    assert got["full"] >= 3  # the one at start, then the timer's
    assert 'squall_gc_pause_seconds_count{generation="2"}' in got["text"]
    assert got["kept"] is got["glibc"]  # mallopt took both settings (glibc only)

