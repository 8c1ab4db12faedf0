"""Per-request CPU of the hot routes on the event loop thread, in process, no sockets.

Run ``python -m bench.route_cpu [--n N] [--rounds R]``. It builds the master's and a data
node's real apps (fsync on, a fresh data dir), starts them (lifespan), and calls each app
directly as an ASGI app for N sequential requests per route, through the whole middleware
(credential check, metrics, body limit) and the route's dispatch. The figure is the event
loop thread's CPU time per request (``time.thread_time``): what dispatching and serving a
request costs the loop, without uvicorn's HTTP parsing, the commit thread's fsyncs or the
store's read threads. Run it on two commits alternately to compare their dispatch paths.
It prints one JSON line per round: {route: µs per request}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

from squall.common.security import auth, tokens

AUTH_KEY = b"ed25519-private:YmVuY2gtcm91dGUtY3B1LWF1dGgta2V5LTAxMjM0NTY"
AUTH_KEYS = auth.parse_keys(AUTH_KEY)
CLUSTER_KEY = b"bench-route-cpu-cluster-key-0123456"
App = Callable[..., Awaitable[None]]


async def call(app: App, method: str, path: str, body: bytes, headers: dict[str, str]
               ) -> tuple[int, bytes]:
    """One request straight into the ASGI app; (status, body)."""
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"},
             "http_version": "1.1", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": b"", "root_path": "", "scheme": "http",
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 40000),
             "headers": [(k.lower().encode(), v.encode()) for k, v in
                         {"host": "127.0.0.1", "content-length": str(len(body)),
                          **headers}.items()]}
    sent = False
    out: list[bytes] = []
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if sent:
            await asyncio.sleep(3600)
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        nonlocal status
        if msg["type"] == "http.response.start":
            status = msg["status"]
        else:
            out.append(msg.get("body", b""))

    await app(scope, receive, send)
    return status, b"".join(out)


async def timed(name: str, n: int, one: Callable[[int], Awaitable[None]],
                res: dict[str, float]) -> None:
    for i in range(min(50, n)):  # warm-up
        await one(-1 - i)
    t0 = time.thread_time()
    for i in range(n):
        await one(i)
    res[name] = round((time.thread_time() - t0) / n * 1e6, 1)


async def master_round(n: int, base: Path) -> dict[str, float]:
    from squall.master.http.app import create_master_app
    from squall.master.service import MasterSettings

    app = create_master_app(MasterSettings(data_dir=str(base / "m"), require_receipts=False),
                            background=False)
    cred = auth.mint(AUTH_KEYS, ["admin"], 3600, time.time())
    h = {"authorization": f"Bearer {cred}", "content-type": "application/json"}
    res: dict[str, float] = {}
    async with app.router.lifespan_context(app):
        async def enqueue(i: int) -> None:
            st, _ = await call(app, "POST", "/v1/groups/g/queues/q/tasks",
                               b'{"tasks":[{}]}', h)
            assert st == 200

        async def lease_ack(i: int) -> None:
            st, b = await call(app, "POST", "/v1/groups/g/queues/q/lease",
                               b'{"max_tasks":1,"lease_secs":30}', h)
            t = orjson.loads(b)["tasks"][0]
            st2, _ = await call(app, "POST", "/v1/groups/g/update", orjson.dumps(
                {"dequeue": [{"queue": "q", "pid": t["pid"], "token": t["token"]}]}), h)
            assert st == st2 == 200

        await timed("master enqueue", n, enqueue, res)
        await timed("master lease+update", n, lease_ack, res)
        res["master lease+update"] = round(res["master lease+update"] / 2, 1)
    return res


async def datanode_round(n: int, base: Path) -> dict[str, float]:
    from squall.datanode.config import DataNodeSettings
    from squall.datanode.http.app import create_datanode_app

    app = create_datanode_app(DataNodeSettings(data_dir=str(base / "d"),
                                               advertise_url="http://127.0.0.1:1",
                                               cluster_key=CLUSTER_KEY,
                                               auth_keys=AUTH_KEYS.verifier()), background=False)
    res: dict[str, float] = {}
    data = os.urandom(1024)
    exp = time.time() + 3600
    async with app.router.lifespan_context(app):
        def bearer(op: str, ids: list[str]) -> dict[str, str]:
            return {"authorization": "Bearer " + tokens.sign(CLUSTER_KEY, op, ids, exp)}

        async def put(i: int) -> None:
            bid = f"b{i}"
            st, b = await call(app, "PUT", f"/v1/blobs/{bid}", data,
                               {**bearer("write", [bid]),
                                "content-type": "application/octet-stream"})
            assert st == 200, b

        async def get(i: int) -> None:
            bid = f"b{i}"
            st, b = await call(app, "GET", f"/v1/blobs/{bid}", b"", bearer("read", [bid]))
            assert st == 200 and len(b) == len(data), b

        ids = [f"b{i}" for i in range(100)]
        batch = orjson.dumps({"blob_ids": ids})

        async def batch_get(i: int) -> None:
            st, b = await call(app, "POST", "/v1/blobs:batch-get", batch,
                               {**bearer("read", ids), "content-type": "application/json"})
            assert st == 200, b

        await timed("datanode PUT 1 KiB", n, put, res)
        await timed("datanode GET 1 KiB", n, get, res)
        await timed("datanode batch-get 100", max(1, n // 10), batch_get, res)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="requests per route and round")
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    os.environ["SQUALL_AUTH_KEY"] = AUTH_KEY.decode()
    for _ in range(a.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            res = asyncio.run(master_round(a.n, Path(tmp)))
            res.update(asyncio.run(datanode_round(a.n, Path(tmp))))
        print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
