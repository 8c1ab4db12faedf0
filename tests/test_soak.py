"""The chaos soak, short: a fixed seed, a ~60 s fault window, every fault kind at least once
(where this machine allows: partitions and disk faults need root for namespaces and
tmpfs), 128 concurrent clients for a few seconds, then the ledger checks. The long run is
``make soak`` (bench/soak.py). See docs/testing.md, "The chaos soak"."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.chaos import netns
from tests.chaos.faults import NEEDS_ROOT

SEED = 1
# The short run leaves out two kinds the long one has: kill_holder_during_repair (slow:
# two node restarts and a repair) and fill_master_disk, which fails today (issue 11 item 2:
# a master whose disk filled up refuses every write until restarted while /readyz says 200).
# Add it back here once that is fixed.
KINDS_SHORT = ("kill_master", "kill_node", "kill_two_nodes", "kill_worker", "fill_node_disk",
               "partition_node")


@pytest.mark.timeout(600)  # ~90 s on a quiet machine; 3 minutes at a load average of 28
def test_short_chaos_soak_keeps_the_ledger(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "tests.chaos.run", "--seed", str(SEED), "--seconds", "30",
           "--swarm-seconds", "8", "--rate", "40", "--dir", str(tmp_path / "work"),
           "--kinds", ",".join(KINDS_SHORT), "--json", str(summary)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=560, check=False)
    assert summary.exists(), r.stdout[-4000:] + r.stderr[-4000:]
    s = json.loads(summary.read_text())
    assert s["failures"] == [], "\n".join(s["failures"]) + "\n" + r.stdout[-6000:]
    assert r.returncode == 0, r.stdout[-4000:]
    ran = {e["kind"] for e in s["episodes"]}
    want = set(KINDS_SHORT) - (set() if netns.possible() is None else set(NEEDS_ROOT))
    assert ran == want, f"fault kinds that never ran: {want - ran}"
    led = s["ledger"]
    assert led["acked_puts"] > 200 and led["acked_dones"] > 50, led
    assert s["swarm"]["clients"] == 128 and s["swarm"]["puts"] > 0, s["swarm"]
