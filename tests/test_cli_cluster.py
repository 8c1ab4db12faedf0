"""The CLI against a real master and data node.

It prints server data as data: Rich markup in payloads, pids, worker
names, error texts and node ids prints as itself, terminal control characters are escaped,
and ``lease --done`` prints before it dequeues, so a rendering failure can never lose a
task; every verb that shows server data is run. And the newcomer's verbs and messages:
--version, tasks, ack, policy, schedule, empty piped stdin, a data node's URL,
node ids and URLs kept whole at 80 columns."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from squall.client import Client
from squall.client.cli import app
from squall.client.cli import common as _cli_common
from squall.client.cli.common import clean
from tests.helpers import DataNodeProcess, MasterProcess, wait_for

runner = CliRunner()
ENV = {"SQUALL_CLUSTER_KEY": "test-cluster-key-0123456789abcdef"}
CLEAR = "\x1b[2J"
NASTY = f"<s>[INST] x [/INST] [/] [bold red]boom[/] :smile: {CLEAR}\x07\u202eevil\x9b"
NODE_ID = f"[/]node{CLEAR}"


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("clisafe")
    m = MasterProcess(str(tmp / "master"), env=ENV, extra=[
        "--replication-factor", "1", "--heartbeat-interval-s", "0.2"]).start()
    dn = DataNodeProcess(str(tmp / "dn"), env=ENV, extra=[
        "--master", m.url, "--heartbeat-interval-s", "0.2", "--node-id", NODE_ID]).start()
    try:
        with Client(m.url) as c:
            wait_for(lambda: any(n.state == "alive" for n in c.cluster().nodes),
                     what="the data node alive")
        yield m.url
    finally:
        dn.stop()
        m.stop()


def sq(master: str, *args: str, code: int = 0, input: str | None = None) -> str:
    r = runner.invoke(app, [*args, "--master", master], input=input)
    assert r.exit_code == code, (args, r.output, r.exception)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    assert "\x1b" not in r.output and "\x07" not in r.output and "\x9b" not in r.output, \
        (args, r.output)
    assert "\u202e" not in r.output, (args, r.output)
    return r.output


def shown(output: str) -> str:
    """The output with Rich's soft line breaks undone (long cells fold)."""
    return output.replace("\n", "").replace(" ", "")


def test_clean_escapes_controls_like_repr() -> None:
    assert clean("a\x1b[2Jb\n\t\r\x00\x7f\x85\u202e\u2066é[/]") == \
        "a\\x1b[2Jb\\n\\t\\r\\x00\\x7f\\x85\\u202e\\u2066é[/]"


def test_status_of_a_single_master(master: str) -> None:
    out = sq(master, "status")
    assert "a single master" in out and "master set" not in out
    assert "1 (1 alive)" in out
    s = json.loads(sq(master, "status", "--json"))
    assert s["master_set"] is None and s["cluster"]["nodes"][0]["health"] == "alive"


def test_payload_markup_and_escapes_through_lease_done(master: str) -> None:
    assert "safe#llm" in sq(master, "put", "safe#llm", NASTY, "--pid", "p1")
    out = sq(master, "lease", "safe#llm", "--payload", "--done")
    flat = shown(out)
    for part in ("<s>[INST]x[/INST]", "[/]", "[boldred]boom[/]", ":smile:", "\\x1b[2J",
                 "\\x07", "\\u202eevil", "\\x9b"):
        assert part in flat, (part, out)
    assert "dequeued 1 task(s)" in out
    sq(master, "task", "safe#llm", "p1", code=1)  # gone: it was shown, then dequeued
    rows = json.loads(sq(master, "put", "safe#llm", NASTY, "--pid", "p2") and
                      sq(master, "lease", "safe#llm", "--payload", "--json", "--done"))
    assert rows[0]["payload"] == NASTY  # JSON escapes control characters itself


def test_a_rendering_failure_never_follows_the_dequeue(master: str, monkeypatch) -> None:
    sq(master, "put", "safe#fragile", "x", "--pid", "keep")

    def broken(*a: object, **k: object) -> None:
        raise RuntimeError("terminal went away")

    monkeypatch.setattr(_cli_common.out, "print", broken)
    r = runner.invoke(app, ["lease", "safe#fragile", "--done", "--payload", "--master",
                            master])
    assert r.exit_code != 0
    monkeypatch.undo()
    # not dequeued: still there, leased (its lease will expire and it comes back)
    assert json.loads(sq(master, "task", "safe#fragile", "keep", "--json"))["state"] == "leased"


