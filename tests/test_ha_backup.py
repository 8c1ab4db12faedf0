"""A backup of a master set is a copy of a standby's volume taken while the set serves
(docs/master.md, "Backups"): the copy, started alone, is a single master holding every
change the standby had applied; the leader never stops answering while it is taken."""

from __future__ import annotations

import json
import os
import shutil
import signal
import urllib.request
from pathlib import Path

import pytest

from squall.client import Client
from tests.ha_kit import CLUSTER_KEY, MasterSetProcs
from tests.helpers import ADMIN, running_master, wait_for

pytestmark = pytest.mark.timeout(300)


def members(url: str) -> dict[str, dict[str, object]]:
    req = urllib.request.Request(f"{url}/v1/master/members", headers=ADMIN)
    with urllib.request.urlopen(req, timeout=5) as r:
        out: dict[str, dict[str, object]] = json.load(r)["log"]["members"]
        return out


def test_a_standby_copy_taken_while_the_set_serves_restores_as_a_single_master(
        tmp_path: Path) -> None:
    (tmp_path / "set").mkdir()
    ms = MasterSetProcs(str(tmp_path / "set"), 3, lease_secs=2.0)
    ms.start_all()
    try:
        lead = ms.wait_leader(90)
        standby = (lead + 1) % 3
        with Client(ms.urls[lead], retries=0, timeout=10.0) as c:
            for i in range(30):
                c.put("bk#q", None, pid=f"b{i:02}")
            got = c.lease("bk#q", max_tasks=10, lease_secs=600)
            assert len(got) == 10
            c.done(got)
            c.put("bk#other", None, pid="x")
            wait_for(lambda: members(ms.urls[lead])[ms.urls[standby]]["in_sync"], 60,
                     what="the standby in sync")
            # the "snapshot": the standby frozen for the copy, as a volume snapshot is
            # atomic; the set keeps serving on the other two members meanwhile
            ms.kill(standby, signal.SIGSTOP)
            try:
                shutil.copytree(ms.data_dir(standby), tmp_path / "backup", symlinks=True)
                c.put("bk#q", None, pid="during")  # acknowledged by leader + other member
            finally:
                ms.kill(standby, signal.SIGCONT)
        os.chmod(tmp_path / "backup", 0o700)
    finally:
        ms.stop()
    with running_master(str(tmp_path / "backup"),
                        env={"SQUALL_CLUSTER_KEY": CLUSTER_KEY}) as m, \
            Client(m.url, retries=0, timeout=10.0) as c:
        s = c.stats("bk#q")
        assert (s.available, s.leased) == (20, 0), s  # the 10 acknowledged dones hold
        assert {t.pid for t in c.lease("bk#q", max_tasks=100, lease_secs=60)} == {
            f"b{i:02}" for i in range(10, 30)}
        assert c.stats("bk#other").available == 1
