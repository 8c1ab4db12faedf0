"""HTTP plumbing shared by the master's and the data node's apps: fast JSON answers, the one
mapping of :mod:`squall.common.errors` to responses, and a request-body limit.

Every error answer is ``{"error": {"code", "message", "details"?}}`` with the status of the
error class (see ``errors.py``); validation errors become 400 ``bad_request``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from squall.common.errors import BadRequest, PayloadTooLarge, StatusError

# Turns a request's validation errors into a more specific error than 400, or None.
ValidationRefiner = Callable[[list[Any], list[dict[str, Any]]], StatusError | None]
M = TypeVar("M", bound=BaseModel)


class JSON(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def error_response(err: StatusError) -> JSON:
    headers = {"Retry-After": str(int(err.retry_after))} if err.retry_after else None
    return JSON(err.to_body(), status_code=err.status, headers=headers)


def describe_validation(errors: list[Any]) -> str:
    parts = []
    for e in errors[:5]:
        if e.get("type") == "json_invalid":  # FastAPI's: the location is a character offset
            why = (e.get("ctx") or {}).get("error")
            parts.append(f"body: {e.get('msg', 'invalid JSON')}" + (f" ({why})" if why else ""))
            continue
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {e.get('msg', 'invalid')}")
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


def validation_error(errors: list[Any], refine: ValidationRefiner | None = None
                     ) -> StatusError:
    """The error to answer for pydantic validation `errors` (locations start with "body"
    or "path" as in FastAPI's)."""
    details = [{"loc": [str(x) for x in e.get("loc", ())], "msg": e.get("msg")}
               for e in errors[:20]]
    special = refine(errors, details) if refine else None
    if special is not None:
        return special
    return BadRequest(f"invalid request: {describe_validation(errors)}", details)


def parse_body(model: type[M], body: bytes) -> M:
    """A JSON request body as `model`, for the fast dispatcher (pydantic's own JSON parser).
    A body that does not fit raises ValidationError (see :func:`body_errors`). A body that
    is not JSON to pydantic's strict parser is parsed as FastAPI parses it (``json.loads``,
    then the model), with FastAPI's errors, so both dispatch paths answer alike: a lone
    surrogate escape is accepted; not JSON: RequestValidationError (``json_invalid``); not
    text or nested too deeply: HTTPException 400 caused by the parser's error."""
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        if not any(x["type"] == "json_invalid" for x in e.errors()):
            raise
    try:
        data = json.loads(body)
    except json.JSONDecodeError as e:
        raise RequestValidationError([{"type": "json_invalid", "loc": ("body", e.pos),
                                       "msg": "JSON decode error", "input": {},
                                       "ctx": {"error": e.msg}}], body=e.doc) from None
    except (ValueError, RecursionError) as e:
        raise StarletteHTTPException(400, "There was an error parsing the body") from e
    return model.model_validate(data)


def body_errors(e: ValidationError) -> list[Any]:
    """A body's validation errors located as FastAPI locates them (under "body")."""
    return [{**x, "loc": ("body", *x.get("loc", ()))} for x in e.errors(include_url=False)]


def install_error_handlers(app: FastAPI, refine: ValidationRefiner | None = None) -> None:
    """Map StatusError, validation errors and Starlette's HTTP errors to JSON error bodies.
    `refine` may turn a set of validation errors into a more specific StatusError."""

    async def on_status(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StatusError)
        return error_response(exc)

    async def on_validation(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(validation_error(list(exc.errors()), refine))

    async def on_http(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if isinstance(exc.__cause__, RecursionError):  # a body FastAPI could not parse
            return error_response(BadRequest("invalid request: JSON nested too deeply"))
        codes = {400: "bad_request", 404: "not_found", 405: "method_not_allowed",
                 408: "request_timeout", 413: "too_large"}
        body = {"error": {"code": codes.get(exc.status_code, "http_error"),
                          "message": str(exc.detail)}}
        return JSON(body, status_code=exc.status_code)

    async def on_deep(_: Request, exc: Exception) -> Response:
        return error_response(BadRequest("invalid request: JSON nested too deeply"))

    app.add_exception_handler(StatusError, on_status)
    app.add_exception_handler(RecursionError, on_deep)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)


class BodyLimit:
    """Refuse request bodies over `max_bytes` with 413, by header or while streaming.

    `skip(scope)` exempts requests that stream unbounded bodies on purpose (a data node's
    blob uploads); they bound their memory themselves."""

    def __init__(self, app: ASGIApp, max_bytes: int,
                 skip: Callable[[Scope], bool] | None = None) -> None:
        self.app, self.max_bytes, self.skip = app, max_bytes, skip

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.skip is not None and self.skip(scope)):
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
                    raise _TooLarge(413, _too_large_message(limit))
            return msg

        try:
            await self.app(scope, limited, send)
        except _TooLarge:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        err = PayloadTooLarge(_too_large_message(self.max_bytes))
        await error_response(err)(scope, receive, send)


def _too_large_message(limit: int) -> str:
    return f"request body over the {limit}-byte limit; split it into smaller batches"


class _TooLarge(StarletteHTTPException):
    """Raised by `receive` once a streamed body passes the limit. An HTTPException, because
    FastAPI re-raises those from body parsing (any other error becomes a 400 "error parsing
    the body"); the HTTP handler then answers 413 too_large."""
