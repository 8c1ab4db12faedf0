"""Real master-set processes on loopback for the failover tests and the bench: three (or
five) `python -m squall.master --members ...` with a file lease elector, a ledger workload
(producers and consumers that record what was acknowledged) and leader lookups."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import urllib.request
from typing import Any

from squall.client import Client, SquallError
from tests.helpers import free_port_block, http_status, wait_for

CLUSTER_KEY = "squall-test-cluster-key-0123456789abcdef"


def _free_ports(n: int) -> list[int]:
    base = free_port_block(n)
    return list(range(base, base + n))


class MasterSetProcs:
    def __init__(self, root: str, n: int = 3, lease_secs: float = 2.0,
                 extra: list[str] | None = None, elector: str | None = None) -> None:
        self.root, self.n = root, n
        self.ports = _free_ports(n)
        self.urls = [f"http://127.0.0.1:{p}" for p in self.ports]
        self.lease = os.path.join(root, "lease")
        self.elector = elector or f"file:{self.lease}"
        self.lease_secs = lease_secs
        self.extra = extra or []
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.env = {**os.environ, "SQUALL_CLUSTER_KEY": CLUSTER_KEY}

    def data_dir(self, i: int) -> str:
        return os.path.join(self.root, f"m{i}")

    def start(self, i: int) -> None:
        """Start member `i`; with `n` = 1, a plain master (no set: the bench's baseline)."""
        ha = ["--members", ",".join(self.urls), "--elector", self.elector,
              "--elector-lease-s", str(self.lease_secs)] if self.n > 1 else []
        with open(os.path.join(self.root, f"m{i}.log"), "ab") as log:
            self.procs[i] = subprocess.Popen(
                [sys.executable, "-m", "squall.master", "--data-dir", self.data_dir(i),
                 "--port", str(self.ports[i]), *ha, *self.extra],
                stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True)

    def start_all(self) -> None:
        for i in range(self.n):
            self.start(i)

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        p = self.procs[i]
        if p.poll() is None:
            os.kill(p.pid, sig)
            if sig == signal.SIGKILL:
                p.wait(30)

    def wipe(self, i: int) -> None:
        shutil.rmtree(self.data_dir(i), ignore_errors=True)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(20)

    def info(self, i: int) -> dict[str, Any] | None:
        try:
            with urllib.request.urlopen(f"{self.urls[i]}/v1/leader", timeout=1.0) as r:
                out: dict[str, Any] = json.load(r)
                return out
        except (OSError, ValueError):
            return None

    def leader(self) -> int | None:
        """The member that says it leads and is ready, if exactly one is."""
        found = []
        for i in range(self.n):
            d = self.info(i)
            if d is not None and d["role"] == "leader" and self.ready(i):
                found.append(i)
        return found[0] if len(found) == 1 else None

    def ready(self, i: int) -> bool:
        try:
            return http_status(f"{self.urls[i]}/readyz") == 200
        except (OSError, ValueError):
            return False

    def wait_leader(self, timeout: float = 60.0, not_: int | None = None) -> int:
        def found() -> list[int]:
            i = self.leader()
            return [i] if i is not None and i != not_ else []

        return wait_for(found, timeout, what=f"a leader (logs in {self.root})")[0]

    def log(self, i: int) -> str:
        with open(os.path.join(self.root, f"m{i}.log"), errors="replace") as f:
            return f.read()


class Ledger:
    """A producer and a consumer against whichever member leads, recording what was
    acknowledged: puts (pids) and dones; a pid leased again after its done was
    acknowledged is a violation."""

    def __init__(self, ms: MasterSetProcs, queue: str = "ha#q") -> None:
        self.ms, self.queue = ms, queue
        self.put_acked: set[str] = set()
        self.done_acked: set[str] = set()
        # every pid ever leased: a done whose answer was lost in a failover may have been
        # applied (the task is gone) though the ledger could not record it as acknowledged
        self.seen: set[str] = set()
        self.violations: list[str] = []
        self.errors = 0
        self.stop_puts = threading.Event()
        self.stop_all = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._produce, daemon=True),
                        threading.Thread(target=self._consume, daemon=True)]

    def _client(self, stop: threading.Event) -> Client | None:
        """A client of the leader, once one is found; None if `stop` is set first (or none
        is found for a while: the caller asks again)."""
        def found() -> list[int | None]:
            if stop.is_set():
                return [None]
            i = self.ms.leader()
            return [i] if i is not None else []

        try:
            i = wait_for(found, 10.0, interval=0.05, what="a leader")[0]
        except TimeoutError:
            return None
        return None if i is None else Client(self.ms.urls[i], retries=0, timeout=5.0)

    def _produce(self) -> None:
        n = 0
        c: Client | None = None
        while not self.stop_puts.is_set():
            if c is None:
                c = self._client(self.stop_puts)
                continue
            pid = f"t{n:07d}"
            n += 1
            try:
                c.put(self.queue, None, pid=pid)
            except (SquallError, OSError):
                self.errors += 1
                c.close()
                c = None
                continue
            with self.lock:
                self.put_acked.add(pid)
        if c is not None:
            c.close()

    def _consume(self) -> None:
        c: Client | None = None
        while not self.stop_all.is_set():
            if c is None:
                c = self._client(self.stop_all)
                continue
            try:
                # waits (long poll) for a task rather than asking again and again
                tasks = c.lease(self.queue, max_tasks=20, lease_secs=2.0, wait_secs=0.5)
                with self.lock:
                    for t in tasks:
                        if t.pid in self.done_acked:
                            self.violations.append(f"{t.pid} delivered after its done")
                        self.seen.add(t.pid)
                if tasks:
                    c.done(tasks)
                    with self.lock:
                        self.done_acked.update(t.pid for t in tasks)
            except (SquallError, OSError):
                self.errors += 1
                c.close()
                c = None
        if c is not None:
            c.close()

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def finish(self, timeout: float = 120.0) -> None:
        """Stop putting; consume until every acknowledged put was delivered and the queue
        is empty; then: no acknowledged put lost, none delivered after its acknowledged
        done, and the queue's completed counter equals the distinct tasks delivered."""
        self.stop_puts.set()
        self.threads[0].join(30)

        def drained() -> bool:
            with self.lock:
                left = self.put_acked - self.seen
            return not left and self._total() == 0

        with contextlib.suppress(TimeoutError):  # the asserts below say what is missing
            wait_for(drained, timeout, interval=0.1, what="every acknowledged put delivered")
        self.stop_all.set()
        self.threads[1].join(30)
        with self.lock:
            lost = sorted(self.put_acked - self.seen)
        assert not lost, f"{len(lost)} acknowledged tasks never delivered: {lost[:10]}"
        assert not self.violations, self.violations[:10]
        completed = self._completed()
        assert completed == len(self.seen), (completed, len(self.seen))

    def _stats(self) -> Any:
        i = self.ms.leader()
        if i is None:
            return None
        try:
            with Client(self.ms.urls[i], retries=0, timeout=5.0) as c:
                return c.stats(self.queue)
        except (SquallError, OSError):
            return None

    def _total(self) -> int:
        s = self._stats()
        return -1 if s is None else int(s.total)

    def _completed(self) -> int:
        def answered() -> list[Any]:
            s = self._stats()
            return [] if s is None else [s]

        return int(wait_for(answered, 30, interval=0.1, what="a leader answering stats")[0]
                   .completed)

    def acked(self) -> int:
        with self.lock:
            return len(self.put_acked)


def stats_total(url: str, queue: str) -> int:
    with Client(url, retries=0, timeout=5.0) as c:
        return int(c.stats(queue).total)

__all__ = ["Ledger", "MasterSetProcs", "SquallError", "stats_total"]
