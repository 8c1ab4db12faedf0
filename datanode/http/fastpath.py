"""The hot blob routes served without the framework's machinery: ``PUT /v1/blobs/{id}``,
``PUT /v1/replicate/{id}``, ``GET /v1/blobs/{id}``, and the small-payload POSTs: the front
door (``/v1/groups/{g}/queues/{q}/tasks``), ``/v1/replicate:batch-put`` and
``/v1/blobs:batch-get`` (answered with a Content-Length when its blobs fit one read group,
the common case, else streamed chunked group by group, as the FastAPI route streams).

Every payload write and read goes through one of these, and FastAPI's routing, dependency
resolution (headers, query, path) and response classes cost a data node about as much CPU
as the write of a small blob itself. This thin ASGI layer (as the master's
``fastpath.py``) matches the paths, reads the same headers and query parameters with the
same checks, calls the same code (``routes/blobs.py`` helpers, ``store_and_forward``,
the store's verified stream) and maps errors the same way. The FastAPI routes stay the
documented contract (OpenAPI) and serve every other path and method, and any request this
layer does not recognise (e.g. a blob id that is not valid: FastAPI answers it).
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl

from pydantic import ValidationError
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from squall.common.checksum import CRC_HEADER, parse_crc
from squall.common.errors import BadRequest, StatusError
from squall.common.server.http import (
    JSON,
    body_errors,
    error_response,
    parse_body,
    validation_error,
)
from squall.common.wire.cluster import REPAIR_HEADER, BatchGetRequest
from squall.datanode.http.routes import frontdoor
from squall.datanode.http.routes.batch import may_read, read_frames
from squall.datanode.http.routes.blobs import (
    MAX_REPLICAS,
    StreamAborted,
    open_read,
    peers_of,
)
from squall.datanode.http.routes.replicate import replicate_frames
from squall.datanode.replication.pipeline import store_and_forward
from squall.datanode.service import DataNode

log = logging.getLogger("squall.datanode.blobs")
_ROUTE = re.compile(r"^/v1/(blobs|replicate)/([A-Za-z0-9][A-Za-z0-9_.\-]{0,127})$")
_SERVED = {("PUT", "blobs"), ("PUT", "replicate"), ("GET", "blobs")}
_POSTS = re.compile(r"^/v1/(?:groups/([^/]+)/queues/([^/]+)/tasks|replicate:batch-put"
                    r"|blobs:(batch-get))$")
_RECEIPTS = {b"": "blob", b"receipt=blob": "blob", b"receipt=batch": "batch"}
# client work (and peers' forwards of it): while it goes on, repair copies are paced
_CLIENT_WORK = ("/v1/blobs", "/v1/groups/", "/v1/replicate")
_REPAIR = (REPAIR_HEADER.encode(), b"1")


class FastPath:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    @staticmethod
    def serves(scope: Scope) -> bool:
        """Whether this layer answers the (HTTP) request itself; FastAPI answers the rest
        (odd queries included)."""
        m = _ROUTE.match(scope["path"])
        if m is not None and (scope["method"], m[1]) in _SERVED:
            return True
        p = _POSTS.match(scope["path"]) if scope["method"] == "POST" else None
        return p is not None and (p[1] is not None or p[3] is not None
                                  or scope.get("query_string", b"") in _RECEIPTS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(_CLIENT_WORK) \
                and _REPAIR not in scope["headers"]:
            scope["app"].state.node.repair_pacer.client_seen()  # repair yields to clients
        if scope["type"] != "http" or not self.serves(scope):
            await self.app(scope, receive, send)
            return
        m = _ROUTE.match(scope["path"])
        if m is None or (scope["method"], m[1]) not in _SERVED:
            p = _POSTS.match(scope["path"])
            assert p is not None
            await self._post(p, scope, receive, send)
            return
        node: DataNode = scope["app"].state.node
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            if scope["method"] == "GET":
                answer = await _get(node, m[2], headers, send)
                if answer is None:
                    return  # streamed
                resp = answer
            else:
                resp = JSON(await _put(node, m[1], m[2], headers, scope, receive))
        except StatusError as e:
            resp = error_response(e)
        except ClientDisconnect:  # the upload was aborted (nothing stored); nobody listens
            log.info("PUT %s: client disconnected mid-body; nothing stored", scope["path"])
            return
        await resp(scope, receive, send)


    @staticmethod
    async def _post(p: re.Match[str], scope: Scope, receive: Receive, send: Send) -> None:
        node: DataNode = scope["app"].state.node
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            if p[3] is not None:
                body = b"".join([b async for b in _body(receive)])  # BodyLimit bounds it
                await _batch_get(node, body, headers.get("authorization"), send)
                return
            if p[1] is not None:
                body = b"".join([b async for b in _body(receive)])  # BodyLimit bounds it
                resp = JSON(await frontdoor.serve(node, p[1], p[2], body,
                                                  headers.get("content-type", "")))
            else:
                claims = node.authorize(headers.get("authorization"), "replicate", [])
                body = b"".join([b async for b in _body(receive)])
                resp = JSON(await replicate_frames(
                    node, claims, body, _RECEIPTS[scope.get("query_string", b"")],
                    headers.get(REPAIR_HEADER) == "1"))
        except ValidationError as e:
            resp = error_response(validation_error(body_errors(e)))
        except StatusError as e:
            resp = error_response(e)
        except ClientDisconnect:
            log.info("POST %s: client disconnected mid-body; nothing done", scope["path"])
            return
        await resp(scope, receive, send)


async def _batch_get(node: DataNode, body: bytes, authorization: str | None, send: Send
                     ) -> None:
    """Answer a batch-get as the FastAPI route does (the same frames). Errors before the
    first group is read are raised (a clean error answer); a storage error after it cuts
    the connection (StreamAborted), as the route's stream would."""
    req = parse_body(BatchGetRequest, body)
    may_read(node, req, authorization)
    ids = req.blob_ids
    data, n = await node.store.run(read_frames, node, ids)
    ids = ids[n:]
    head = [(b"content-type", b"application/octet-stream")]
    if not ids:  # the common case: one group, one answer with its length
        head.append((b"content-length", str(len(data)).encode()))
    await send({"type": "http.response.start", "status": 200, "headers": head})
    while ids:
        await send({"type": "http.response.body", "body": data, "more_body": True})
        try:
            data, n = await node.store.run(read_frames, node, ids)
        except StatusError as e:  # headers are gone: the only honest answer is a cut
            log.error("aborting a batch-get mid-stream: %s", e.message)
            raise StreamAborted(f"batch-get: {e.message}") from None
        ids = ids[n:]
    await send({"type": "http.response.body", "body": data, "more_body": False})


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientDisconnect()
        body = msg.get("body", b"")
        if body:
            yield body
        if not msg.get("more_body", False):
            return


