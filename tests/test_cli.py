"""The `squall` user verbs through typer's CliRunner against a real master process, and the
one-line messages for a master that is not running, a wrong URL and a bad queue name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.responses import Response
from typer.testing import CliRunner

from squall.client import Client
from squall.client.cli import app
from tests.helpers import MasterProcess, free_port, running_app

runner = CliRunner()


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    m = MasterProcess(str(tmp_path_factory.mktemp("cli") / "master")).start()
    try:
        yield m.url
    finally:
        m.stop()


def sq(master: str, *args: str, input: str | None = None, code: int = 0) -> str:
    r = runner.invoke(app, [*args, "--master", master], input=input)
    assert r.exit_code == code, (r.output, r.exception)
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r.output


def test_put_lease_task(master: str) -> None:
    # "!" sorts before the digits of FIFO pids: this task is served first
    assert sq(master, "put", "cli#a", "--count", "1", "--pid", "!first").strip() == \
        "cli#a !first"
    assert "collapsed" in sq(master, "put", "cli#a", "--count", "1", "--pid", "!first")
    assert "enqueued 250 task(s) into cli#a" in sq(master, "put", "cli#a", "--count", "250",
                                                   "--batch", "60")
    rows = json.loads(sq(master, "lease", "cli#a", "-n", "2", "--lease-secs", "30", "--json"))
    assert [r["attempts"] for r in rows] == [1, 1] and rows[0]["queue"] == "cli#a"
    assert rows[0]["pid"] == "!first"
    out = sq(master, "task", "cli#a", rows[0]["pid"])
    assert "leased" in out and "attempts" in out
    info = json.loads(sq(master, "task", "cli#a", rows[0]["pid"], "--json"))
    assert info["state"] == "leased"
    assert "reset 2 lease(s)" in sq(master, "reset-leases", "cli#a")
    popped = sq(master, "lease", "cli#a", "-n", "3", "--done")
    assert "dequeued 3 task(s)" in popped
    assert "not in cli#a" in sq(master, "task", "cli#a", "!first", code=1)
    assert "no task available" in sq(master, "lease", "cli#empty")


def test_queues_stats_delete(master: str) -> None:
    sq(master, "put", "lst#x", "--count", "3")
    sq(master, "put", "lst#y", "--count", "1")
    out = sq(master, "queues", "lst#")
    assert "lst#x" in out and "lst#y" in out
    rows = json.loads(sq(master, "queues", "--group", "lst", "--json"))
    assert [(r["queue"], r["total"]) for r in rows] == [("x", 3), ("y", 1)]
    assert "no queues match" in sq(master, "queues", "nothing-like-this")
    assert "available" in sq(master, "stats", "lst#x")
    assert json.loads(sq(master, "stats", "lst#x", "--json"))["total"] == 3
    assert "busiest queues" in sq(master, "stats")
    assert "lst#x" in sq(master, "stats", "--watch", "--interval", "0.1", "--times", "1")
    assert "deleted lst#y (1 task(s))" in sq(master, "delete", "lst#y", "--yes")
    assert "deleted" not in sq(master, "delete", "lst#x", input="n\n", code=1)


def test_stats_keeps_its_numbers_beside_a_long_pid(master: str) -> None:
    """A leased task with a 300-character pid, at 80 columns: every count is printed, and
    the pid is cut short (…) in the sample table; where the output is not a terminal and
    COLUMNS is unset, lines are not wrapped at all."""
    pid = "p" * 300
    with Client(master) as c:
        c.put("long#q", pid=pid)
        c.put("long#q", pid="short")
        assert len(c.lease("long#q", 2, lease_secs=300)) == 2
    r = runner.invoke(app, ["stats", "long#q", "--master", master], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(len(line) for line in lines) <= 80, r.output
    for label, value in (("leased", "2"), ("total", "2"), ("available", "0")):
        assert any(line.split()[:1] == [label] and line.split()[-1] == value
                   for line in lines), (label, r.output)
    assert "leased now (sample)" in r.output and "short" in r.output
    assert "p" * 20 + "…" in r.output and pid not in r.output


def test_output_that_is_not_a_terminal_is_not_wrapped(master: str) -> None:
    """Piped (no terminal, COLUMNS unset), a wide table stays a table of one line per row;
    with COLUMNS=80 it is printed one block per row instead of being broken in cells.
    The `squall` command runs in a process of its own: the console reads COLUMNS when the
    CLI is imported, and this test process's COLUMNS is its runner's (pytest-xdist: 80)."""
    name = "wide#" + "q" * 100
    sq(master, "put", name, "--count", "2")
    squall = str(Path(sys.executable).with_name("squall"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}

    def piped(**extra: str) -> str:
        r = subprocess.run([squall, "queues", "wide#", "--master", master], text=True,
                           capture_output=True, env={**env, **extra}, timeout=120)
        assert r.returncode == 0, (r.stdout, r.stderr)
        return r.stdout

    out = piped()
    [row] = [line for line in out.splitlines() if name in line]
    assert row.split()[1:] == ["2", "0", "0", "2", "0"], out
    out = piped(COLUMNS="80")
    assert "available 2" in out and max(map(len, out.splitlines())) <= 80, out


def test_dead_letters_and_redrive(master: str) -> None:
    with Client(master) as c:
        c.set_policy("dl#q", max_attempts=1)
        c.put("dl#q", pid="doomed")
        [t] = c.lease("dl#q")
        t.release(error="ValueError: bad input\nmore lines")
    out = sq(master, "dead-letters", "dl#q")
    assert "doomed" in out and "ValueError" in out and "more lines" not in out
    assert "moved 1 task(s) from dl#q.dead back into dl#q" in sq(master, "redrive", "dl#q")
    assert "no dead letters in dl#q.dead" in sq(master, "dead-letters", "dl#q")
    # a typo: a clear message and a non-zero exit, and no queue created
    out = sq(master, "redrive", "dl#qq", code=1)
    assert "dl#qq does not exist" in out and "Traceback" not in out
    assert "dl#qq" not in sq(master, "queues", "dl#", "--all")


def test_nodes_without_data_nodes(master: str) -> None:
    out = sq(master, "nodes")
    assert "replication factor" in out
    assert json.loads(sq(master, "nodes", "--json"))["nodes"] == []


def test_clear_messages_for_user_errors(master: str) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    r = runner.invoke(app, ["queues", "--master", nobody])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit)
    assert "cannot reach a squall master at " + nobody in r.output
    assert "squall dev" in r.output and "Traceback" not in r.output
    with running_app(Response("<h1>hello</h1>", status_code=404, media_type="text/html")
                     ) as url:
        r = runner.invoke(app, ["stats", "--master", url])
    assert r.exit_code == 1 and "does not look like a squall master" in r.output
    r = runner.invoke(app, ["put", "no spaces#allowed", "--master", master])
    assert r.exit_code == 2 and "invalid group name" in r.output
    r = runner.invoke(app, ["lease", "g#bad/name", "--master", master])
    assert r.exit_code == 2 and "invalid queue name" in r.output
    r = runner.invoke(app, ["put", "q", "--count", "1", "--master", "localhost:7070"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "has no scheme: write http://localhost:7070" in r.output
    r = runner.invoke(app, ["queues", "--master", f"{master},ftp://other:21"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "http(s) URL such as http://host:7070, not 'ftp://other:21'" in r.output


def test_version_is_the_projects() -> None:
    """`squall --version` prints the version pyproject.toml declares (the installed one)."""
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    want = tomllib.loads(pyproject.read_text())["project"]["version"]
    r = runner.invoke(app, ["--version"])
    assert r.exit_code == 0 and r.output == f"squall {want}\n"


LOADED = """
import sys
from squall.client.cli import main
sys.argv = ["squall", *sys.argv[1:]]
try:
    main()
