"""The front door of the master and of every data node: an ASGI layer, outermost, that
decides from the request line and headers alone, before a byte of the body is read:

1. Host must be an allowed name (DNS rebinding), Origin too when a browser sends one;
2. the route's rule (``access.py``) gives the roles it needs;
3. a body's Content-Type must fit the route (JSON routes: ``application/json``; nothing
   takes ``text/plain`` or form types, which a web page can send without a preflight): 415;
4. the bearer credential (``auth.py``) must be valid (401) and have a role and groups the
   rule allows (403).

The verified credential is left in ``scope["squall.principal"]`` for routes that refine the
check from the body (``update`` and the heartbeat). Bodies are then read under a deadline
(``body_timeout_s`` between two chunks): a client trickling a body gets 408.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from squall.common.errors import (
    Forbidden,
    RequestTimeout,
    StatusError,
    Unauthorized,
    UnsupportedMediaType,
)
from squall.common.security import auth, tokens
from squall.common.security.access import Rule, RuleTable
from squall.common.server.http import error_response

PRINCIPAL = "squall.principal"
VERIFIED_MAX = 10_000  # credentials remembered as verified (then the memory starts over)
_SIMPLE = ("text/", "application/x-www-form-urlencoded", "multipart/form-data")
_BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")


@dataclass
class Access:
    """What the guard needs to know; one per app (``app.state.access``)."""

    table: RuleTable
    keys: auth.AuthKeys | None  # verifies credentials; None: no credential can be checked
    cluster_key: bytes | None = None  # verifies data nodes' heartbeat tokens
    allowed_hosts: frozenset[str] | None = None  # None: any Host (--allowed-hosts '*')
    now: Callable[[], float] = time.time
    revoked: Callable[[str], bool] = lambda _id: False
    body_timeout_s: float = 30.0
    _verified: dict[str, auth.Credential] = field(default_factory=dict)

    def credential(self, header: str | None) -> auth.Credential:
        """The claims of the request's credential, or Unauthorized. Verified credentials are
        remembered (their claims are fixed by their text), so a client's every request
        costs a lookup, plus the expiry and revocation checks."""
        if self.keys is None:
            raise Unauthorized("this server has no auth key (a data node: "
                               "--auth-public-key-file); it cannot check credentials")
        tok = tokens.bearer(header)
        now = self.now()
        c = self._verified.get(tok)
        if c is None:
            c = auth.verify(self.keys, tok, now, self.revoked)
            if len(self._verified) >= VERIFIED_MAX:
                self._verified.clear()
            self._verified[tok] = c
        elif now >= c.expires_at:
            raise Unauthorized(f"credential expired {now - c.expires_at:.0f}s ago; mint a "
                               "new one")
        elif self.revoked(c.id):
            raise Unauthorized(f"credential {c.id} was revoked")
        return c


def default_hosts(*extra: str) -> frozenset[str] | None:
    """Loopback names plus `extra` (host names or URLs); None if any is ``*``."""
    names = set(auth.LOOPBACK_NAMES)
    for e in extra:
        for h in (x.strip() for x in e.split(",")):
            if h == "*":
                return None
            if h:
                names.add(_hostname(h if "//" in h else "//" + h))
    names.discard("")
    return frozenset(names)


def _hostname(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").lower()
    except ValueError:
        return ""


class Guard:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        access: Access = scope["app"].state.access
        try:
            self.check(access, scope)
        except StatusError as e:
            await error_response(e)(scope, receive, send)
            return
        started = False

        async def sending(msg: Message) -> None:
            nonlocal started
            started = True
            await send(msg)

        try:
            await self.app(scope, _deadline(receive, access.body_timeout_s), sending)
        except _Slow as e:
            if started:
                raise
            await error_response(RequestTimeout(str(e.detail)))(scope, receive, send)

    @staticmethod
    def check(access: Access, scope: Scope) -> None:
        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers", ()):
            headers.setdefault(k, v)
        allowed = access.allowed_hosts
        host = headers.get(b"host", b"").decode("latin-1")
        if allowed is not None and _hostname("//" + host) not in allowed:
            raise Forbidden(f"Host {host[:100]!r} is not an allowed name of this server "
                            "(--allowed-hosts)")
        origin = headers.get(b"origin")
        if origin is not None and allowed is not None:
            o = origin.decode("latin-1")
            if _hostname(o) not in allowed:
                raise Forbidden(f"Origin {o[:100]!r} is not allowed (--allowed-hosts)")
        method = scope["method"]
        rule, params = access.table.match(method, scope["path"])
        _check_body_type(rule, method, headers)
        if rule.public or "sigv4" in rule.roles:  # SigV4: the SQS route checks it itself
            return
        authz = headers.get(b"authorization")
        header = authz.decode("latin-1") if authz is not None else None
        if "payload" in rule.roles:
            # the route checks the scope; a missing, forged or expired token stops here,
            # before a byte of the body is read (a batch-get's body may carry more tokens)
            if access.cluster_key is None:
                raise Unauthorized("no cluster key to check payload tokens")
            tokens.decode(access.cluster_key, tokens.bearer(header), access.now())
            return
        if (rule.roles == {"node"} or "member" in rule.roles) and header and \
                header.partition(" ")[2].startswith(tokens.TOKEN_PREFIX):
            if access.cluster_key is None:
                raise Unauthorized("no cluster key to check node tokens")
            claims = tokens.decode(access.cluster_key, tokens.bearer(header), access.now())
            want = "journal" if "member" in rule.roles else "heartbeat"
            if claims.op != want:
                raise Forbidden(f"a {claims.op!r} token is not a "
                                f"{'member' if want == 'journal' else 'node'} credential")
            scope[PRINCIPAL] = claims
            return
        cred = access.credential(header)
        if "member" in rule.roles:  # a master set's journal calls: the cluster key's token only
            raise Forbidden("this route is for the members of a master set (a token signed "
                            "with the cluster key); no credential opens it")
        _allow(rule, cred, params, scope)
        scope[PRINCIPAL] = cred


def _allow(rule: Rule, cred: auth.Credential, params: dict[str, str], scope: Scope) -> None:
    if rule.roles == {"node"}:
        if "node" not in cred.roles:
            raise Forbidden("this route is for data nodes; the credential has no node role")
        return
    if rule.groups == "node" and "node" in cred.roles and "node" in rule.roles:
        if cred.node != params.get("node_id"):
            raise Forbidden(f"this node credential speaks for {cred.node!r}, not "
                            f"{params.get('node_id', '')[:130]!r}")
        return
    if not (cred.roles & rule.roles or "admin" in cred.roles):
        raise Forbidden(f"the credential's roles {sorted(cred.roles)} do not allow this; it "
                        f"needs one of {sorted(rule.roles | {'admin'})}")
    if cred.groups is None:
        return
    if rule.groups == "path":
        group = params.get("group", "")
    elif rule.groups == "query":
        qs = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        group = (qs.get("group") or [""])[0]
        if not group:
            raise Forbidden("a credential limited to groups must name one: ?group=")
    elif rule.groups in ("all", "node"):
        raise Forbidden("a credential limited to groups cannot see cluster-wide data")
    else:
        return
    if not cred.may_group(group):
        raise Forbidden(f"the credential is not for group {group[:130]!r}")


def _check_body_type(rule: Rule, method: str, headers: dict[bytes, bytes]) -> None:
    if method not in _BODY_METHODS:
        return
    ctype = headers.get(b"content-type", b"").decode("latin-1").split(";")[0].strip().lower()
    length = headers.get(b"content-length")
    has_body = bool(ctype) or b"transfer-encoding" in headers or (
        length is not None and length.strip() not in (b"", b"0"))
    if not has_body:
        return
    if rule.body == "json" and ctype != "application/json":
        raise UnsupportedMediaType(
            f"this route takes Content-Type: application/json, not {ctype or 'none'!r}")
    if ctype.startswith(_SIMPLE):
        raise UnsupportedMediaType(f"Content-Type {ctype!r} is not accepted here")


def _deadline(receive: Receive, timeout_s: float) -> Receive:
    """`receive` with a deadline per body chunk, until the body's end (later receives wait
    for a disconnect, which may take as long as the answer does)."""
    done = False

    async def limited() -> Message:
        nonlocal done
        if done:
            return await receive()
        try:
            async with asyncio.timeout(timeout_s):
                msg = await receive()
        except TimeoutError:
            raise _Slow(408, f"request body not received within {timeout_s}s between "
                        "chunks") from None
        if msg["type"] != "http.request" or not msg.get("more_body"):
            done = True
        return msg

    return limited


class _Slow(StarletteHTTPException):
    """A body read past its deadline. An HTTPException, so FastAPI's body parsing re-raises
    it (see ``http._TooLarge``); the guard or the HTTP error handler answers 408."""