def _query(scope: Scope) -> tuple[str, int | None]:
    """`replicas` and `quorum`, checked as the FastAPI route declares them."""
    q = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1"),
                       keep_blank_values=True))
    replicas = q.get("replicas", "")
    if len(replicas) > 8192:
        raise BadRequest("invalid request: replicas: String should have at most 8192 "
                         "characters")
    quorum = q.get("quorum")
    if quorum is None:
        return replicas, None
    if not quorum.strip().isdigit() or not 1 <= int(quorum) <= MAX_REPLICAS:
        raise BadRequest(f"invalid request: quorum: should be an integer from 1 to "
                         f"{MAX_REPLICAS}")
    return replicas, int(quorum)


async def _put(node: DataNode, kind: str, blob_id: str, headers: dict[str, str],
               scope: Scope, receive: Receive) -> dict[str, Any]:
    auth = headers.get("authorization")
    if kind == "blobs":
        replicas, quorum = _query(scope)
        claims = node.authorize(auth, "write", blob_id)
        peers, q = peers_of(node, claims, replicas, quorum)
    else:  # node to node: never forwards
        node.authorize(auth, "replicate", blob_id)
        peers, q = [], 1
    declared = parse_crc(headers.get(CRC_HEADER))
    length: int | None = None
    if "content-length" in headers:
        text = headers["content-length"].strip()
        if not text.isdigit():
            raise BadRequest("invalid request: Content-Length: should be a non-negative "
                             "integer")
        length = int(text)
        await node.store.run(node.store.check_space, length)
    res = await store_and_forward(node, blob_id, _body(receive), peers, q, declared, length,
                                  background=kind != "blobs"
                                  and headers.get(REPAIR_HEADER) == "1")
    return res.model_dump()


async def _get(node: DataNode, blob_id: str, headers: dict[str, str], send: Send
               ) -> JSON | None:
    """Send the blob's bytes as the FastAPI route does (200 / 206, the same headers), or
    return the answer to send instead (416). Errors before the first byte are raised (a
    clean error answer), after it the connection is cut (StreamAborted)."""
    opened = await open_read(node, blob_id, headers.get("authorization"), headers.get("range"))
    if isinstance(opened, JSON):
        return opened
    status, out, stream, part = opened
    out["Content-Type"] = "application/octet-stream"
    await send({"type": "http.response.start", "status": status,
                "headers": [(k.lower().encode("latin-1"), v.encode("latin-1"))
                            for k, v in out.items()]})
    try:
        async for nxt in stream:
            await send({"type": "http.response.body", "body": part, "more_body": True})
            part = nxt
    except StatusError as e:  # headers are gone: the only honest answer is a cut
        log.error("aborting the download of %s mid-stream: %s", blob_id, e.message)
        raise StreamAborted(f"{blob_id}: {e.message}") from None
    await send({"type": "http.response.body", "body": part or b"", "more_body": False})
    return None
