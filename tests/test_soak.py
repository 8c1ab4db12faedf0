"""The chaos soak, short: a fixed seed, a ~60 s fault window, every fault kind at least once
(where this machine allows: partitions and disk faults need root for namespaces and
tmpfs), 128 concurrent clients for a few seconds, then the ledger checks. The long run is
``make soak`` (bench/soak.py). See docs/testing.md, "The chaos soak"."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos import netns
from tests.chaos.faults import KINDS, NEEDS_ROOT, plan
from tests.chaos.ledger import check

SEED = 1
# The short run has one node loss only (node restarts dominate its time on a loaded
# machine); kill_two_nodes, kill_holder_during_repair and fill_node_disk run in the long
# one (`make soak`).
KINDS_SHORT = ("kill_master", "kill_node", "kill_worker", "fill_master_disk",
               "partition_node")


def run_bounded(cmd: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run the soak in its own session; past `timeout`, SIGTERM it (it stops its servers),
    then SIGKILL whatever of its process group is left, so no server outlives the test."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate(timeout=30)
    return subprocess.CompletedProcess(cmd, p.returncode, out, "")


@pytest.mark.timeout(600)  # ~90 s on a quiet machine; 4.5 minutes at a load average of 45
def test_short_chaos_soak_keeps_the_ledger(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "tests.chaos.run", "--seed", str(SEED), "--seconds", "20",
           "--swarm-seconds", "8", "--rate", "40", "--dir", str(tmp_path / "work"),
           "--kinds", ",".join(KINDS_SHORT), "--json", str(summary)]
    r = run_bounded(cmd, timeout=540)
    assert summary.exists(), r.stdout[-4000:]
    s = json.loads(summary.read_text())
    assert s["failures"] == [], "\n".join(s["failures"]) + "\n" + r.stdout[-6000:]
    assert r.returncode == 0, r.stdout[-4000:]
    ran = {e["kind"] for e in s["episodes"]}
    want = set(KINDS_SHORT) - (set() if netns.possible() is None else set(NEEDS_ROOT))
    assert ran == want, f"fault kinds that never ran: {want - ran}"
    led = s["ledger"]
    assert led["acked_puts"] > 200 and led["acked_dones"] > 50, led
    assert s["swarm"]["clients"] == 128 and s["swarm"]["puts"] > 0, json.dumps(s["swarm"])


def test_the_ledger_checker_catches_each_broken_promise() -> None:
    def put(pid: str, kind: str = "put", c: int = 7) -> dict[str, object]:
        return {"k": kind, "q": "s#a", "pid": pid, "crc": c, "n": 1, "err": "Unavailable()"}

    def wire(seq: int) -> str:  # a lease token as the master answers it
        return f"{seq}.{seq:032x}"

    def got(pid: str, seq: int, c: int = 7) -> dict[str, object]:
        return {"k": "got", "q": "s#a", "pid": pid, "tok": wire(seq), "crc": c, "w": "w0"}

    def done(pid: str, seq: int) -> dict[str, object]:
        return {"k": "done", "q": "s#a", "pid": pid, "tok": wire(seq)}

    fine = [put("a"), got("a", 1), got("a", 2), done("a", 2), put("b", "put?"), got("b", 5),
            put("c", "put?"), put("d", "put-")]
    v, exists = check(fine)
    assert v.failures() == [] and v.duplicate_deliveries == 1
    assert exists == {("s#a", "a"), ("s#a", "b")} and v.tasks == 2  # c, d never landed
    assert v.ambiguous_puts == 2 and v.refused_puts == 1
    cases = {
        "acknowledged puts lost": [put("x")],
        "deliveries after an acknowledged done": [put("x"), got("x", 1), done("x", 1),
                                                  got("x", 2)],
        "payloads differing": [put("x"), got("x", 1, c=8)],
        "refused puts applied anyway": [put("x", "put-"), got("x", 1)],
        "deliveries of tasks nobody put": [got("x", 1)],
    }
    for what, recs in cases.items():
        failures = check(recs)[0].failures()
        assert len(failures) == 1 and what in failures[0], (what, failures)


def test_a_seed_fixes_the_fault_sequence() -> None:
    a, b = plan(7, KINDS, 3), plan(7, KINDS, 3)
    assert a == b and a != plan(8, KINDS, 3)
    assert {f.kind for f in a[:len(KINDS)]} == set(KINDS)  # every kind early on
