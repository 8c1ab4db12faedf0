"""A master set of three real processes on loopback (file lease elector): kill -9 of the
leader under load, SIGSTOP of the leader past its lease, a wiped standby re-added. Each
with a ledger: no acknowledged task lost, no delivery after an acknowledged done.
(`make soak` repeats the kill many more times: bench/ha_bench.py.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from squall.client import Client, SquallError
from tests.ha_kit import Ledger, MasterSetProcs, stats_total
from tests.helpers import ADMIN, ADMIN_TOKEN, wait_for

pytestmark = pytest.mark.timeout(300 + 60 * int(os.environ.get("SQUALL_HA_KILLS", "3")))


def unread_request_at(port: int) -> bool:
    """Whether a connection this process opened to 127.0.0.1:`port` has bytes the server
    has not read yet in its socket (/proc/net/tcp: a stopped server's kernel still accepts
    and buffers)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                mine.add(link[8:-1])
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.read().splitlines()[1:]]

    def port_of(addr: str) -> int:
        return int(addr.split(":")[1], 16)

    ours = {port_of(r[1]) for r in rows if r[9] in mine and port_of(r[2]) == port}
    return any(port_of(r[1]) == port and port_of(r[2]) in ours
               and int(r[4].split(":")[1], 16) > 0 for r in rows)


def _running_set(root: str) -> Iterator[MasterSetProcs]:
    m = MasterSetProcs(root, 3, lease_secs=2.0)
    m.start_all()
    try:
        m.wait_leader(90)
        yield m
    finally:
        m.stop()


@pytest.fixture
def ms(tmp_path) -> Iterator[MasterSetProcs]:  # type: ignore[no-untyped-def]
    """A master set of its own, for a test that kills, stops or changes members."""
    yield from _running_set(str(tmp_path))


@pytest.fixture(scope="module")
def ms_shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterSetProcs]:
    """One master set for the tests that only read it (no kill, stop, write or change)."""
    yield from _running_set(str(tmp_path_factory.mktemp("ms-shared")))


def test_kill_the_leader_under_load(ms: MasterSetProcs) -> None:
    kills = int(os.environ.get("SQUALL_HA_KILLS", "3"))  # `make soak`: 50
    ledger = Ledger(ms)
    ledger.start()
    for _ in range(kills):
        before = ledger.acked()
        wait_for(lambda b=before: ledger.acked() >= b + 30, 60, what="acknowledged puts")
        old = ms.wait_leader(60)
        ms.kill(old)
        new = ms.wait_leader(60, not_=old)
        assert new != old
        ms.start(old)  # it comes back as a standby and catches up
        wait_for(lambda o=old: (ms.info(o) or {}).get("role") == "standby", 60,
                 what="the old leader back as a standby")
    ledger.finish()
    assert ledger.acked() > 30 * kills
    leader = ms.wait_leader(60)
    assert stats_total(ms.urls[leader], "ha#q") == 0
    epochs = [int((ms.info(i) or {}).get("epoch", 0)) for i in range(3)]
    assert max(epochs) >= 1 + kills  # bootstrap + a failover per kill


def refused(req: urllib.request.Request) -> tuple[int, dict[str, str], bytes]:
    """The error answer to `req` (status, headers, body), its connection closed."""
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            raise AssertionError(f"answered {r.status}")
    except urllib.error.HTTPError as e:
        with e:
            return e.code, dict(e.headers), e.read()


def test_a_stopped_leader_acknowledges_nothing_after_it_resumes(ms: MasterSetProcs) -> None:
    lead = ms.wait_leader(60)
    with Client(ms.urls[lead], retries=0, timeout=5.0) as c:
        c.put("ha#s", None, pid="before")
    ms.kill(lead, signal.SIGSTOP)
    try:
        new = ms.wait_leader(60, not_=lead)
        with Client(ms.urls[new], retries=0, timeout=5.0) as c:
            c.put("ha#s", None, pid="new-leader")
        # a request to the stopped leader waits in its socket; it is served on SIGCONT
        import threading

        outcome: list[object] = []

        def late_put() -> None:
            try:
                with Client(ms.urls[lead], retries=0, timeout=30.0) as c:
                    outcome.append(c.put("ha#s", None, pid="late"))
            except SquallError as e:
                outcome.append(e)

        t = threading.Thread(target=late_put)
        t.start()
        wait_for(lambda: unread_request_at(ms.ports[lead]), 30,
                 what="the request waiting in the stopped process's socket")
    finally:
        ms.kill(lead, signal.SIGCONT)
    t.join(60)
    assert outcome and isinstance(outcome[0], SquallError), outcome
    wait_for(lambda: (ms.info(lead) or {}).get("role") == "standby", 60,
             what="the resumed leader stepping down")
    new = ms.wait_leader(60)
    with Client(ms.urls[new], retries=0, timeout=5.0) as c:
        pids = {t.pid for t in c.lease("ha#s", max_tasks=10)}
    assert pids == {"before", "new-leader"}


