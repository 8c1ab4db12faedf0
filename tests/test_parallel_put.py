"""The parallel put under kill -9 (real processes on 127.0.0.1): a front door sends the
enqueue to the master (logged *pending*, never leased) while it stores the payloads, and
confirms the tasks in its next commit (master/tasks/pending.py, datanode/frontdoor.py).

- the front-door node killed after the pending enqueue, before storing anything: the task
  is never leased, and the master's housekeeping removes it (it was never acknowledged);
  the same pid is then enqueued afresh;
- the front-door node killed once the payload is durable, before answering and confirming:
  a resend is refused (503) while the task is pending, and the master confirms it from the
  surviving holder's reports;
- the master killed while acknowledged puts wait for their confirmation (a node that never
  confirms): after the restart, housekeeping confirms every one of them;
- the replicas killed: the payload misses its write quorum, the node withdraws the pending
  enqueue before answering 503 (refused means not applied).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import msgpack

from squall.client import Client
from squall.client.cli.dev import DevCluster
from tests.dn_kit import ENV as CLUSTER_ENV
from tests.helpers import ADMIN, free_port, start_cluster, wait_for

ENV = {"SQUALL_PENDING_DEADLINE_S": "1", "SQUALL_FRONT_DOOR_PARALLEL": "1"}
SLOW = {**ENV, "SQUALL_PENDING_DEADLINE_S": "5"}  # time to look at a pending task


def _post(url: str, queue: str, tasks: list[dict[str, object]]) -> httpx.Response:
    return httpx.post(f"{url}/v1/groups/pp/queues/{queue}/tasks", timeout=30,
                      content=msgpack.packb({"tasks": tasks}),
                      headers={"Content-Type": "application/msgpack", **ADMIN})


def _armed(cl: DevCluster, i: int, **env: str) -> None:
    """Restart data node `i` with `env` (a crash hook) and wait until it is back."""
    cl.kill_node(i)
    saved = cl.env
    cl.env = {**cl.env, **env}
    try:
        cl.start_node(i)
    finally:
        cl.env = saved
    cl.wait_ready(cl.node_url(i), cl.node_procs[i], f"node-{i}", 60)
    cl.wait_alive(3)


def _counts(c: Client, queue: str) -> tuple[int, int, int]:
    s = c.stats(f"pp#{queue}")
    return s.pending, s.available, s.total


def test_payload_never_stored_is_never_leased_and_removed(tmp_path: Path) -> None:
    cl = start_cluster(tmp_path / "cl", 3, extra_env=SLOW)
    try:
        _armed(cl, 1, SQUALL_TEST_CRASH="pending_first")
        data = os.urandom(2000)
        try:
            r = _post(cl.node_url(1), "gone", [{"pid": "p1", "payload": data}])
            raise AssertionError(f"node 1 answered {r.status_code}: {r.text}")
        except httpx.TransportError:
            pass  # it died after the pending enqueue, before storing the payload
        wait_for(lambda: cl.node_procs[1].poll() is not None, 10, what="node 1 died")
        with Client(cl.master_url, token=cl.admin) as c:
            assert _counts(c, "gone") == (1, 0, 1)  # logged pending: never ready
            assert c.lease("pp#gone", 10, 60) == []  # waits for it a moment, then nothing
            # a resend of the same pid is refused while the task is pending
            r = _post(cl.node_url(2), "gone", [{"pid": "p1", "payload": data}])
            assert r.status_code == 503 and "not confirmed" in r.text, r.text
            # node 1 is declared dead and node 2/3 report no copy: removed
            wait_for(lambda: _counts(c, "gone") == (0, 0, 0), 60,
                     what="the unconfirmed task removed")
            r = _post(cl.node_url(2), "gone", [{"pid": "p1", "payload": data}])
            assert r.status_code == 200 and not r.json()["enqueued"][0]["collapsed"], r.text
            [t] = c.lease("pp#gone", 10, 60, payloads=True)
            assert t.pid == "p1" and t.attempts == 1 and t.payload() == data
            c.done(t)
    finally:
        cl.stop()


def test_node_killed_before_confirming_is_settled_from_the_holders(tmp_path: Path) -> None:
    cl = start_cluster(tmp_path / "cl", 3, extra_env=SLOW)
    try:
        _armed(cl, 1, SQUALL_TEST_CRASH="before_confirm")
        data = os.urandom(3000)
        try:
            r = _post(cl.node_url(1), "kept", [{"pid": "k1", "payload": data,
                                                "idempotency_key": "key-k1"}])
            raise AssertionError(f"node 1 answered {r.status_code}: {r.text}")
        except httpx.TransportError:
            pass  # pending and stored on the quorum; died before answering and confirming
        wait_for(lambda: cl.node_procs[1].poll() is not None, 10, what="node 1 died")
        with Client(cl.master_url, token=cl.admin) as c:
            pending, available, total = _counts(c, "kept")
            assert total == 1 and available + pending == 1
            if pending:  # the key is held too: refused, not answered as collapsed
                r = _post(cl.node_url(2), "kept", [{"pid": "other", "payload": data,
                                                    "idempotency_key": "key-k1"}])
                assert r.status_code == 503, r.text
            wait_for(lambda: _counts(c, "kept") == (0, 1, 1), 60,
                     what="the pending task confirmed from the live holder")
            r = _post(cl.node_url(2), "kept", [{"pid": "k1", "payload": data}])
            assert r.status_code == 200 and r.json()["enqueued"][0]["collapsed"], r.text
            [t] = c.lease("pp#kept", 10, 60, payloads=True)
            assert t.pid == "k1" and t.payload() == data
            c.done(t)
    finally:
        cl.stop()


def _restart_master(cl: DevCluster) -> None:
    cl.kill_master(0)  # kill -9
    cl.start_master(0)
    cl.wait_ready(cl.master_url, cl.master_procs[0], "master", 60)


def test_master_killed_before_the_confirmations(tmp_path: Path) -> None:
    cl = start_cluster(tmp_path / "cl", 3, extra_env=ENV)
    try:
        _armed(cl, 1, SQUALL_TEST_NO_CONFIRM="1")
        sent = {f"m{i:02d}": os.urandom(500 + i) for i in range(20)}
        for pid, data in sent.items():  # acknowledged: pending durable, payload on quorum
            r = _post(cl.node_url(1), "acked", [{"pid": pid, "payload": data}])
            assert r.status_code == 200, r.text
        _restart_master(cl)  # kill -9: nothing confirmed them
        cl.wait_alive(3)
        with Client(cl.master_url, token=cl.admin) as c:
            assert _counts(c, "acked")[2] == 20
            wait_for(lambda: _counts(c, "acked") == (0, 20, 20), 60,
                     what="every acknowledged put confirmed after the restart")
            tasks = c.lease("pp#acked", 100, 60, payloads=True)
            assert {t.pid: t.payload() for t in tasks} == sent
            c.done(tasks)
    finally:
        cl.stop()


def test_replicas_killed_the_put_is_refused_and_withdrawn(tmp_path: Path) -> None:
    cl = start_cluster(tmp_path / "cl", 3, extra_env=ENV)
    try:
        r = _post(cl.node_url(1), "quorum", [{"pid": "warm", "payload": b"w"}])
        assert r.status_code == 200, r.text  # node 1 holds a block with a peer
        cl.kill_node(2)
        cl.kill_node(3)
        r = _post(cl.node_url(1), "quorum", [{"pid": "q1", "payload": os.urandom(100)},
                                             {"pid": "q2", "payload": os.urandom(100)}])
        assert r.status_code == 503, r.text
        with Client(cl.master_url, token=cl.admin) as c:
            # refused means not applied: withdrawn before the answer
            wait_for(lambda: _counts(c, "quorum") == (0, 1, 1), 30, what="warm confirmed")
            with httpx.Client(timeout=10) as h:
                for pid in ("q1", "q2"):
                    got = h.get(f"{cl.master_url}/v1/groups/pp/queues/quorum/tasks/{pid}",
                                headers=ADMIN)
                    assert got.status_code == 404, got.text
    finally:
        cl.stop()


def test_auto_takes_the_parallel_put_for_a_lone_put_and_the_default_does_not(
        tmp_path: Path) -> None:
    """SQUALL_FRONT_DOOR_PARALLEL unset: a put's task is available once the put is
    answered. `auto`: a put alone on its node is logged pending while its payload is stored
    (here its node never confirms, so it stays pending until the master's housekeeping
    confirms it from the holders' reports)."""
    cl = start_cluster(tmp_path / "cl", 3, extra_env={"SQUALL_PENDING_DEADLINE_S": "3"})
    try:
        data = os.urandom(2000)
        with Client(cl.master_url, token=cl.admin) as c:
            r = _post(cl.node_url(1), "plain", [{"pid": "d1", "payload": data}])
            assert r.status_code == 200, r.text
            assert _counts(c, "plain") == (0, 1, 1)
            _armed(cl, 1, SQUALL_FRONT_DOOR_PARALLEL="auto", SQUALL_TEST_NO_CONFIRM="1")
            r = _post(cl.node_url(1), "auto", [{"pid": "a1", "payload": data}])
            assert r.status_code == 200, r.text
            assert _counts(c, "auto") == (1, 0, 1)
            wait_for(lambda: _counts(c, "auto") == (0, 1, 1), 60,
                     what="the lone put's task confirmed by housekeeping")
            [t] = c.lease("pp#auto", 10, 60, payloads=True)
            assert t.pid == "a1" and t.payload() == data
            c.done(t)
    finally:
        cl.stop()


def test_an_unknown_parallel_mode_is_refused_at_start(tmp_path: Path) -> None:
    env = {**os.environ, **CLUSTER_ENV, "SQUALL_FRONT_DOOR_PARALLEL": "yes"}
    p = subprocess.run([sys.executable, "-m", "squall.datanode", "--data-dir",
                        str(tmp_path / "node"), "--port", str(free_port())],
                       capture_output=True, timeout=60, env=env)
    out = (p.stdout + p.stderr).decode(errors="replace")
    assert p.returncode != 0 and "Traceback" not in out, out
    assert "SQUALL_FRONT_DOOR_PARALLEL='yes': use auto, 1 (on) or 0 (off)" in out, out
