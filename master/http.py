"""HTTP plumbing shared by the master's routes: fast JSON answers, error mapping, body limit."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from squall.common.errors import BadRequest, PayloadTooLarge, StatusError

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "Bad input; the message says what is wrong"},
    404: {"description": "No such task or queue"},
    409: {"description": "Conflict, e.g. a stale lease token"},
    413: {"description": "Body, batch or pid over its limit"},
    503: {"description": "Not ready or storage failure; retry"},
}


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(err: StatusError) -> JSON:
    headers = {"Retry-After": str(int(err.retry_after))} if err.retry_after else None
    return JSON(err.to_body(), status_code=err.status, headers=headers)


def _describe(errors: list[Any]) -> str:
    parts = []
    for e in errors[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {e.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


def install_error_handlers(app: FastAPI) -> None:
    async def on_status(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StatusError)
        return error_response(exc)

    async def on_validation(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        errors = list(exc.errors())
        details = [{"loc": [str(x) for x in e.get("loc", ())], "msg": e.get("msg")}
                   for e in errors[:20]]
        return error_response(BadRequest(f"invalid request: {_describe(errors)}", details))

    async def on_http(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        codes = {404: "not_found", 405: "method_not_allowed", 413: "too_large"}
        body = {"error": {"code": codes.get(exc.status_code, "http_error"),
                          "message": str(exc.detail)}}
        return JSON(body, status_code=exc.status_code)

    app.add_exception_handler(StatusError, on_status)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)


class BodyLimit:
    """Refuse request bodies over `max_bytes` with 413, by header or while streaming."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        for k, v in scope.get("headers", ()):
            if k == b"content-length":
                if not v.isdigit() or int(v) > limit:
                    await self._refuse(scope, receive, send)
                    return
                break
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > limit:
                    raise _TooLarge
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        err = PayloadTooLarge(f"request body over the {self.max_bytes}-byte limit; "
                              "split it into smaller batches")
        await error_response(err)(scope, receive, send)


class _TooLarge(Exception):
    pass