def test_a_wiped_standby_is_unformatted_until_re_added(ms: MasterSetProcs) -> None:
    lead = ms.wait_leader(60)
    wiped = (lead + 1) % 3
    other = (lead + 2) % 3
    with Client(ms.urls[lead], retries=0, timeout=5.0) as c:
        for i in range(20):
            c.put("ha#w", None, pid=f"w{i}")
    ms.kill(wiped)
    ms.wipe(wiped)
    ms.start(wiped)

    def members() -> dict[str, object]:
        req = urllib.request.Request(f"{ms.urls[lead]}/v1/master/members", headers=ADMIN)
        with urllib.request.urlopen(req, timeout=5) as r:
            out: dict[str, object] = json.load(r)
            return out

    wait_for(lambda: "unformatted" in str(members()["log"]), 60,
             what="the wiped member reported unformatted")
    # it does not count: with the third member down, no majority is left
    req = urllib.request.Request(
        f"{ms.urls[lead]}/v1/master/members", method="POST",
        data=json.dumps({"action": "add", "member": ms.urls[wiped]}).encode(),
        headers={**ADMIN, "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
    wait_for(lambda: members()["log"]["members"][ms.urls[wiped]]["in_sync"],  # type: ignore[index]
             60, what="the re-added member in sync")
    # re-added, it was joining (promising no epoch) until caught up; now it counts
    with open(os.path.join(ms.data_dir(wiped), "journal.json")) as f:
        assert json.load(f)["joining"] is None
    with Client(ms.urls[lead], retries=0, timeout=5.0) as c:
        c.put("ha#w", None, pid="after")
    # the re-added member now holds the log: lose another one, nothing is lost
    ms.kill(other)
    new = ms.wait_leader(90)
    assert stats_total(ms.urls[new], "ha#w") == 21
    assert os.path.exists(os.path.join(ms.data_dir(wiped), "journal.json"))


def test_a_leader_cut_off_the_elector_steps_down(ms: MasterSetProcs) -> None:
    """A partition between the leader and the elector only (its journals stay reachable):
    its lease runs out, another member leads with a higher epoch, and the old leader
    acknowledges nothing more. (A partition from the journals only is the in-process RPC
    fault tests' case: tests/test_ha_quorum.py.)"""
    from squall.master.ha.elector import FileLeaseElector

    ledger = Ledger(ms)
    ledger.start()
    wait_for(lambda: ledger.acked() >= 30, 60, what="acknowledged puts")
    lead = ms.wait_leader(60)
    epoch = int((ms.info(lead) or {})["epoch"])
    cut = FileLeaseElector(ms.lease).cut_path(ms.urls[lead])
    open(cut, "w").close()
    try:
        new = ms.wait_leader(60, not_=lead)
        assert int((ms.info(new) or {})["epoch"]) > epoch
        wait_for(lambda: (ms.info(lead) or {}).get("role") != "leader", 30,
                 what="the cut-off leader stepping down")
        code, headers, _ = refused(urllib.request.Request(
            f"{ms.urls[lead]}/v1/groups/ha/queues/q/tasks", method="POST",
            data=json.dumps({"tasks": [{"pid": "to-the-old-leader"}]}).encode(),
            headers={**ADMIN, "Content-Type": "application/json"}))
        assert code == 503 and headers["x-squall-leader"] == ms.urls[new]
    finally:
        os.unlink(cut)
    before = ledger.acked()
    wait_for(lambda: ledger.acked() >= before + 30, 60, what="puts after the partition")
    ledger.finish()


def test_step_down_and_membership_changes(ms: MasterSetProcs) -> None:
    """`squall master step-down` hands the leadership over; a member removed and added
    back is logged, caught up and counted again."""
    lead = ms.wait_leader(60)

    def call(i: int, method: str, path: str, body: object = None) -> dict[str, object]:
        req = urllib.request.Request(
            f"{ms.urls[i]}{path}", method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={**ADMIN, **({"Content-Type": "application/json"} if body else {})})
        with urllib.request.urlopen(req, timeout=150) as r:
            out: dict[str, object] = json.load(r)
            return out

    assert call(lead, "POST", "/v1/master/step-down")["role"] == "standby"
    new = ms.wait_leader(60, not_=lead)
    other = next(i for i in range(3) if i not in (lead, new))
    out = call(new, "POST", "/v1/master/members", {"action": "remove",
                                                    "member": ms.urls[other]})
    assert out["members"] == [u for u in ms.urls if u != ms.urls[other]]
    with Client(ms.urls[new], retries=0, timeout=5.0) as c:
        c.put("ha#m", None, pid="two-members")
    out = call(new, "POST", "/v1/master/members", {"action": "add",
                                                    "member": ms.urls[other]})
    assert sorted(out["members"]) == sorted(ms.urls)  # type: ignore[arg-type]
    view = call(new, "GET", "/v1/master/members")
    assert view["log"]["members"][ms.urls[other]]["in_sync"]  # type: ignore[index]
    # the standbys learned the set from the log
    wait_for(lambda: (ms.info(other) or {}).get("role") == "standby", 30, what="standby")
    code, _, body = refused(urllib.request.Request(
        f"{ms.urls[new]}/v1/master/members", method="POST",
        data=json.dumps({"action": "remove", "member": "ftp://x"}).encode(),
        headers={**ADMIN, "Content-Type": "application/json"}))
    assert code == 400, body


def test_failover_with_the_etcd_elector(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The same set elected through a real etcd (skipped without the etcd binary): kill -9
    of the leader under load, another member leads with a higher epoch, the ledger holds."""
    import shutil

    if shutil.which("etcd") is None:
        pytest.skip("no etcd binary (Debian: apt-get install etcd-server, or `make etcd`)")
    from tests.test_elector_etcd import Etcd

    (tmp_path / "etcd").mkdir()
    etcd = Etcd(tmp_path / "etcd" / "data").start()
    ms = MasterSetProcs(str(tmp_path), 3, lease_secs=2.0,
                        elector=f"etcd:{etcd.url}/squall/test-set?ttl=2")
    ms.start_all()
    try:
        old = ms.wait_leader(90)
        assert (ms.info(old) or {})["elector"] == "etcd"
        ledger = Ledger(ms)
        ledger.start()
        wait_for(lambda: ledger.acked() >= 30, 60, what="acknowledged puts")
        epoch = int((ms.info(old) or {})["epoch"])
        ms.kill(old)
        new = ms.wait_leader(60, not_=old)
        assert int((ms.info(new) or {})["epoch"]) > epoch
        before = ledger.acked()
        wait_for(lambda: ledger.acked() >= before + 30, 60, what="puts after the kill")
        ledger.finish()
    finally:
        ms.stop()
        etcd.kill9()


def _beat(url: str, node_id: str = "fake-dn", body: str | None = None) -> dict[str, object]:
    """One heartbeat of a data node that holds nothing, signed with the cluster key."""
    from squall.common.security import tokens
    from tests.ha_kit import CLUSTER_KEY

    token = tokens.sign(CLUSTER_KEY.encode(), "heartbeat", [node_id], time.time() + 60)
    body = body or json.dumps({"node_id": node_id, "address": "http://127.0.0.1:9",
                               "started_at": 1.0, "seq": 0, "capacity_bytes": 1,
                               "used_bytes": 0, "free_bytes": 1, "blob_count": 0,
                               "full": True})
    req = urllib.request.Request(f"{url}/v1/nodes/heartbeat", body.encode(),
                                 headers={"Authorization": f"Bearer {token}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        out: dict[str, object] = json.loads(r.read())
    return out


def test_heartbeat_answers_carry_the_leaders_epoch(ms: MasterSetProcs) -> None:
    """A data node learns the epoch from every heartbeat answer (it runs no delete command
    from a lower one); after a failover the new leader's answers carry a higher epoch."""
    old = ms.wait_leader(60)
    e1 = int((ms.info(old) or {})["epoch"])
    assert e1 >= 1 and _beat(ms.urls[old])["epoch"] == e1
    ms.kill(old)
    new = ms.wait_leader(60, not_=old)
    e2 = int((ms.info(new) or {})["epoch"])
    assert e2 > e1
    assert wait_for(lambda: _beat(ms.urls[new]).get("epoch"), 60,
                    what="a heartbeat answer from the new leader") == e2


def test_a_leader_confirms_its_epoch_before_it_hands_out_deletes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A blob no task references is deleted through a heartbeat answer only after the
    leader confirmed its epoch at a majority of journals: the answer names that epoch."""
    m = MasterSetProcs(str(tmp_path), 3, lease_secs=2.0, extra=["--orphan-grace-s", "1"])
    m.start_all()
    try:
        lead = m.wait_leader(90)
        epoch = int((m.info(lead) or {})["epoch"])

        def deleted() -> dict[str, object] | None:
            body = json.dumps({"node_id": "fake-dn", "address": "http://127.0.0.1:9",
                               "started_at": 1.0, "seq": 0, "capacity_bytes": 1 << 20,
                               "used_bytes": 3, "free_bytes": 1 << 20, "blob_count": 1,
                               "full": True, "blob_ids": ["orphan-1"], "blob_sizes": [3]})
            a = _beat(m.urls[lead], body=body)
            cmds = a.get("commands") or []
            assert isinstance(cmds, list)
            return a if any(c.get("op") == "delete" for c in cmds) else None

        a = wait_for(deleted, 60, interval=0.3, what="a delete command for the orphan")
        assert a["epoch"] == epoch
        assert (m.info(lead) or {}).get("role") == "leader"
    finally:
        m.stop()


def _post(url: str, path: str, body: dict[str, object], auth: str) -> dict[str, object]:
    req = urllib.request.Request(f"{url}{path}", json.dumps(body).encode(),
                                 headers={"Authorization": auth,
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=20) as r:
        out: dict[str, object] = json.loads(r.read())
    return out


def test_sqs_keys_survive_a_failover(ms: MasterSetProcs) -> None:
    """SQS access keys are logged: after the leader is killed, the new leader answers a
    data node's lookup of a minted and of an imported key with the same signing key."""
    from squall.common.security import tokens
    from squall.master.sqskeys import signing_key
    from tests.ha_kit import CLUSTER_KEY

    old = ms.wait_leader(60)
    minted = _post(ms.urls[old], "/v1/auth/sqs-keys", {"roles": ["producer"]},
                   ADMIN["Authorization"])
    imported = _post(ms.urls[old], "/v1/auth/sqs-keys",
                     {"roles": ["admin"], "access_key_id": "FOOBARKEY",
                      "secret_access_key": "FOOBARSECRET"}, ADMIN["Authorization"])
    ms.kill(old)
    new = ms.wait_leader(60, not_=old)
    node = "Bearer " + tokens.sign(CLUSTER_KEY.encode(), "heartbeat", ["dn-1"],
                                   time.time() + 60)
    for k in (minted, imported):
        got = wait_for(lambda k=k: _post(ms.urls[new], "/v1/nodes/sqs-key", {
            "node_id": "dn-1", "access_key_id": k["access_key_id"], "date": "20260101",
            "region": "us-east-1"}, node), 60, what="the new leader's lookup")
        assert got["signing_key"] == signing_key(str(k["secret_access_key"]), "20260101",
                                                 "us-east-1").hex()
        assert got["principal"]["id"] == k["id"]  # type: ignore[index]


def test_revocations_survive_a_failover(ms: MasterSetProcs) -> None:
    """A credential revoked on the leader stays revoked on the next one (revocations are
    logged), and the new leader's heartbeat answers tell the data nodes."""
    def cluster_status(url: str, cred: str) -> int:
        req = urllib.request.Request(f"{url}/v1/cluster",
                                     headers={"Authorization": f"Bearer {cred}"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            with e:
                return int(e.code)

    old = ms.wait_leader(60)
    minted = _post(ms.urls[old], "/v1/auth/credentials", {"roles": ["monitor"]},
                   ADMIN["Authorization"])
    cred, cid = str(minted["credential"]), str(minted["id"])
    assert cluster_status(ms.urls[old], cred) == 200
    req = urllib.request.Request(f"{ms.urls[old]}/v1/auth/credentials/{cid}",
                                 method="DELETE", headers=ADMIN)
    with urllib.request.urlopen(req, timeout=20) as r:
        assert r.status == 200
    assert cluster_status(ms.urls[old], cred) == 401
    ms.kill(old)
    new = ms.wait_leader(60, not_=old)
    assert wait_for(lambda: cluster_status(ms.urls[new], cred) in (401, 403), 60,
                    what="the new leader refusing the revoked credential")
    revoked = wait_for(lambda: _beat(ms.urls[new]), 60, what="a beat")["revoked"]
    assert isinstance(revoked, list) and cid in revoked


# the tests that only read a master set share one (ms_shared), started here at the end
# of the module so that it does not run beside the other tests' sets
def test_standby_answers_503_naming_the_leader(ms_shared: MasterSetProcs) -> None:
    ms = ms_shared
    lead = ms.wait_leader(60)
    standby = (lead + 1) % 3
    code, headers, raw = refused(urllib.request.Request(f"{ms.urls[standby]}/v1/cluster",
                                                        headers=ADMIN))
    assert code == 503
    assert headers["x-squall-leader"] == ms.urls[lead]
    body = json.loads(raw)
    assert body["leader"] == ms.urls[lead] and body["detail"].startswith("standby of ")
    info = ms.info(standby)
    assert info is not None and info["role"] == "standby" and info["leader"] == ms.urls[lead]
    assert info["elector"] == "file" and info["me"] == ms.urls[standby]
    # `squall master members list` on a standby answers from the leader it names
    squall = os.path.join(os.path.dirname(sys.executable), "squall")
    out = subprocess.run([squall, "master", "members", "list", "--master",
                          ms.urls[standby]], capture_output=True,
                         timeout=60, env={**os.environ, "SQUALL_TOKEN": ADMIN_TOKEN})
    assert out.returncode == 0, out.stderr
    view = json.loads(out.stdout)
    assert view["role"] == "leader" and view["me"] == ms.urls[lead]
    assert view["members"] == ms.urls and view["elector"] == "file"
    assert {m["in_sync"] for m in view["log"]["members"].values()} == {True}
    # the dashboard's overview shows the set
    req = urllib.request.Request(f"{ms.urls[lead]}/v1/overview", headers=ADMIN)
    with urllib.request.urlopen(req, timeout=10) as r:
        over = json.load(r)["master_set"]
    assert over["leader"] == ms.urls[lead] and over["elector"] == "file"
    assert [m["url"] for m in over["members"]] == ms.urls
    # journal calls need a member token: no credential, an admin credential -> refused
    for headers in ({}, ADMIN):
        req = urllib.request.Request(f"{ms.urls[lead]}/v1/journal/state", data=b"\x80",
                                     headers={**headers,
                                              "Content-Type": "application/x-msgpack"})
        assert refused(req)[0] in (401, 403)


def test_status_shows_the_master_set(ms_shared: MasterSetProcs) -> None:
    """`squall status` asked of a standby: the leader's view of the set (members, leader,
    epoch, each standby's lag, the elector), as a table and as JSON."""
    ms = ms_shared
    from typer.testing import CliRunner

    from squall.client.cli import app

    lead = ms.wait_leader(60)
    standby = (lead + 1) % 3
    runner = CliRunner()

    def status(*args: str) -> str:
        r = runner.invoke(app, ["status", *args, "--master", ms.urls[standby]])
        assert r.exit_code == 0, (r.output, r.exception)
        return r.output

    def in_sync() -> bool:
        s = json.loads(status("--json"))["master_set"]
        return all(m["in_sync"] for m in s["members"])

    wait_for(in_sync, 60, what="every member in sync")
    s = json.loads(status("--json"))["master_set"]
    assert s["leader"] == ms.urls[lead] and s["me"] == ms.urls[lead]
    assert s["epoch"] >= 1 and s["elector"] == "file"
    assert sorted(m["url"] for m in s["members"]) == sorted(ms.urls)
    assert [m["url"] for m in s["members"] if m["leader"]] == [ms.urls[lead]]
    assert all(m["lag"] == 0 for m in s["members"] if not m["leader"])
    text = status()
    assert f"leader {ms.urls[lead]}, epoch {s['epoch']}" in text
    assert "elector file" in text and text.count("standby") == 2
    assert "0 records" in text
