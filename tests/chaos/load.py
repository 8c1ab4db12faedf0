"""Continuous load: producer threads in the harness, worker processes, and the swarm of
128 concurrent clients. Every loop is bounded in time and count."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

from squall.client import (
    Client,
    ConnectError,
    DataCorrupt,
    NewTask,
    ServerError,
    SquallError,
    StatusError,
)
from tests.chaos.ledger import Writer, crc, payload_of

QUEUES = ("soak#a", "soak#b")  # the producers'
ALL_QUEUES = (*QUEUES, "soak#swarm", "soak#probe")  # the workers' (swarm.py, faults.py)
SIZES = ((0.80, 16, 2048), (0.17, 2048, 32 << 10), (0.03, 64 << 10, 256 << 10))


def draw_size(rng: random.Random) -> int:
    r = rng.random()
    for p, lo, hi in SIZES:
        if r < p:
            return rng.randint(lo, hi)
        r -= p
    return 0  # an empty payload now and then (r can land here by rounding)


def refused(e: SquallError) -> bool:
    """An error that promises nothing was applied: a status other than 500, 502 or 504
    (docs/client.md: a 503 is refused before anything is applied; 502 ``outcome_unknown``
    may have been applied), or a connection never made."""
    if isinstance(e, ConnectError):
        return True
    return isinstance(e, StatusError) and not isinstance(e, ServerError | DataCorrupt) \
        and e.status not in (500, 502, 504)


class Producers:
    """`n` threads, each with its own client, enqueueing unique pids at about `rate` tasks
    per second in all, singly or in small batches, until stopped or `max_tasks`.

    Even-numbered producers never retry (``retries=0``), so the one answer they get is the
    whole story: a refusal (:func:`refused`) is written as ``put-``, and the checker
    fails the soak if such a task is ever delivered (refused means not applied). The odd
    ones retry like a normal client, and every failure is ``put?`` (ambiguous)."""

    def __init__(self, master: str, ledger_dir: str, n: int, rate: float, seed: int,
                 max_tasks: int) -> None:
        self.master, self.n, self.rate, self.seed = master, n, rate, seed
        self.max_each = max_tasks // n
        self.led = Writer(os.path.join(ledger_dir, "producers.jsonl"))
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,), name=f"producer-{i}",
                                         daemon=True) for i in range(n)]
        self.errors: list[str] = []
        self.acked = self.ambiguous = 0

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)
        self.led.close()

    def _run(self, i: int) -> None:
        rng = random.Random(self.seed * 1000 + i)
        period = self.n / self.rate
        seq = 0
        retries = 0 if i % 2 == 0 else 3
        with Client(self.master, timeout=10.0, retries=retries, worker=f"producer-{i}") as c:
            while not self.stop.is_set() and seq < self.max_each:
                batch = 1 if rng.random() < 0.7 else rng.randint(2, 20)
                queue = QUEUES[rng.random() < 0.3]
                tasks = []
                for _ in range(batch):
                    seq += 1
                    pid = f"p{i}-{seq:07d}"
                    tasks.append((pid, payload_of(pid, draw_size(rng))))
                self._put(c, queue, tasks, strict=retries == 0)
                self.stop.wait(period * batch * rng.uniform(0.5, 1.5))

    def _put(self, c: Client, queue: str, tasks: list[tuple[str, bytes]], strict: bool
             ) -> None:
        try:
            if len(tasks) == 1:
                c.put(queue, tasks[0][1], pid=tasks[0][0], idempotency_key=tasks[0][0])
            else:
                c.put_many(queue, [NewTask(data, pid, idempotency_key=pid)
                                   for pid, data in tasks])
        except SquallError as e:
            kind = "put-" if strict and refused(e) else "put?"
            for pid, data in tasks:
                self.led.write(kind, q=queue, pid=pid, crc=crc(data), n=len(data),
                               err=repr(e)[:200])
            self.ambiguous += len(tasks)
            return
        except Exception as e:  # not a squall error: a client bug, written down
            self.errors.append(f"put raised {e!r}")
            for pid, data in tasks:
                self.led.write("put?", q=queue, pid=pid, crc=crc(data), n=len(data),
                               err=repr(e)[:200])
            return
        for pid, data in tasks:
            self.led.write("put", q=queue, pid=pid, crc=crc(data), n=len(data))
        self.acked += len(tasks)


class Workers:
    """A pool of worker processes (tests/chaos/worker.py); a slot can be SIGKILLed and
    restarted with a fresh process."""

    def __init__(self, master: str, ledger_dir: str, log_dir: str, n: int, seed: int) -> None:
        self.master, self.ledger_dir, self.log_dir, self.seed = master, ledger_dir, log_dir, seed
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * n
        self.generation = [0] * n
        self.kills = 0
        self.lock = threading.Lock()

    def _spawn(self, slot: int) -> subprocess.Popen[bytes]:
        g = self.generation[slot]
        self.generation[slot] += 1
        name = f"w{slot}.{g}"
        with open(os.path.join(self.log_dir, f"worker-{slot}.log"), "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "tests.chaos.worker", self.master,
                 os.path.join(self.ledger_dir, f"{name}.jsonl"), name,
                 str(self.seed * 100 + slot * 10 + g), *ALL_QUEUES],
                stdout=log, stderr=subprocess.STDOUT)

    def start(self) -> None:
        with self.lock:
            for i in range(len(self.procs)):
                self.procs[i] = self._spawn(i)

    def kill_and_restart(self, slot: int) -> None:
        with self.lock:
            p = self.procs[slot]
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(30)
                self.kills += 1
            self.procs[slot] = self._spawn(slot)

    def stop(self, timeout: float = 30.0) -> list[int | None]:
        """SIGTERM every worker (graceful: running tasks are given back); SIGKILL after
        `timeout`. Returns the exit codes."""
        with self.lock:
            live = [p for p in self.procs if p is not None]
            for p in live:
                if p.poll() is None:
                    p.terminate()
            deadline = time.monotonic() + timeout
            for p in live:
                try:
                    p.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(30)
            return [p.returncode for p in live]
