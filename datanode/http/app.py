"""`create_datanode_app(settings)`: a data node's FastAPI app. Nothing is built at import time."""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import Scope

from squall.common.clock import Clock
from squall.common.errors import BadRequest
from squall.common.security.access import DATANODE_RULES, RuleTable
from squall.common.security.auth import load_auth_keys
from squall.common.server.docs import install_docs
from squall.common.server.guard import Access, Guard, default_hosts
from squall.common.server.http import BodyLimit, error_response, install_error_handlers
from squall.common.server.layered import LayeredApp
from squall.common.server.metrics import HttpMetrics, HttpStats
from squall.datanode.config import DataNodeSettings
from squall.datanode.http.fastpath import FastPath
from squall.datanode.http.routes import batch, blobs, frontdoor, health, replicate
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


# routes served by FastPath below the router, for request metrics
FAST_ROUTES = [(re.compile(r"^/v1/blobs/[^/:]+$"), "/v1/blobs/{blob_id}"),
               (re.compile(r"^/v1/replicate/[^/:]+$"), "/v1/replicate/{blob_id}"),
               (re.compile(r"^/v1/replicate:batch-put$"), "/v1/replicate:batch-put"),
               (re.compile(r"^/v1/blobs:batch-get$"), "/v1/blobs:batch-get"),
               (re.compile(r"^/v1/groups/[^/]+/queues/[^/]+/tasks$"),
                "/v1/groups/{group}/queues/{queue}/tasks"),
               (re.compile(r"^/static/"), "/static/{path}")]


def create_datanode_app(settings: DataNodeSettings, clock: Clock | None = None,
                        background: bool = True) -> FastAPI:
    """The data node app. `background=False` starts no heartbeat or scrubber loop (tests
    drive them by hand through ``app.state.node``)."""

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
    access = Access(RuleTable(DATANODE_RULES, settings.public),
                    settings.auth_keys or load_auth_keys(), cluster_key=settings.cluster_key,
                    allowed_hosts=default_hosts(settings.advertise_url, *settings.allowed_hosts),
                    body_timeout_s=settings.body_timeout_s)
    app.state.access = access
    install_error_handlers(app)
    app.add_exception_handler(ClientDisconnect, _on_disconnect)
    app.include_router(blobs.router)
    app.include_router(batch.router)
    app.include_router(frontdoor.router)
    app.include_router(replicate.router)
    app.include_router(health.router)
    install_docs(app)
    # the hot routes go through the layers below straight into FastPath (common/server/layered.py)
    app.hot_path(FastPath, FastPath.serves)  # inside BodyLimit: the last added is outermost
    app.layer(BodyLimit, max_bytes=settings.max_body_bytes, skip=_streams)
    app.layer(HttpMetrics, stats=http, fallbacks=FAST_ROUTES)
    # outermost: nothing is read (or counted: no metric series for strangers' methods and
    # paths) before the credential is checked
    app.layer(Guard)
    return app
