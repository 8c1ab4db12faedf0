"""HTTP plumbing of the master's routes. The generic parts (fast JSON answers, error mapping,
body limit) live in :mod:`squall.common.server.http`, shared with the data node; this module adds
what is the master's own: its OpenAPI error table and the pid-length refinement."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from squall.common.errors import PayloadTooLarge, StatusError
from squall.common.server.http import (
    JSON,
    BodyLimit,
    describe_validation,
    error_response,
)
from squall.common.server.http import install_error_handlers as _install_error_handlers
from squall.common.wire.models import ErrorResponse
from squall.common.wire.names import PID_MAX_BYTES

__all__ = ["ERROR_RESPONSES", "JSON", "BodyLimit", "error_response", "install_error_handlers"]

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"description": "Bad input; the message says what is wrong"},
    404: {"description": "No such task or queue"},
    409: {"description": "Conflict, e.g. a stale lease token"},
    413: {"description": "Body, batch or pid over its limit"},
    503: {"description": "Not ready or storage failure; retry"},
    # also keeps FastAPI from documenting a 422 the handlers never send (they answer 400)
    "default": {"description": "Any other error (405, 429, ...), same body"},
}
for _r in ERROR_RESPONSES.values():  # every error answer is {"error": {"code", "message"}}
    _r["model"] = ErrorResponse


def _pid_too_long(e: Any) -> bool:
    loc = e.get("loc", ())
    return e.get("type") == "string_too_long" and bool(loc) and loc[-1] in ("pid", "max_pid")


def _refine(errors: list[Any], details: list[dict[str, Any]]) -> StatusError | None:
    if errors and all(_pid_too_long(e) for e in errors):  # same answer as check_pid's
        return PayloadTooLarge(
            f"pid over its limit of {PID_MAX_BYTES} UTF-8 bytes: {describe_validation(errors)}",
            details)
    return None


def install_error_handlers(app: FastAPI) -> None:
    _install_error_handlers(app, _refine)
