"""The HTTP baseline for the master benchmark: the same FastAPI/uvicorn stack, no storage.

Run as ``python -m bench.bare_app --port P [--mode bare|model]``. It serves the master's
enqueue path (``POST /v1/groups/{group}/queues/{queue}/tasks``) and ``GET /readyz`` with the
master's server settings (uvloop, httptools, no access log), so the benchmark drives it with
exactly the client code it uses for the master:

- ``bare``: reads the body and answers ``{"ok":true}``: the ceiling of the HTTP stack
  (uvicorn + Starlette routing + FastAPI endpoint call) and of the client.
- ``model``: the same, plus what the master's route validates: the path patterns and the
  ``EnqueueRequest`` pydantic body. The gap between the two is validation cost; the gap
  between ``model`` and the master is the master's own work (engine, LMDB, WAL, fsync).
"""

from __future__ import annotations

import argparse
from typing import Annotated

from fastapi import FastAPI, Path, Request
from starlette.responses import Response

from squall.common.wire.models import NAME_PATTERN, EnqueueRequest

OK = b'{"ok":true}'
GroupP = Annotated[str, Path(pattern=NAME_PATTERN)]
QueueP = Annotated[str, Path(pattern=NAME_PATTERN)]


def create_app(mode: str) -> FastAPI:
    app = FastAPI(title=f"squall bench baseline ({mode})")

    @app.get("/readyz")
    async def readyz() -> Response:
        return Response(OK, media_type="application/json")

    if mode == "bare":

        @app.post("/v1/groups/{group}/queues/{queue}/tasks")
        async def bare(request: Request) -> Response:
            await request.body()
            return Response(OK, media_type="application/json")

    elif mode == "model":

        @app.post("/v1/groups/{group}/queues/{queue}/tasks")
        async def model(group: GroupP, queue: QueueP, body: EnqueueRequest) -> Response:
            return Response(OK, media_type="application/json")

    else:
        raise ValueError(f"unknown mode {mode!r}")
    return app


def main() -> None:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--mode", choices=["bare", "model"], default="bare")
    a = ap.parse_args()
    uvicorn.run(create_app(a.mode), host=a.host, port=a.port, loop="uvloop", http="httptools",
                access_log=False, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
