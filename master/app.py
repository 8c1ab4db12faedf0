"""`create_master_app(settings)`: the master's FastAPI app. Nothing is built at import time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from squall.common.clock import Clock
from squall.master.fastpath import FastPath
from squall.master.http import BodyLimit, install_error_handlers
from squall.master.routes import config, frontdoor, health, nodes, queues, status, tasks
from squall.master.service import Master, MasterSettings


def create_master_app(settings: MasterSettings, clock: Clock | None = None,
                      background: bool = True) -> FastAPI:
    """The master app. `background=False` leaves the sweeper and checkpoints to the caller
    (tests drive them on an injected clock)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        master = Master(settings, clock)
        app.state.master = master
        if background:
            master.start()
        try:
            yield
        finally:
            await master.stop()
            master.close()

    app = FastAPI(title="squall master", version="1", lifespan=lifespan,
                  description="Metadata, leases and placement of squall, a durable priority "
                  "task queue. Errors are `{\"error\": {\"code\", \"message\"}}`.")
    install_error_handlers(app)
    app.include_router(tasks.router)
    app.include_router(queues.router)
    app.include_router(config.router)
    app.include_router(nodes.router)
    app.include_router(frontdoor.router)
    app.include_router(health.router)
    app.include_router(status.router)
    app.add_middleware(FastPath)  # inside BodyLimit: the last added is the outermost
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    return app
