"""A server's route table, and a FastAPI app whose hot routes skip the framework's layers.

Each server declares every route once, in one :class:`RouteTable` (``master/http/table.py``,
``datanode/http/table.py``): method, path template, handler, response model, access rule,
and whether the route is hot. From that table come

- the FastAPI routes (:meth:`RouteTable.install`), hence the OpenAPI document; the request
  model and the path, query and header parameters are the handler's signature, as FastAPI
  reads it;
- the access rules the guard enforces (:meth:`RouteTable.rules`, ``common/security/access.py``);
- the request-metric labels of the routes served outside FastAPI's router (static files);
- the fast dispatcher of the hot routes (:class:`Dispatcher`).

The hot routes (a worker's lease and update, a producer's enqueue, a data node's blob reads
and writes, the node-to-master commit) are where a server spends its CPU, and Starlette's
and FastAPI's layers (the app call, the error-page middleware, exception telemetry,
dependency resolution, stdlib JSON parsing) cost about as much as the work itself for a
small request. :class:`LayeredApp` serves a request of a hot route through the *same*
middleware (each added with :meth:`LayeredApp.layer` is built twice: as the app's
middleware, and around the dispatcher) straight into the dispatcher, which calls the
route's own handler with the arguments FastAPI would pass it: the parameters validated by
FastAPI's own functions, the body by pydantic's JSON parser into the same model, and errors
answered by the app's own exception handlers (so the same wording). Everything else, and
every other ASGI event (lifespan), takes FastAPI's full stack. ``app.fast_dispatch =
False`` sends the hot routes through FastAPI too (tests run both ways). An exception no
handler turns into an answer reaches uvicorn, which answers 500 and logs it, as
Starlette's error middleware would.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast, get_origin

from fastapi import FastAPI, params
from fastapi._compat import ModelField, get_missing_field_error
from fastapi.dependencies.utils import get_validation_alias
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.convertors import StringConvertor
from starlette.datastructures import QueryParams
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from squall.common.security.access import Rule
from squall.common.server.http import body_errors, parse_body

Handler = Callable[..., Awaitable[Response]]
# what a hot handler's FastAPI dependency gives, from the request's scope (e.g. the Master)
Resolver = Callable[[Scope], Any]
HOT = "squall.hot"  # scope key: the matched hot route and its path parameters
# "0": hot routes take FastAPI's stack too, in every app this process builds (tests run a
# server process both ways); an app's own `fast_dispatch` setting wins
FAST_DISPATCH_ENV = "SQUALL_FAST_DISPATCH"


@dataclass(frozen=True, slots=True)
class Route:
    """One route of a server. `handler` None: served by the framework, not by a handler of
    ours (the API document, static files); the row gives its access rule."""

    method: str
    path: str
    handler: Handler | None
    response_model: Any
    rule: Rule
    hot: bool = False
    tag: str | None = None
    responses: Mapping[int | str, dict[str, Any]] | None = None  # None: the table's
    options: Mapping[str, Any] = field(default_factory=dict)  # more add_api_route options


def section(tag: str, *routes: Route) -> list[Route]:
    """Routes under one OpenAPI tag."""
    return [dataclasses.replace(r, tag=tag) for r in routes]


class RouteTable:
    """A server's routes, in the order the API document lists them."""

    def __init__(self, routes: Iterable[Route],
                 responses: Mapping[int | str, dict[str, Any]] | None = None) -> None:
        self.routes = list(routes)
        self.responses = dict(responses or {})
        seen: set[tuple[str, str]] = set()
        for r in self.routes:
            key = (r.method, r.path)
            if key in seen:
                raise ValueError(f"{r.method} {r.path} is declared twice")
            seen.add(key)

    def rules(self) -> dict[tuple[str, str], Rule]:
        """The access rule of each (method, path template)."""
        return {(r.method, r.path): r.rule for r in self.routes}

    def install(self, app: FastAPI) -> None:
        """Add the FastAPI route of every row that has a handler."""
        for r in self.routes:
            if r.handler is None:
                continue
            responses = self.responses if r.responses is None else r.responses
            app.add_api_route(r.path, r.handler, methods=[r.method],
                              response_model=r.response_model,
                              tags=[r.tag] if r.tag else None,
                              responses=dict(responses) or None, **r.options)

    def check(self, app: FastAPI) -> None:
        """Every route the app serves is a row of this table (and has its rule)."""
        served = set()
        for route in app.routes:
            methods = getattr(route, "methods", None) or ()
            for m in methods:
                if m != "HEAD" or isinstance(route, APIRoute):
                    served.add((m, str(getattr(route, "path", ""))))
        missing = served - set(self.rules())
        if missing:
            raise RuntimeError(f"routes outside the route table: {sorted(missing)}")

    def metric_labels(self) -> list[tuple[re.Pattern[str], str]]:
        """Labels of the framework's routes (static files) that are not FastAPI routes, which
        label themselves, by regex for the request metrics."""
        out = []
        for r in self.routes:
            if r.handler is None and "{" in r.path:
                rx, fmt, _ = compile_path(r.path)
                out.append((rx, fmt))
        return out


