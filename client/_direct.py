"""The direct path: a call that can skip httpx's request and response objects goes to the
engine (``common/transport/adapters.py``) as plain values, a :class:`Direct`.

Above the engine, httpx still cost ~300 µs of CPU per small request (URL parsing and
merging, header objects, the auth flow, the response model), more than the engine itself.
Both drivers (``_syncdriver.py``, ``_async.py``) ask :meth:`Shortcut.prepare` first; it
answers ``None`` unless everything about the call is something httpx would send
unchanged, and the call then takes httpx's path as before:

- the client uses its default transport (a custom one, e.g. a test's fault injector,
  sees every request as an ``httpx.Request``) and has no event hooks;
- the answer is read whole (not a stream), with a body of bytes or JSON (not an iterable);
  query parameters (text names and values, as a blob write's ``replicas`` and ``quorum``)
  are encoded into the target as httpx encodes them (``urlencode``: the same bytes);
- the URL is the master's path or an absolute ``http(s)`` URL whose path needs no
  percent-encoding (httpx would change nothing).

The request carries what httpx would send that matters: Host, ``Authorization`` for the
master's origin only (as :class:`~squall.client._http.MasterAuth` adds it), Content-Type
for JSON, the call's own headers, the client's timeouts. Failures are the engine's
``Broken``, which ``_http.transport_error`` translates as it translates the httpx path's
failures (a connect failure: never sent), so retries do not change. The answer is a
:class:`Plain`, which ``_http.result`` reads as it reads an ``httpx.Response``.
"""

from __future__ import annotations

import functools
import re
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import orjson

from squall.client._effects import Call
from squall.common.masters import Masters
from squall.common.transport.adapters import Direct, Plain

__all__ = ["Direct", "Plain", "Shortcut"]

Key = tuple[str, str, int]
_PLAIN = re.compile(r"[A-Za-z0-9\-._~%!$&'()*+,;=:@/?]*")  # nothing httpx would encode
_AGENT = ("User-Agent", "squall-client")
_JSON = ("Content-Type", "application/json")


class Shortcut:
    def __init__(self, http: httpx.Client | httpx.AsyncClient, token: str | None,
                 enabled: bool, masters: Masters | None = None) -> None:
        self.http, self.enabled = http, enabled
        self.masters = masters or Masters(str(http.base_url))
        self.auth = ("Authorization", f"Bearer {token}") if token else None
        self.timeout = http.timeout.as_dict()

    def prepare(self, c: Call, base: str | None = None) -> Direct | None:
        """`c` as a :class:`Direct`, a master's path going to the master at `base` (else
        the one in use)."""
        if not self.enabled or c.stream or self.http.is_closed:
            return None  # (closed: httpx's path raises its own error)
        hooks = self.http.event_hooks
        if hooks["request"] or hooks["response"]:
            return None
        headers = [("Host", ""), _AGENT]
        body: Any = c.content
        if c.json is not None:
            body = orjson.dumps(c.json)
            headers.append(_JSON)
        elif body is not None and not isinstance(body, bytes | bytearray | memoryview):
            return None  # an iterable: streamed by httpx's path
        url = c.url
        if url.startswith("/"):
            url = (base or self.masters.current) + url
        scheme, sep, rest = url.partition("://")
        netloc, slash, path = rest.partition("/")
        where = _origin(scheme, netloc) if sep else None
        if where is None:
            return None
        key, target = where, slash + path
        if c.params:
            query = _query(c.params, target)
            if query is None:
                return None
            target += query
        headers[0] = ("Host", netloc)
        if not _PLAIN.fullmatch(target) or not target.startswith("/"):
            return None
        own = c.headers
        if self.auth is not None and self.masters.has_origin(key) and not (
                own and any(k.lower() == "authorization" for k in own)):
            headers.append(self.auth)
        if own:
            headers.extend(own.items())
        timeout: dict[str, float | None] = (
            self.timeout if c.timeout is None
            else dict.fromkeys(("connect", "read", "write", "pool"), c.timeout))
        return Direct(key, c.method, target, headers, body, timeout)


def _query(params: dict[str, str], target: str) -> str | None:
    """``?`` and `params` as httpx encodes them (its ``QueryParams`` string is
    ``urlencode`` of the items); None where httpx would do more than that: a target with a
    query of its own (merged), a name or value that is not text (httpx spells booleans and
    None its own way)."""
    if "?" in target or not all(type(k) is str and type(v) is str for k, v in params.items()):
        return None
    return "?" + urlencode(params)


@functools.lru_cache(maxsize=256)
def _origin(scheme: str, netloc: str) -> Key | None:
    """(scheme, host, port) of an http(s) origin; None for anything else."""
    if scheme not in ("http", "https") or not netloc or "@" in netloc:
        return None
    try:
        u = urlsplit(f"{scheme}://{netloc}")
        host, port = u.hostname, u.port
    except ValueError:
        return None
    if not host:
        return None
    return (scheme, host, port or _default_port(scheme))


def _default_port(scheme: str) -> int:
    return 443 if scheme == "https" else 80
