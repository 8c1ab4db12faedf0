"""`squall dev` as a user runs it: a data node that dies does not stop the cluster; the
master marks it dead, and `restart N` typed on stdin brings it back alive."""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import httpx

from tests.helpers import ADMIN, free_port_block, wait_for


def test_dev_survives_a_dead_node_and_restarts_it(tmp_path: Path) -> None:
    port = free_port_block(3)
    url = f"http://127.0.0.1:{port}"
    p = subprocess.Popen(
        [sys.executable, "-c", "from squall.client.cli import main; main()", "dev",
         "--nodes", "2", "--data-dir", str(tmp_path / "dev"), "--port", str(port)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.stdin is not None and p.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []

    def read(out: IO[str]) -> None:
        for line in out:
            lines.put(line)

    reader = threading.Thread(target=read, args=(p.stdout,), daemon=True)
    reader.start()

    def said(text: str) -> bool:
        while not lines.empty():
            seen.append(lines.get())
        return any(text in x for x in seen)

    def states() -> list[str]:
        info = httpx.get(url + "/v1/cluster", headers=ADMIN).json()
        return sorted(n["state"] for n in info["nodes"])

    try:
        wait_for(lambda: said("is up"), 90, what="squall dev up")
        assert states() == ["alive", "alive"]
        p.stdin.write("kill 2\n")
        p.stdin.flush()
        wait_for(lambda: said("node-2 exited"), 30, what="the dead node reported")
        assert said("restart 2") and p.poll() is None  # it says how, and keeps running
        wait_for(lambda: states() == ["alive", "dead"], 30, what="the master seeing it dead")
        p.stdin.write("restart 2\n")
        p.stdin.flush()
        wait_for(lambda: said("node-2 restarted"), 30, what="the restart")
        wait_for(lambda: states() == ["alive", "alive"], 60, what="node-2 alive again")
    finally:
        p.send_signal(signal.SIGINT)
        try:
            p.wait(60)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait(10)
            reader.join(10)
            p.stdin.close()
            p.stdout.close()
    assert p.returncode == 0, seen