class _Param:
    """A path, query or header parameter of a hot route, read and validated as FastAPI's
    ``request_params_to_args`` does for a single value (its alias, default, the field's own
    validation, the same error locations), without finding out the field's kind per call."""

    def __init__(self, f: ModelField) -> None:
        info = f.field_info
        if not isinstance(info, params.Param) or get_origin(info.annotation) in (list, set,
                                                                               tuple):
            raise ValueError(f"{f.name}: the fast dispatcher reads single-valued parameters")
        self.field, self.name = f, f.name
        self.key = get_validation_alias(f)  # a header's has its underscores converted
        self.loc = (info.in_.value, self.key)
        if isinstance(info, params.Header):
            self.key = self.key.lower()  # read from a dict of the lowercase header names
        self.required = info.is_required()
        self.validate_default = bool(info.validate_default)
        # an immutable default needs no copy; a plain text value needs no validation
        self.default_copied = type(f.default) not in (type(None), str, int, float, bool)
        self.any_text = info.annotation in (str, str | None) and not info.metadata

    def read(self, values: Mapping[str, Any], kw: dict[str, Any], errors: list[Any]) -> None:
        value = values.get(self.key)
        if value is None:
            if self.required:
                errors.append(get_missing_field_error(loc=self.loc))
                return
            value = copy.deepcopy(self.field.default) if self.default_copied \
                else self.field.default
            if not self.validate_default:
                kw[self.name] = value
                return
        elif self.any_text and type(value) is str:
            kw[self.name] = value
            return
        v, errs = self.field.validate(value, kw, loc=self.loc)
        if errs:
            errors.extend(errs)
        else:
            kw[self.name] = v


class _Hot:
    """How the dispatcher calls one hot route's handler: its arguments, built as FastAPI
    builds them, from the parameters FastAPI found in its signature."""

    def __init__(self, route: APIRoute, resolvers: Mapping[Callable[..., Any], Resolver]
                 ) -> None:
        d = route.dependant
        if d.cookie_params or len(d.body_params) > 1:
            raise ValueError(f"{route.path}: the fast dispatcher takes no cookies and one body")
        self.route, self.endpoint = route, route.endpoint
        self.path_params = [_Param(f) for f in d.path_params]
        self.query = [_Param(f) for f in d.query_params]
        self.headers = [_Param(f) for f in d.header_params]
        self.body: ModelField | None = None
        if d.body_params:
            f = self.body = d.body_params[0]
            if not (isinstance(f.field_info.annotation, type)
                    and issubclass(f.field_info.annotation, BaseModel)):
                raise ValueError(f"{route.path}: a hot route's body is a pydantic model")
        self.request = d.request_param_name
        strict = route.strict_content_type
        self.strict_content_type = bool(getattr(strict, "value", strict))
        self.deps: list[tuple[str, Resolver]] = []
        for sub in d.dependencies:
            if sub.call is None or sub.call not in resolvers or sub.name is None:
                raise ValueError(f"{route.path}: no fast resolver for the dependency "
                                 f"{sub.call!r}")
            self.deps.append((sub.name, resolvers[sub.call]))

    async def __call__(self, scope: Scope, receive: Receive, params: dict[str, str]
                       ) -> Response:
        kw: dict[str, Any] = {}
        errors: list[Any] = []
        for p in self.path_params:
            p.read(params, kw, errors)
        if self.query:
            qs = scope.get("query_string", b"")
            q: Mapping[str, str] = QueryParams(qs) if qs else {}
            for p in self.query:
                p.read(q, kw, errors)
        if self.headers:  # the first of repeated headers, as Starlette's Headers.get
            h = {k.decode("latin-1"): v.decode("latin-1") for k, v in reversed(scope["headers"])}
            for p in self.headers:
                p.read(h, kw, errors)
        if errors:
            raise RequestValidationError(errors)
        if self.request is not None:
            kw[self.request] = Request(scope, receive)
        for name, resolve in self.deps:
            kw[name] = resolve(scope)
        if self.body is not None:
            raw = await _read(receive)  # BodyLimit, outside, bounds it
            kw[self.body.name] = self._body(self.body, raw, scope)
        response: Response = await self.endpoint(**kw)
        return response

    def _body(self, f: ModelField, raw: bytes, scope: Scope) -> Any:
        """The body as FastAPI reads it: none is a missing field; JSON (by Content-Type) is
        parsed, here by pydantic's own JSON parser; anything else is validated as bytes."""
        if not raw:
            raise RequestValidationError([get_missing_field_error(("body",))])
        if not self._json(scope):
            value, errors = f.validate(raw, {}, loc=("body",))
            if errors:
                raise RequestValidationError(errors)
            return value
        try:
            return parse_body(cast(type[Any], f.field_info.annotation), raw)
        except ValidationError as e:
            raise RequestValidationError(body_errors(e)) from None

    def _json(self, scope: Scope) -> bool:
        for k, v in scope["headers"]:
            if k == b"content-type":
                main, _, sub = v.decode("latin-1").split(";")[0].strip().lower().partition("/")
                return bool(main == "application" and (sub == "json" or sub.endswith("+json")))
        return not self.strict_content_type


