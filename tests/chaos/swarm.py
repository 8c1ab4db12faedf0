"""The swarm: 128 concurrent clients (``AsyncClient``, each with its own connection pool)
in one process, half producing into ``soak#swarm``, half leasing and dequeueing it, for a
bounded time and count, writing the same ledger as the rest of the soak.

    python -m tests.chaos.swarm MASTER LEDGER_FILE SEED SECONDS CLIENTS

Prints one JSON line of figures at the end (operations, errors, latency percentiles).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from typing import Any

from squall.client import AsyncClient, AsyncLeasedTask, LeaseError, NotFound, SquallError
from tests.chaos.ledger import Writer, crc, payload_of

QUEUE = "soak#swarm"
OVERTIME_S = 60.0  # a client with no success yet keeps trying this long past the window
PUTS_MAX = 400  # per producing client
LEASES_MAX = 2000  # per consuming client


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(p * len(xs)))] * 1000, 1)


class Swarm:
    def __init__(self, master: str, ledger_file: str, seed: int, seconds: float) -> None:
        self.master, self.seed, self.seconds = master, seed, seconds
        self.led = Writer(ledger_file)
        self.end = 0.0  # set once every client exists
        self.put_lat: list[float] = []
        self.lease_lat: list[float] = []
        self.errors: dict[str, int] = {}
        self.examples: dict[str, str] = {}  # the first message of each kind of error

    def over(self, successes: int) -> bool:
        """The window has closed for a client (one with no success yet gets overtime: the
        window may have fallen on a master restart, which takes a minute at load 40)."""
        now = time.monotonic()
        return now > self.end and (successes > 0 or now > self.end + OVERTIME_S)

    def err(self, e: BaseException, where: str) -> None:
        name = f"{type(e).__name__} ({where})"
        self.errors[name] = self.errors.get(name, 0) + 1
        self.examples.setdefault(name, repr(e)[:300])

    async def producer(self, i: int, c: AsyncClient) -> None:
        rng = random.Random(self.seed * 1000 + i)
        async with c:
            ok = 0
            for seq in range(PUTS_MAX):
                if self.over(ok):
                    return
                pid = f"s{i}-{seq:06d}"
                data = payload_of(pid, rng.randint(16, 4096))
                t = time.monotonic()
                try:
                    await c.put(QUEUE, data, pid=pid, idempotency_key=pid)
                except SquallError as e:
                    self.err(e, "put")
                    self.led.write("put?", q=QUEUE, pid=pid, crc=crc(data), n=len(data),
                                   err=repr(e)[:200])
                    continue  # the client's own retries already waited out its budget
                self.put_lat.append(time.monotonic() - t)
                ok += 1
                self.led.write("put", q=QUEUE, pid=pid, crc=crc(data), n=len(data))
                await asyncio.sleep(rng.uniform(0.0, 0.2))

    async def consumer(self, i: int, c: AsyncClient) -> None:
        name = f"swarm{i}"
        async with c:
            ok = 0
            for _ in range(LEASES_MAX):
                if self.over(ok):
                    return
                t = time.monotonic()
                try:
                    tasks = await c.lease(QUEUE, max_tasks=4, lease_secs=10.0,
                                          wait_secs=1.0)  # long poll: no idle spinning
                except SquallError as e:
                    self.err(e, "lease")
                    continue  # the client's own retries already waited out its budget
                if tasks:  # an empty answer waited out its long poll: not a latency
                    self.lease_lat.append(time.monotonic() - t)
                ok += 1
                for task in tasks:
                    await self.handle(task, name)

    async def handle(self, task: AsyncLeasedTask, name: str) -> None:
        q, pid, tok = task.queue, task.pid, task.token
        try:
            data = await task.payload()
        except SquallError as e:
            self.err(e, "payload")
            return  # the lease expires; someone reads it again
        self.led.write("got", q=q, pid=pid, tok=tok, crc=crc(data), w=name,
                       ok=data == payload_of(pid, len(data)), n=len(data))
        try:
            await task.done()
        except (LeaseError, NotFound) as e:
            self.err(e, "done")
            self.led.write("done-", q=q, pid=pid, tok=tok, err=repr(e)[:200])
            return
        except SquallError as e:
            self.err(e, "done")
            self.led.write("done?", q=q, pid=pid, tok=tok, err=repr(e)[:200])
            return
        self.led.write("done", q=q, pid=pid, tok=tok)

    async def run(self, n: int) -> dict[str, Any]:
        # every client (with its own connection pool) exists before the clock starts
        t0 = time.monotonic()
        ps = [AsyncClient(self.master, timeout=15.0, retries=3) for _ in range(n // 2)]
        cs = [AsyncClient(self.master, timeout=15.0, retries=3, worker=f"swarm{i}")
              for i in range(n - n // 2)]
        setup = time.monotonic() - t0
        t0 = time.monotonic()
        self.end = t0 + self.seconds
        await asyncio.gather(*(self.producer(i, c) for i, c in enumerate(ps)),
                             *(self.consumer(i, c) for i, c in enumerate(cs)))
        self.led.close()
        lat = self.put_lat, self.lease_lat
        return {"clients": n, "setup_s": round(setup, 1),
                "secs": round(time.monotonic() - t0, 1), "puts": len(lat[0]),
                "leases": len(lat[1]), "put_p50_ms": pct(lat[0], 0.5),
                "put_p99_ms": pct(lat[0], 0.99), "lease_p50_ms": pct(lat[1], 0.5),
                "lease_p99_ms": pct(lat[1], 0.99), "errors": self.errors,
                "error_examples": self.examples}


if __name__ == "__main__":
    m, f, s, secs, n = sys.argv[1:6]
    print(json.dumps(asyncio.run(Swarm(m, f, int(s), float(secs)).run(int(n)))), flush=True)
