"""A FastAPI app whose hot routes skip the framework's own layers.

Both servers answer their hot requests (a worker's lease and update, a producer's enqueue,
a data node's blob reads and writes, the node-to-master commit) in a thin ASGI layer,
``FastPath``, placed under the app's own middleware (the credential check, request
metrics, the body limit). Those requests still went through Starlette's and FastAPI's
layers first: the app call, the error-page middleware, FastAPI's exception telemetry and
body-limit wrappers. On this project's 2-core machine that was ~50-80 µs of CPU per
request on a master that spends ~400 µs on a whole small request.

:class:`LayeredApp` serves a request for which ``hot(scope)`` holds through the *same*
layers (each added with :meth:`LayeredApp.layer` is built twice: as the app's middleware,
and around the hot path), straight into the hot path; everything else, and every other
ASGI event (lifespan), takes FastAPI's full stack. An exception the hot path does not
turn into an answer reaches uvicorn, which answers 500 and logs it, as Starlette's error
middleware would.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send


async def _unreachable(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError(f"the hot path declined {scope['method']} {scope['path']} although "
                       "its predicate accepted it")


class LayeredApp(FastAPI):
    _hot: Callable[[Scope], bool] | None = None
    _chain: ASGIApp = _unreachable

    def hot_path(self, fast: Any, hot: Callable[[Scope], bool]) -> None:
        """The innermost layer: `fast(app)` serves what `hot(scope)` accepts (and passes
        anything else on, as an ordinary middleware)."""
        self.add_middleware(fast)
        self._chain, self._hot = fast(_unreachable), hot

    def layer(self, cls: Any, **options: Any) -> None:
        """Add a middleware around what was added before (the last added is outermost)."""
        self.add_middleware(cls, **options)
        self._chain = cls(self._chain, **options)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = self._hot
        if hot is not None and scope["type"] == "http" and hot(scope):
            scope["app"] = self  # what Starlette sets; the layers find their state there
            await self._chain(scope, receive, send)
            return
        await super().__call__(scope, receive, send)
