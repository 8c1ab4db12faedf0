"""`create_master_app(settings)`: the master's FastAPI app. Nothing is built at import time."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from squall.common.clock import Clock
from squall.common.security.access import RuleTable
from squall.common.server.docs import install_docs
from squall.common.server.guard import Access, Guard, default_hosts
from squall.common.server.layered import LayeredApp
from squall.common.server.metrics import Exposition, HttpMetrics, HttpStats
from squall.master.cluster.peek import Peek
from squall.master.http.answers import BodyLimit, install_error_handlers
from squall.master.http.deps import RESOLVERS
from squall.master.http.metrics import MasterMetrics, WalTimes
from squall.master.http.routes import status
from squall.master.http.standby import StandbyGate
from squall.master.http.table import ROUTES
from squall.master.security import CredentialStore, SecuritySettings
from squall.master.service import Master, MasterSettings
from squall.master.sqskeys import SqsKeys
from squall.master.telemetry import Telemetry


def create_master_app(settings: MasterSettings, clock: Clock | None = None,
                      background: bool = True, security: SecuritySettings | None = None,
                      fast_dispatch: bool | None = None) -> FastAPI:
    """The master app. `background=False` leaves the sweeper and checkpoints to the caller
    (tests drive them on an injected clock). `security`: auth keys, allowed hosts and
    public routes (default: keys from the environment, else kept in the data folder).
    `fast_dispatch=False` serves the hot routes through FastAPI's stack too (tests;
    default: ``SQUALL_FAST_DISPATCH``, on)."""
    security = security or SecuritySettings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        master = Master(settings, clock)
        app.state.master = master
        ha = None
        if settings.master_set is not None:  # a member of a master set (master/ha/)
            from squall.master.ha.role import MasterSet

            ha = master.ha = MasterSet(master, settings.master_set, master.key)
        wal_times = WalTimes()
        master.wal.on_write = wal_times
        telemetry = Telemetry(master)
        app.state.telemetry = telemetry
        app.state.metrics = Exposition(MasterMetrics(master, telemetry, http, wal_times).collect)
        app.state.credentials = CredentialStore.open(settings.data_dir)
        app.state.credentials.master = master  # revocations are logged
        app.state.peek = Peek()  # the task drawer's payload preview
        signer = access.keys.signer if access.keys is not None else None
        app.state.sqs_keys = SqsKeys.open(  # on a master set: derived from the auth key
            settings.data_dir, master=master,
            shared=(signer.private_bytes_raw() if settings.master_set is not None
                    and signer is not None else None))
        access.cluster_key, access.now = master.key, master.clock.now
        access.revoked = app.state.credentials.is_revoked
        if ha is not None:
            ha.start()  # the role loop starts the background work once it leads
            if background:
                telemetry.start()
        elif background:
            master.start()
            telemetry.start()
        else:
            telemetry.scan_all()
        try:
            yield
        finally:
            app.state.peek.close()
            await telemetry.stop()
            if ha is not None:
                await ha.close()
            await master.stop()
            master.close()

    app = LayeredApp(title="squall master", version="1", lifespan=lifespan, docs_url=None,
                  redoc_url=None,
                  description="Metadata, leases and placement of squall, a durable priority "
                  "task queue. Errors are `{\"error\": {\"code\", \"message\"}}`.")
    access = Access(RuleTable(ROUTES.rules(), security.public),
                    security.resolve_keys(settings.data_dir),
                    allowed_hosts=default_hosts(*security.allowed_hosts),
                    body_timeout_s=security.body_timeout_s)
    app.state.access = access
    install_error_handlers(app)
    ROUTES.install(app)
    install_docs(app)
    app.mount("/static/dashboard", status.DashboardFiles(directory=status.STATIC),
              name="dashboard")
    ROUTES.check(app)
    # the hot routes go through the layers below straight into their handlers
    # (common/server/layered.py); inside BodyLimit: the last added is outermost
    app.dispatch(ROUTES, RESOLVERS, fast_dispatch)
    app.layer(BodyLimit, max_bytes=settings.max_body_bytes)
    http = HttpStats()
    app.layer(HttpMetrics, stats=http, fallbacks=ROUTES.metric_labels())
    if settings.master_set is not None:  # a single master pays nothing for it
        app.layer(StandbyGate)
    # outermost: nothing is read (or counted: no metric series for strangers' methods and
    # paths) before the credential is checked
    app.layer(Guard)
    return app
