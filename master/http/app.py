"""`create_master_app(settings)`: the master's FastAPI app. Nothing is built at import time."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.staticfiles import StaticFiles

from squall.common.clock import Clock
from squall.common.security.access import MASTER_RULES, RuleTable
from squall.common.server.docs import install_docs
from squall.common.server.guard import Access, Guard, default_hosts
from squall.common.server.layered import LayeredApp
from squall.common.server.metrics import Exposition, HttpMetrics, HttpStats
from squall.master.http.answers import BodyLimit, install_error_handlers
from squall.master.http.fastpath import FastPath
from squall.master.http.metrics import MasterMetrics, WalTimes
from squall.master.http.routes import (
    config,
    frontdoor,
    health,
    nodes,
    nodes_admin,
    queues,
    status,
    tasks,
)
from squall.master.security import CredentialStore, SecuritySettings
from squall.master.security import router as auth_router
from squall.master.service import Master, MasterSettings
from squall.master.telemetry import Telemetry

# routes served by FastPath below the router, and the static assets, for request metrics
FAST_ROUTES = [(re.compile(r"^/v1/groups/[^/]+/update$"), "/v1/groups/{group}/update"),
               (re.compile(r"^/v1/groups/[^/]+/queues/[^/]+/tasks$"),
                "/v1/groups/{group}/queues/{queue}/tasks"),
               (re.compile(r"^/v1/groups/[^/]+/queues/[^/]+/lease$"),
                "/v1/groups/{group}/queues/{queue}/lease"),
               (re.compile(r"^/v1/nodes/commit$"), "/v1/nodes/commit"),
               (re.compile(r"^/v1/nodes/heartbeat$"), "/v1/nodes/heartbeat"),
               (re.compile(r"^/static/"), "/static/{path}")]


def create_master_app(settings: MasterSettings, clock: Clock | None = None,
                      background: bool = True, security: SecuritySettings | None = None
                      ) -> FastAPI:
    """The master app. `background=False` leaves the sweeper and checkpoints to the caller
    (tests drive them on an injected clock). `security`: auth keys, allowed hosts and
    public routes (default: keys from the environment, else kept in the data folder)."""
    security = security or SecuritySettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        master = Master(settings, clock)
        app.state.master = master
        wal_times = WalTimes()
        master.wal.on_write = wal_times
        telemetry = Telemetry(master)
        app.state.telemetry = telemetry
        app.state.metrics = Exposition(MasterMetrics(master, telemetry, http, wal_times).collect)
        app.state.credentials = CredentialStore.open(settings.data_dir)
        access.cluster_key, access.now = master.key, master.clock.now
        access.revoked = app.state.credentials.is_revoked
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

    app = LayeredApp(title="squall master", version="1", lifespan=lifespan, docs_url=None,
                  redoc_url=None,
                  description="Metadata, leases and placement of squall, a durable priority "
                  "task queue. Errors are `{\"error\": {\"code\", \"message\"}}`.")
    access = Access(RuleTable(MASTER_RULES, security.public),
                    security.resolve_keys(settings.data_dir),
                    allowed_hosts=default_hosts(*security.allowed_hosts),
                    body_timeout_s=security.body_timeout_s)
    app.state.access = access
    install_error_handlers(app)
    app.include_router(tasks.router)
    app.include_router(queues.router)
    app.include_router(config.router)
    app.include_router(nodes.router)
    app.include_router(nodes_admin.router)
    app.include_router(frontdoor.router)
    app.include_router(health.router)
    app.include_router(status.router)
    app.include_router(auth_router)
    install_docs(app)
    app.mount("/static/dashboard", StaticFiles(directory=status.STATIC), name="dashboard")
    # the hot routes go through the layers below straight into FastPath (common/server/layered.py)
    app.hot_path(FastPath, FastPath.serves)  # inside BodyLimit: the last added is outermost
    app.layer(BodyLimit, max_bytes=settings.max_body_bytes)
    http = HttpStats()
    app.layer(HttpMetrics, stats=http, fallbacks=FAST_ROUTES)
    # outermost: nothing is read (or counted: no metric series for strangers' methods and
    # paths) before the credential is checked
    app.layer(Guard)
    return app
