"""Test harness: real master processes on 127.0.0.1, in-process apps, waiting on conditions."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(cond: Callable[[], T], timeout: float = 20.0, interval: float = 0.02,
             what: str = "condition") -> T:
    """Poll `cond` until it returns a truthy value; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except Exception as e:
            last_exc = e
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}") from last_exc


class MasterProcess:
    """A real `python -m squall.master` subprocess on an ephemeral 127.0.0.1 port."""

    def __init__(self, data_dir: str, extra: list[str] | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.extra = extra or []
        self.env = env
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(os.path.dirname(data_dir.rstrip("/")) or ".",
                                     f"master-{os.path.basename(data_dir)}.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> MasterProcess:
        for _ in range(5):
            self.port = free_port()
            log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "squall.master", "--data-dir", self.data_dir,
                 "--port", str(self.port), *self.extra],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(self.env or {})},
            )
            log.close()
            try:
                wait_for(self._ready, timeout, what=f"master on {self.url}")
                return self
            except TimeoutError:
                if self.proc.poll() is None:
                    raise
                # exited early (e.g. the port got taken): try another port
        raise RuntimeError(f"master did not start; see {self.log_path}")

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise TimeoutError("master exited")
        return httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill9()


@contextlib.contextmanager
def running_master(data_dir: str, **kw: Any) -> Iterator[MasterProcess]:
    m = MasterProcess(data_dir, **kw).start()
    try:
        yield m
    finally:
        m.stop()
