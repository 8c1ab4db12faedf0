"""The chaos soak against a master set of three, short: a fixed seed, a ~20 s fault window
with every master-set fault at least once (the leader killed -9, SIGSTOPped past its lease,
cut off from the elector only and from the other members only; a standby wiped and
re-added), then the ledger checks. The partitions need network namespaces (root) and the
elector partition an etcd (``make etcd``); without them those kinds are skipped, with the
reason the soak prints. The long run is ``make soak`` (``SOAK_MASTERS``). See
docs/testing.md, "The chaos soak"."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.chaos import netns
from tests.chaos.faults import SET_NEEDS_ROOT, SET_ONLY_KINDS
from tests.test_soak import run_bounded

SEED = 1  # a schedule runs every kind once first (in a seeded order)
KINDS = ("kill_leader", *SET_ONLY_KINDS)


def expected_skips() -> dict[str, str]:
    """The kinds this machine cannot run, as the soak decides them."""
    why = netns.possible()
    if why is not None:
        return dict.fromkeys(SET_NEEDS_ROOT, why)
    if shutil.which("etcd") is None:
        return {"partition_leader_elector": "no etcd binary"}
    return {}


@pytest.mark.timeout(900)  # ~2 minutes on a quiet machine; generous for a loaded one
def test_short_master_set_soak_keeps_the_ledger(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "tests.chaos.run", "--seed", str(SEED), "--seconds", "20",
           "--masters", "3", "--swarm-clients", "32", "--swarm-seconds", "5", "--rate", "40",
           "--dir", str(tmp_path / "work"), "--kinds", ",".join(KINDS),
           "--json", str(summary)]
    r = run_bounded(cmd, timeout=840)
    assert summary.exists(), r.stdout[-4000:]
    s = json.loads(summary.read_text())
    assert s["failures"] == [], "\n".join(s["failures"]) + "\n" + r.stdout[-6000:]
    assert r.returncode == 0, r.stdout[-4000:]
    skipped = expected_skips()
    assert set(s["skipped_kinds"]) == set(skipped), s["skipped_kinds"]
    for kind in skipped:
        assert f"fault kind {kind} skipped: " in r.stdout  # the reason is printed
    ran = s["episodes"]
    assert {e["kind"] for e in ran} == set(KINDS) - set(skipped), \
        f"fault kinds that never ran: {set(KINDS) - set(skipped) - {e['kind'] for e in ran}}"
    assert not [e for e in ran if "error" in e], ran
    for e in ran:
        if e["kind"] != "wipe_standby":  # another member led, in a higher epoch
            assert e["new_leader"], e
        if "epochs" in e:
            assert e["epochs"][1] > e["epochs"][0], e
        if e["kind"] == "stop_leader":  # the put it got while stopped was not acknowledged
            assert not (isinstance(e["late_put"], int) and 200 <= e["late_put"] < 300), e
        if e["kind"] == "wipe_standby":  # seen unformatted, then re-added and caught up
            assert e["unformatted_after_s"] >= 0 and e["caught_up_s"] >= 0, e
    if "partition_leader_elector" not in skipped:
        assert s["elector"] == "etcd"
    led = s["ledger"]
    assert led["acked_puts"] > 200 and led["acked_dones"] > 50, led
    assert led["lost"] == 0 and led["after_done"] == 0 and led["refused_applied"] == 0, led
