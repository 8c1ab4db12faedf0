"""A soak worker process: ``squall.client.Worker`` on the soak's queues, writing the ledger.

    python -m tests.chaos.worker MASTER LEDGER_FILE NAME SEED QUEUE [QUEUE ...]

Each handler reads the payload, checks it against its pid, writes a ``got`` record, then
either dequeues the task itself (``done`` / ``done?`` / ``done-`` records: the outcome is
known) or returns and leaves the dequeue to the Worker's acker (``auto``). A few handlers
fail on purpose (the Worker releases the task; it is delivered again). The mix is drawn
from the seed. SIGKILL at any moment is the point; SIGTERM stops gracefully.
"""

from __future__ import annotations

import random
import sys
import threading

from squall.client import Client, LeaseError, NotFound, SquallError, Worker
from squall.client._tasks import TaskBase
from tests.chaos.ledger import Writer, crc, payload_of

LEASE_SECS = 4.0


class Failed(Exception):
    """A handler failure on purpose."""


def main(argv: list[str]) -> int:
    master, ledger_file, name, seed, *queues = argv
    rng = random.Random(int(seed))
    lock = threading.Lock()
    led = Writer(ledger_file)

    def draw() -> float:
        with lock:
            return rng.random()

    def handler(task: TaskBase) -> None:
        data = task.payload()  # type: ignore[attr-defined]
        c = crc(data)
        ok = data == payload_of(task.pid, len(data))
        led.write("got", q=task.queue, pid=task.pid, tok=task.token, crc=c, w=name,
                  ok=ok, n=len(data))
        r = draw()
        if r < 0.03:
            raise Failed("on purpose")
        if r < 0.55:
            try:
                task.done()  # type: ignore[attr-defined]
            except (LeaseError, NotFound) as e:
                led.write("done-", q=task.queue, pid=task.pid, tok=task.token, err=repr(e))
                raise
            except SquallError as e:
                led.write("done?", q=task.queue, pid=task.pid, tok=task.token, err=repr(e))
                raise
            led.write("done", q=task.queue, pid=task.pid, tok=task.token)
        else:
            led.write("auto", q=task.queue, pid=task.pid, tok=task.token)

    with Client(master, timeout=10.0, retries=3, worker=name) as client:
        Worker(client, queues, handler, concurrency=8, lease_secs=LEASE_SECS, grace_s=2.0,
               poll_max_s=0.25).run()
    led.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
