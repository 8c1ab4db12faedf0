"""`create_master_app(settings)`: the master's FastAPI app. Nothing is built at import time."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from squall.common.clock import Clock
from squall.common.docs import install_docs
from squall.common.metrics import Exposition, HttpMetrics, HttpStats
from squall.master.fastpath import FastPath
from squall.master.http import BodyLimit, install_error_handlers
from squall.master.metrics import MasterMetrics, WalTimes
from squall.master.routes import (
    config,
    frontdoor,
    health,
    nodes,
    nodes_admin,
    queues,
    status,
    tasks,
)
from squall.master.service import Master, MasterSettings
from squall.master.telemetry import Telemetry

# routes served by FastPath below the router, and the static assets, for request metrics
FAST_ROUTES = [(re.compile(r"^/v1/groups/[^/]+/update$"), "/v1/groups/{group}/update"),
               (re.compile(r"^/v1/groups/[^/]+/queues/[^/]+/tasks$"),
                "/v1/groups/{group}/queues/{queue}/tasks"),
               (re.compile(r"^/v1/groups/[^/]+/queues/[^/]+/lease$"),
                "/v1/groups/{group}/queues/{queue}/lease"),
               (re.compile(r"^/static/"), "/static/{path}")]


def create_master_app(settings: MasterSettings, clock: Clock | None = None,
                      background: bool = True) -> FastAPI:
    """The master app. `background=False` leaves the sweeper and checkpoints to the caller
    (tests drive them on an injected clock)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        master = Master(settings, clock)
        app.state.master = master
        wal_times = WalTimes()
        master.wal.on_write = wal_times
        telemetry = Telemetry(master)
        app.state.telemetry = telemetry
        app.state.metrics = Exposition(MasterMetrics(master, telemetry, http, wal_times).collect)
        if background:
            master.start()
            telemetry.start()
        else:
            telemetry.scan_all()
        try:
            yield
        finally:
            await telemetry.stop()
            await master.stop()
            master.close()

    app = FastAPI(title="squall master", version="1", lifespan=lifespan, docs_url=None,
                  redoc_url=None,
                  description="Metadata, leases and placement of squall, a durable priority "
                  "task queue. Errors are `{\"error\": {\"code\", \"message\"}}`.")
    install_error_handlers(app)
    app.include_router(tasks.router)
    app.include_router(queues.router)
    app.include_router(config.router)
    app.include_router(nodes.router)
    app.include_router(nodes_admin.router)
    app.include_router(frontdoor.router)
    app.include_router(health.router)
    app.include_router(status.router)
    install_docs(app)
    app.mount("/static/dashboard", StaticFiles(directory=status.STATIC), name="dashboard")
    app.add_middleware(FastPath)  # inside BodyLimit: the last added is the outermost
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    http = HttpStats()
    app.add_middleware(HttpMetrics, stats=http, fallbacks=FAST_ROUTES)
    return app
