"""Client CPU per small request, by transport: `stats()` (the whole client path:
protocol core, JSON, models) and a bare ``GET /healthz`` through the client's httpx client
(the HTTP stack only) in a loop against a real master (a subprocess on 127.0.0.1),
`time.process_time()` of this process only.

    .venv/bin/python -m bench.transport_cpu [--n 2000]

Prints one line per transport (stats, healthz): the sync client with httpx's default
transport and with its own default, the engine (``common/transport``); the async client
likewise. Bounded: n calls per transport (n ≤ 20,000)."""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time

import httpx

from squall.client import AsyncClient, Client
from tests.helpers import running_master


def _sync(url: str, n: int, lean: bool) -> tuple[float, float]:
    t = None if lean else httpx.HTTPTransport()
    with Client(url, transport=t) as c:
        c.stats()
        t0 = time.process_time()
        for _ in range(n):
            c.stats()
        t1 = time.process_time()
        for _ in range(n):
            c._http.get("/healthz").raise_for_status()
        return (t1 - t0) / n, (time.process_time() - t1) / n


async def _async(url: str, n: int, lean: bool) -> tuple[float, float]:
    t = None if lean else httpx.AsyncHTTPTransport()
    async with AsyncClient(url, transport=t) as c:
        await c.stats()
        t0 = time.process_time()
        for _ in range(n):
            await c.stats()
        t1 = time.process_time()
        for _ in range(n):
            (await c._http.get("/healthz")).raise_for_status()
        return (t1 - t0) / n, (time.process_time() - t1) / n


def _line(name: str, s: tuple[float, float]) -> str:
    return f"{name:22s} stats {s[0] * 1e3:.3f} ms, healthz {s[1] * 1e3:.3f} ms CPU per request"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    n = min(ap.parse_args().n, 20_000)
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}; n={n} per transport")
    with tempfile.TemporaryDirectory() as d, running_master(d) as m:
        for name, lean in (("sync httpx default", False), ("sync engine", True)):
            print(_line(name, _sync(m.url, n, lean)))
        for name, lean in (("async httpx default", False), ("async engine", True)):
            print(_line(name, asyncio.run(_async(m.url, n, lean))))


if __name__ == "__main__":
    main()
