"""A worker killed with SIGKILL mid-task loses nothing: its tasks come back when their
leases expire and another worker finishes them. Also SIGTERM: a graceful stop gives the
running tasks back at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from squall.client import Client, NewTask, Worker
from tests.helpers import MasterProcess, wait_for

WORKER = textwrap.dedent("""
    import sys, threading
    from squall.client import Client, Worker

    master, queue, marks = sys.argv[1:4]

    def handler(task):
        with open(marks, "a") as f:
            f.write(task.pid + "\\n")
        threading.Event().wait()  # stuck: holds its lease until killed

    Worker(Client(master), [queue], handler, concurrency=5, lease_secs=2.0, grace_s=0.1).run()
""")


def start_worker(master: str, queue: str, marks: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", WORKER, master, queue, str(marks)],
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def marked(marks: Path) -> list[str]:
    return marks.read_text().split() if marks.exists() else []


def test_sigkill_mid_task_tasks_finish_elsewhere(tmp_path: Path) -> None:
    m = MasterProcess(str(tmp_path / "master")).start()
    try:
        with Client(m.url) as c:
            c.put_many("k#q", [NewTask(pid=f"t{i}") for i in range(5)])
            marks = tmp_path / "marks"
            proc = start_worker(m.url, "k#q", marks)
            try:
                wait_for(lambda: len(marked(marks)) == 5, 60, what="5 tasks in progress")
                assert c.stats("k#q").leased == 5
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
            done: list[tuple[str, int]] = []
            stats = Worker(c, ["k#q"], lambda t: done.append((t.pid, t.attempts)),
                           burst=True).run()
            assert sorted(done) == [(f"t{i}", 2) for i in range(5)]
            assert stats.done == 5 and c.stats("k#q").total == 0
    finally:
        m.stop()


def test_sigterm_releases_running_tasks(tmp_path: Path) -> None:
    m = MasterProcess(str(tmp_path / "master")).start()
    try:
        with Client(m.url) as c:
            c.put("k#t", pid="only")
            marks = tmp_path / "marks"
            proc = start_worker(m.url, "k#t", marks)
            try:
                wait_for(lambda: marked(marks) == ["only"], 60, what="the task in progress")
                proc.send_signal(signal.SIGTERM)
                # the handler is stuck: after the grace period its task is given back and
                # the process exits (the handler's thread does not hold it)
                assert proc.wait(30) == 0
                assert c.task("k#t", "only").state == "available"
            finally:
                proc.kill()
                proc.wait(30)
            assert c.task("k#t", "only").attempts == 1
    finally:
        m.stop()
