"""Serving with uvicorn, hardened against slow clients: a deadline on request headers.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but waits forever for
a request's headers to finish, so a few hundred half-sent requests hold as many
connections open (slowloris). :class:`HeaderDeadline` closes a connection whose headers do
not complete within ``header_timeout_s`` of its first byte (or of the connection). Bodies
have their own deadline in :mod:`squall.common.guard`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT_S = float(os.environ.get("SQUALL_HEADER_TIMEOUT_S", "10"))


class HeaderDeadline(HttpToolsProtocol):
    header_timeout_s = HEADER_TIMEOUT_S
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._header_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def uvicorn_options(tls_kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `uvicorn.run` / `uvicorn.Config` options both servers use."""
    return {"loop": "uvloop", "http": HeaderDeadline, "access_log": False,
            "log_level": "warning", "lifespan": "on", "timeout_keep_alive": 5,
            **(tls_kwargs or {})}