except SystemExit:
    pass
print("LOADED", " ".join(sorted(m for m in sys.modules
                               if m.startswith(("squall.master", "squall.datanode", "fastapi")))))
"""


def _loaded(*argv: str) -> tuple[str, set[str]]:
    """The output of `squall ARGV` in a fresh interpreter, and the server modules it
    imported."""
    r = subprocess.run([sys.executable, "-c", LOADED, *argv], capture_output=True, text=True,
                       timeout=120)
    out, _, mods = r.stdout.rpartition("LOADED")
    assert "Traceback" not in r.stderr, r.stderr
    return out, set(mods.split())


def test_user_verbs_do_not_import_the_servers() -> None:
    """The server commands are plugins that import the servers (FastAPI, LMDB: about 0.3 s
    of CPU): a user verb never loads them; the command list and a server command do."""
    for argv in (["put", "--help"], ["--token", "t", "queues", "--help"],
                 ["--version"]):
        _, mods = _loaded(*argv)
        assert not mods, (argv, sorted(mods)[:5])
    out, mods = _loaded("--help")
    assert "master" in out and "datanode" in out and "squall.master.cli" in mods, out
    out, mods = _loaded("master", "--help")
    assert "squall.master.cli" in mods and "Run a master" in out, out
    _, mods = _loaded("datanode", "--help")
    assert "squall.datanode.cli" in mods