def test_pids_workers_and_errors_through_every_verb(master: str) -> None:
    pid = f"[/]{CLEAR}pid[INST]"
    assert "[/]\\x1b[2Jpid[INST]" in sq(master, "put", "safe#w", "payload", "--pid", pid)
    sq(master, "put", "safe#w", "other", "--pid", "zz-other")
    with Client(master, worker=f"[/] pwned {CLEAR}") as c:
        [t] = c.lease("safe#w", lease_secs=300)
        assert t.pid == pid
        tok = t.token
    for args in (["stats", "safe#w"], ["task", "safe#w", pid], ["tasks", "safe#w"],
                 ["stats"], ["queues"]):
        out = shown(sq(master, *args))
        assert "\\x1b[2J" in out or (args[0] in ("stats", "queues") and len(args) == 1), \
            (args, out)
    assert "[/]pwned\\x1b[2J" in shown(sq(master, "stats", "safe#w"))
    assert "[/]pwned\\x1b[2J" in shown(sq(master, "task", "safe#w", pid))
    # a release with a nasty error, through the CLI, ends in the dead letters
    sq(master, "policy", "set", "safe#w", "--max-attempts", "1")
    assert "released" in sq(master, "release", "safe#w", pid, "--token", str(tok),
                            "--error", f"[/] bad {CLEAR}")
    out = shown(sq(master, "dead-letters", "safe#w"))
    assert "[/]bad\\x1b[2J" in out and "\\x1b[2Jpid[INST]" in out
    assert "moved 1" in sq(master, "redrive", "safe#w")
    assert "cancelled" in sq(master, "cancel", "safe#w", pid)
    # error messages quote user input as data too
    out = sq(master, "cancel", "safe#w", pid, code=1)
    assert "[/]" in out and "\\x1b[2J" in out
    out = sq(master, "lease", f"safe#[/]{CLEAR}", code=2)
    assert "[/]\\x1b[2J" in out


def test_node_ids_are_data(master: str) -> None:
    out = shown(sq(master, "nodes"))
    assert "[/]node\\x1b[2J" in out


def test_version_and_empty_stdin(master: str) -> None:
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output.startswith("squall ")
    out = sq(master, "put", "new#q", input="", code=2)
    assert "stdin holds no lines: nothing to enqueue" in out
    assert "no queues match" in sq(master, "queues", "new#q")


def test_tasks_ack_policy_schedule(master: str) -> None:
    sq(master, "put", "new#t", "--count", "3")
    rows = json.loads(sq(master, "lease", "new#t", "--json"))
    out = sq(master, "tasks", "new#t")
    assert out.count("available") == 2 and "leased" in out
    assert len(json.loads(sq(master, "tasks", "new#t", "--json", "--limit", "2"))) == 2
    assert "dequeued new#t" in sq(master, "ack", "new#t", rows[0]["pid"], "--token",
                                  str(rows[0]["token"]))
    assert "does not exist" in sq(master, "ack", "new#t", rows[0]["pid"], "--token",
                                  str(rows[0]["token"]), code=1)  # already dequeued
    assert json.loads(sq(master, "stats", "new#t", "--json"))["completed"] == 1
    out = sq(master, "policy", "set", "new#t", "--max-attempts", "4", "--backoff-base", "2")
    assert "4" in out and "2.0s x2.0" in out
    assert json.loads(sq(master, "policy", "show", "new#t", "--json"))["max_attempts"] == 4
    sq(master, "policy", "set", "new#", "--lease-secs", "30")
    assert json.loads(sq(master, "policy", "show", "new#other", "--json"))["lease_secs"] == 30
    assert "cleared" in sq(master, "policy", "clear", "new#t")
    assert json.loads(sq(master, "policy", "show", "new#t", "--json"))["max_attempts"] is None
    assert "next slot" in sq(master, "schedule", "set", "new#hourly", "--queue", "t",
                             "--every", "3600")
    sq(master, "schedule", "set", "new#bad", "--queue", "t", code=2)
    out = sq(master, "schedule", "list", "new")
    assert "hourly" in out and "3600.0s" in out
    assert "deleted schedule" in sq(master, "schedule", "delete", "new#hourly")
    assert "no schedules" in sq(master, "schedule", "list", "new")


def test_a_data_node_url_and_wide_tables(master: str) -> None:
    with Client(master) as c:
        node = c.cluster().nodes[0]
    out = sq(node.address, "queues", code=1)
    assert "is a squall data node" in out and "not a master" in out
    out = sq(master, "nodes")  # 80 columns: ids and URLs are never broken across lines
    assert any(node.address in line for line in out.splitlines()), out
    assert any("[/]node\\x1b[2J" in line for line in out.splitlines()), out
