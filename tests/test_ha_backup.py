"""A backup of a master set is a copy of a standby's volume taken while the set serves
(docs/master.md, "Backups"): the copy, started alone, is a single master holding every
change the standby had applied; the leader never stops answering while it is taken. The
same copy restores a member whose disk was lost after the set's checkpoints dropped the
records an empty member would need."""

from __future__ import annotations

import json
import os
import shutil
import signal
import urllib.request
from pathlib import Path

import pytest

from squall.client import Client, NewTask
from tests.ha_kit import CLUSTER_KEY, MasterSetProcs, stats_total
from tests.helpers import ADMIN, running_master, wait_for

pytestmark = pytest.mark.timeout(300)


def members(url: str) -> dict[str, dict[str, object]]:
    """The leader's view of each member's journal (in_sync, status, lag)."""
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
            # in sync (it counts, and gets every group) is not enough: the put was answered
            # once the leader and one standby had it, and this standby's copy of it may
            # still be on its way. The backup is to hold it: wait for the leader's ticket
            def has_every_group() -> bool:
                view = members(ms.urls[lead])[ms.urls[standby]]
                return bool(view["in_sync"]) and view["lag"] == 0

            wait_for(has_every_group, 60, what="the standby holding the leader's last group")
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


def change(url: str, action: str, member: str) -> int:
    req = urllib.request.Request(
        f"{url}/v1/master/members", method="POST",
        data=json.dumps({"action": action, "member": member}).encode(),
        headers={**ADMIN, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return int(r.status)


def test_a_lost_member_is_restored_from_a_copy_of_a_standbys_volume(tmp_path: Path) -> None:
    """The way back for a member whose disk was lost once the set's checkpoints dropped
    the records an empty one would need (tests/test_ha_level.py has that refusal): a copy
    of a standby's volume. Started, the copy answers as a copy (it never counts with the
    other member's promises); re-added, it is levelled and then counts: with the copy's
    source down, it and the leader are the majority that holds every acknowledged task."""
    (tmp_path / "set").mkdir()
    ms = MasterSetProcs(str(tmp_path / "set"), 3, lease_secs=2.0)
    ms.start_all()
    try:
        lead = ms.wait_leader(90)
        src, lost = (lead + 1) % 3, (lead + 2) % 3
        with Client(ms.urls[lead], retries=0, timeout=10.0) as c:
            for i in range(20):
                c.put("rc#q", None, pid=f"a{i:02}")
            ms.kill(lost)
            ms.wipe(lost)
            for i in range(10):  # acknowledged by the leader and src
                c.put("rc#q", None, pid=f"b{i:02}")
            # the restore: a copy of a standby's volume (frozen for the copy, as a
            # snapshot is), while the leader goes on with the other standby
            ms.kill(src, signal.SIGSTOP)
            try:
                shutil.copytree(ms.data_dir(src), ms.data_dir(lost), symlinks=True)
            finally:
                ms.kill(src, signal.SIGCONT)
            ms.start(lost)
            wait_for(lambda: "a copy of" in str(members(ms.urls[lead])[ms.urls[lost]]), 60,
                     what="the copy answers as a copy, counting for nothing")
            for i in range(10):
                c.put("rc#q", None, pid=f"c{i:02}")
            assert change(ms.urls[lead], "add", ms.urls[lost]) == 200
            wait_for(lambda: members(ms.urls[lead])[ms.urls[lost]]["in_sync"], 60,
                     what="the restored member levelled and counting")
            ms.kill(src)  # the copy's source gone: the restored member is the majority
            for i in range(5):
                c.put("rc#q", None, pid=f"d{i:02}")
        ms.kill(lead)
        ms.start(src)  # src lacks the d-tasks: only the restored member holds them
        new = ms.wait_leader(90, not_=lead)
        assert stats_total(ms.urls[new], "rc#q") == 45
    finally:
        ms.stop()


def test_the_wal_kept_for_a_member_that_is_down_is_bounded(tmp_path: Path) -> None:
    """The leader keeps the WAL segments a lagging member still lacks, up to
    --max-wal-kept-mb: a member down for long must not fill the leader's disk."""
    (tmp_path / "set").mkdir()
    ms = MasterSetProcs(str(tmp_path / "set"), 3, lease_secs=2.0,
                        extra=["--max-wal-kept-mb", "1", "--checkpoint-interval-s", "0.3"])
    ms.start_all()
    try:
        lead = ms.wait_leader(90)
        down = (lead + 1) % 3
        ms.kill(down)
        wal = Path(ms.data_dir(lead)) / "wal"

        def first_ticket() -> int:
            return min(int(p.name[4:-4]) for p in wal.glob("wal-*.log"))

        start = first_ticket()
        with Client(ms.urls[lead], retries=0, timeout=30.0) as c:
            for b in range(400):
                c.put_many("wk#q", [NewTask(pid=f"p{b:03}-{i:02}") for i in range(50)])
                if first_ticket() > start:
                    break
            wait_for(lambda: first_ticket() > start, 60,
                     what="the leader's WAL dropped what only the down member lacks")
        assert "no longer kept" in ms.log(lead)
    finally:
        ms.stop()