async def _read(receive: Receive) -> bytes:
    body = b""
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk: bytes = msg.get("body", b"")
        body += chunk
        if not msg.get("more_body"):
            return body


class Dispatcher:
    """The innermost layer of the hot path: calls the matched hot route's handler and answers
    its errors with the app's exception handlers. Built from the FastAPI routes the table
    installed, so the handler, its parameters and its models are the route's own."""

    def __init__(self, app: FastAPI, table: RouteTable,
                 resolvers: Mapping[Callable[..., Any], Resolver]) -> None:
        self.app = app
        hot = {(r.method, r.path) for r in table.routes if r.hot}
        self.by_method: dict[str, list[tuple[re.Pattern[str], Any, _Hot]]] = {}
        for route in app.routes:
            if not isinstance(route, APIRoute):
                continue
            for m in route.methods or ():
                if (m, route.path) in hot:
                    hot.discard((m, route.path))
                    # text parameters (the usual) are the match's groups as they are
                    conv = None if all(isinstance(c, StringConvertor)
                                       for c in route.param_convertors.values()) \
                        else route.param_convertors
                    self.by_method.setdefault(m, []).append(
                        (route.path_regex, conv, _Hot(route, resolvers)))
        if hot:
            raise ValueError(f"hot routes without a FastAPI route: {sorted(hot)}")

    def serves(self, scope: Scope) -> bool:
        """Whether the request is a hot route's (HTTP); the match is kept in the scope."""
        for rx, conv, hot in self.by_method.get(scope["method"], ()):
            m = rx.match(scope["path"])
            if m is not None:
                params = m.groupdict() if conv is None else \
                    {k: conv[k].convert(v) for k, v in m.groupdict().items()}
                scope[HOT] = (hot, params)
                return True
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot, params = scope[HOT]
        scope["route"] = hot.route  # the request metrics' label, as FastAPI's router sets
        try:
            response = await hot(scope, receive, params)
        except Exception as e:
            handler = _handler_of(self.app, e)
            if handler is None:
                raise
            response = await handler(Request(scope, receive), e)
        await response(scope, receive, send)


def _handler_of(app: FastAPI, e: Exception) -> Callable[..., Any] | None:
    for cls in type(e).__mro__:
        h = app.exception_handlers.get(cls)
        if h is not None:
            return h
    return None


async def _unreachable(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError(f"the hot path declined {scope['method']} {scope['path']} although "
                       "its predicate accepted it")


class LayeredApp(FastAPI):
    _hot: Callable[[Scope], bool] | None = None
    _chain: ASGIApp = _unreachable
    fast_dispatch = True  # False: the hot routes take FastAPI's stack too

    def hot_path(self, fast: Any, hot: Callable[[Scope], bool]) -> None:
        """The innermost layer: `fast` (an ASGI app, or a class built around the
        unreachable app) serves what `hot(scope)` accepts."""
        self._chain, self._hot = (fast(_unreachable) if isinstance(fast, type) else fast), hot

    def dispatch(self, table: RouteTable, resolvers: Mapping[Callable[..., Any], Resolver],
                 fast: bool | None = None) -> None:
        """Serve the table's hot routes with a :class:`Dispatcher` (call after
        :meth:`RouteTable.install`, before adding the layers); `fast=False`: through
        FastAPI's stack instead (default: on unless ``SQUALL_FAST_DISPATCH=0``)."""
        d = Dispatcher(self, table, resolvers)
        self.hot_path(d, d.serves)
        self.fast_dispatch = os.environ.get(FAST_DISPATCH_ENV, "1") != "0" if fast is None \
            else fast

    def layer(self, cls: Any, **options: Any) -> None:
        """Add a middleware around what was added before (the last added is outermost)."""
        self.add_middleware(cls, **options)
        self._chain = cls(self._chain, **options)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        hot = self._hot
        if hot is not None and scope["type"] == "http" and self.fast_dispatch and hot(scope):
            scope["app"] = self  # what Starlette sets; the layers find their state there
            await self._chain(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

