"""The I/O boundary both drivers share: a :class:`Call` becomes httpx request arguments, an
answer (httpx's, or the engine's :class:`Plain`) becomes the call's result, and every
transport failure becomes a squall error. This is the one place they are translated (see
``common/errors.py``): the engine's ``Broken`` (the direct path; on httpx's path it is the
cause of httpx's exception) and httpx's own exceptions (a custom ``transport=``)."""

from __future__ import annotations

import functools
import os
import ssl
from collections.abc import Generator
from typing import Any

import httpx
import orjson

from squall.client._effects import Call, ConnectError, Reply
from squall.common.errors import (
    ServerError,
    SquallError,
    StatusError,
    TransportError,
    from_response,
)
from squall.common.masters import Masters, Standby, standby_error
from squall.common.security.tls import TLSConfig
from squall.common.transport.adapters import AsyncTransport, Plain, SyncTransport
from squall.common.transport.http1 import Broken

_CONNECT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.UnsupportedProtocol)


class MasterAuth(httpx.Auth):
    """Adds ``Authorization: Bearer <credential>`` to requests for the masters only (blob
    requests to data nodes carry the payload tokens the master hands out; the front door
    sets the credential itself, ``client/_frontdoor.py``). The credential is `token`, else
    ``$SQUALL_TOKEN``."""

    def __init__(self, masters: Masters | str, token: str | None) -> None:
        self.token = token or os.environ.get("SQUALL_TOKEN") or None
        self.masters = masters if isinstance(masters, Masters) else Masters(masters)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        u = request.url
        if (self.token and "authorization" not in request.headers
                and self.masters.has_origin((u.scheme, u.host, u.port or
                                             (443 if u.scheme == "https" else 80)))):
            request.headers["Authorization"] = f"Bearer {self.token}"
        yield request


_OWN_ANSWER = frozenset({"/readyz", "/healthz", "/v1/leader"})


def resend_elsewhere(masters: Masters, base: str, err: SquallError, cause: BaseException | None,
                     c: Call, hops: int) -> bool:
    """After `err` from the master at `base`, whether to resend `c` at once to
    ``masters.current`` (the leader a standby named, or the next address). Only for what
    was never applied: a standby's refusal, a connection never made; at most one round
    of the addresses per call (then the retry policy waits and resends, under its budget).
    A connection lost after sending moves the next request on (not this one: it may have
    been applied; the retry policy decides whether it may be resent)."""
    if c.url in _OWN_ANSWER:
        return False  # each member answers these itself: ask the one asked
    resendable = c.content is None or isinstance(c.content, bytes | bytearray)
    if isinstance(err, Standby):
        if masters.follow(base, err.leader) is not None:
            return resendable and hops <= len(masters)
        if masters.several:
            masters.advance(base)
            return resendable and hops < len(masters) - 1
        return False
    if isinstance(err, ConnectError):
        if not masters.several:
            return False
        masters.advance(base)
        return resendable and hops < len(masters) - 1
    if isinstance(err, TransportError) and masters.several and not timed_out(cause):
        masters.advance(base)
    return False


def timed_out(e: BaseException | None) -> bool:
    """Whether an engine or httpx failure was a timeout (a slow master, not a dead one)."""
    broken = e if isinstance(e, Broken) else getattr(e, "__cause__", None)
    if isinstance(broken, Broken):
        return bool(broken.timeout)
    return isinstance(e, httpx.TimeoutException)


def sync_transport(limits: httpx.Limits, tls: TLSConfig | None = None) -> SyncTransport:
    """The sync client's default transport: the engine's (``common/transport``), TLS as
    :func:`tls_verify`."""
    return SyncTransport(tls_verify(tls), limits.max_keepalive_connections or 100,
                         max_connections=limits.max_connections)


def async_transport(limits: httpx.Limits, tls: TLSConfig | None = None) -> AsyncTransport:
    """The async client's default transport: the engine's (``common/transport``), TLS as
    :func:`tls_verify`."""
    return AsyncTransport(tls_verify(tls), limits.max_keepalive_connections or 100,
                          max_connections=limits.max_connections)


