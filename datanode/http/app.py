"""`create_datanode_app(settings)`: a data node's FastAPI app. Nothing is built at import time."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from squall.common.clock import Clock
from squall.common.errors import BadRequest
from squall.common.security.access import RuleTable
from squall.common.security.auth import load_public_keys
from squall.common.server.docs import install_docs
from squall.common.server.guard import Access, Guard, default_hosts
from squall.common.server.http import BodyLimit, error_response, install_error_handlers
from squall.common.server.layered import LayeredApp
from squall.common.server.metrics import HttpMetrics, HttpStats
from squall.common.wire.cluster import REPAIR_HEADER
from squall.datanode.config import DataNodeSettings
from squall.datanode.http.deps import RESOLVERS
from squall.datanode.http.table import ROUTES
from squall.datanode.service import DataNode

log = logging.getLogger("squall.datanode")


def _streams(scope: Scope) -> bool:
    """Blob PUTs stream bodies of any size (the store bounds memory), so the body limit
    applies only to the batch and JSON endpoints."""
    return bool(scope.get("method") == "PUT")


async def _on_disconnect(request: Request, _: Exception) -> Response:
    """A client gone mid-upload: the upload was aborted (nothing stored); nobody reads this."""
    log.info("%s %s: client disconnected mid-body; nothing stored", request.method,
             request.url.path)
    return error_response(BadRequest("client disconnected before the end of the body"))


# client work (and peers' forwards of it): while it goes on, repair copies are paced
_CLIENT_WORK = ("/v1/blobs", "/v1/groups/", "/v1/replicate")
_REPAIR = (REPAIR_HEADER.encode(), b"1")


class RepairPacing:
    """Tells the node's repair pacer about client work, so repair copies yield to it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(_CLIENT_WORK) \
                and _REPAIR not in scope["headers"]:
            scope["app"].state.node.repair_pacer.client_seen()
        await self.app(scope, receive, send)


def create_datanode_app(settings: DataNodeSettings, clock: Clock | None = None,
                        background: bool = True, fast_dispatch: bool | None = None) -> FastAPI:
    """The data node app. `background=False` starts no heartbeat or scrubber loop (tests
    drive them by hand through ``app.state.node``). `fast_dispatch=False` serves the hot
    routes through FastAPI's stack too (tests; default: ``SQUALL_FAST_DISPATCH``, on)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        node = DataNode(settings, clock)
        node.http_stats = http
        app.state.node = node
        access.now = node.clock.now
        access.revoked = lambda cid: cid in node.revoked
        node.start(background)
        try:
            yield
        finally:
            await node.stop()
            node.close()

    http = HttpStats()
    app = LayeredApp(title="squall data node", version="1", lifespan=lifespan, docs_url=None,
                  redoc_url=None,
                  description="Payload storage of squall: blobs in LMDB with CRC32C checks, "
                  "replicated node to node, under tokens the master signs. Errors are "
                  "`{\"error\": {\"code\", \"message\"}}`.")
    # a data node only verifies credentials: it keeps the public keys, never a private one
    keys = settings.auth_keys or load_public_keys()
    access = Access(RuleTable(ROUTES.rules(), settings.public),
                    keys.verifier() if keys is not None else None,
                    cluster_key=settings.cluster_key,
                    allowed_hosts=default_hosts(settings.advertise_url, *settings.allowed_hosts),
                    body_timeout_s=settings.body_timeout_s)
    app.state.access = access
    install_error_handlers(app)
    app.add_exception_handler(ClientDisconnect, _on_disconnect)
    ROUTES.install(app)
    install_docs(app)
    ROUTES.check(app)
    # the hot routes go through the layers below straight into their handlers
    # (common/server/layered.py); inside BodyLimit: the last added is outermost
    app.dispatch(ROUTES, RESOLVERS, fast_dispatch)
    app.layer(RepairPacing)
    app.layer(BodyLimit, max_bytes=settings.max_body_bytes, skip=_streams)
    app.layer(HttpMetrics, stats=http, fallbacks=ROUTES.metric_labels())
    # outermost: nothing is read (or counted: no metric series for strangers' methods and
    # paths) before the credential is checked
    app.layer(Guard)
    return app