def tls_verify(tls: TLSConfig | None = None) -> ssl.SSLContext:
    """How clients verify servers: `tls` if given, else ``SQUALL_TLS_CA`` (else the system's
    CAs), presenting ``SQUALL_TLS_CERT`` / ``SQUALL_TLS_KEY`` to servers that want mutual
    TLS. One context
    per configuration for every client of this process: httpx builds a new one per client
    otherwise, loading the CA bundle each time (~0.25 s of CPU per ``Client``, 30 s for the
    soak's 128 clients on a loaded machine)."""
    tls = tls or TLSConfig.from_env()
    return _ssl_context(tls.cert, tls.key, tls.ca)


@functools.lru_cache(maxsize=8)
def _ssl_context(cert: str | None, key: str | None, ca: str | None) -> ssl.SSLContext:
    ctx = TLSConfig(cert, key, ca).client_context()
    return ctx if isinstance(ctx, ssl.SSLContext) else httpx.create_ssl_context()


def request_args(c: Call) -> dict[str, Any]:
    headers = dict(c.headers) if c.headers else {}
    content: Any = c.content
    if c.json is not None:
        content = orjson.dumps(c.json)
        headers["Content-Type"] = "application/json"
    args: dict[str, Any] = {"method": c.method, "url": c.url, "headers": headers}
    if c.params:
        args["params"] = c.params
    if content is not None:
        args["content"] = content
    if c.timeout is not None:
        args["timeout"] = c.timeout
    return args


def where(c: Call, base: httpx.URL | str) -> str:
    return f"{base}{c.url}" if c.url.startswith("/") else c.url


def transport_error(e: Exception, c: Call, base: httpx.URL | str) -> TransportError:
    """A squall TransportError for the engine's or httpx's failure (ConnectError: the
    request was never sent)."""
    url = where(c, base)
    broken = e if isinstance(e, Broken) else e.__cause__
    if isinstance(broken, Broken):  # the engine's: what failed, in which phase
        if broken.phase == "connect":
            return ConnectError(f"cannot connect to {url}: {broken}")
        if broken.timeout:
            return TransportError(f"{c.method} {url} timed out "
                                  f"({broken.phase.capitalize()}Timeout)")
        return TransportError(f"{c.method} {url} failed: {broken}")
    if isinstance(e, (_CONNECT, httpx.InvalidURL)):  # a custom transport's, or httpx's own
        return ConnectError(f"cannot connect to {url}: {_reason(e)}")
    if isinstance(e, httpx.TimeoutException):
        return TransportError(f"{c.method} {url} timed out ({type(e).__name__})")
    return TransportError(f"{c.method} {url} failed: {_reason(e)}")


def _reason(e: Exception) -> str:
    return str(e) or type(e).__name__


def status_error(r: httpx.Response | Plain, c: Call, base: httpx.URL | str) -> StatusError:
    ra = r.headers.get("retry-after")
    retry_after = float(ra) if ra and ra.replace(".", "", 1).isdigit() else None
    try:
        body: Any = orjson.loads(r.content)
    except orjson.JSONDecodeError:
        body = None
    standby = standby_error(r.status_code, r.headers, body, retry_after)
    if standby is not None:
        return standby
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return from_response(r.status_code, body, retry_after)
    # not a squall answer: a wrong URL, a proxy, another server on that port
    text = r.text[:120].strip().replace("\n", " ")
    err = from_response(r.status_code, None, retry_after)
    err.message = (f"HTTP {r.status_code} from {c.method} {where(c, base)}, which does not "
                   f"look like a squall server: {text!r}")
    err.args = (err.message,)
    return err


_READ = httpx.ByteStream(b"")  # stands for a response's stream once its body was read


def result(c: Call, r: httpx.Response | Plain, base: httpx.URL | str) -> Any:
    # httpx's client binds the response and its stream to each other (a reference cycle):
    # the body would live until the garbage collector runs. Cut it, so the body goes as
    # soon as the caller is done with it: 4 MiB payloads then reuse the same warm memory
    # instead of faulting in fresh pages on every read (~1,000 page faults a read).
    r.stream = _READ
    if r.status_code >= 400:
        raise status_error(r, c, base)
    if c.raw:
        return Reply(r.status_code, dict(r.headers), r.content)
    if not r.content:
        return {}
    try:
        return orjson.loads(r.content)
    except orjson.JSONDecodeError:
        raise ServerError(f"{c.method} {where(c, base)} answered with something that is not "
                          f"JSON ({r.headers.get('content-type')}); is this a squall "
                          "server?") from None
