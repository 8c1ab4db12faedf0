"""The etcd elector: the member whose name is the value of one etcd key, held under an etcd
lease, may try to lead.

Spec: ``etcd:<endpoint>[,<endpoint>...][/<key>][?ttl=<secs>&timeout=<secs>]``, e.g.
``etcd:http://127.0.0.1:2379/squall/leader?ttl=5`` or
``etcd:https://e0:2379,https://e1:2379/prod/squall/leader``. The key defaults to
``/squall/leader``, the TTL to 5 s (etcd's minimum is about 2 s), the request timeout to a
third of the TTL. Endpoints are tried in turn (the one that answered last first). TLS:
``https://`` endpoints are verified with ``SQUALL_TLS_CA`` (else the system's CAs), and
the member presents ``SQUALL_TLS_CERT`` / ``SQUALL_TLS_KEY`` when set (etcd's client
certificate authentication).

It speaks etcd's v3 JSON gateway (``/v3/lease/grant``, ``/v3/kv/txn``,
``/v3/lease/keepalive``, ``/v3/kv/range``, ``/v3/lease/revoke``; keys and values base64,
64-bit integers as strings) through the engine (``common/transport``), no gRPC:

- :meth:`try_acquire`, holding: keep the lease alive, then check in one transaction that
  the key is still ours (its lease is our lease). Not holding: grant a lease of ``ttl``
  seconds and, in one transaction, create the key with our name under it if it does not
  exist (``create_revision == 0``). A key that names us under a lease we lost track of
  (this process restarted) is taken over by a transaction on its ``mod_revision``.
- etcd deletes the key when its lease expires (no keepalive for ``ttl`` seconds), so a
  dead leader's hold ends by itself; :meth:`release` revokes the lease (the key goes at
  once).
- Every failure to reach etcd (or an answer that does not parse) makes ``try_acquire``
  answer False and ``holder`` None; nothing here raises for it.

The lease starts on etcd after the caller took its ``t0``, so holding until
``t0 + ttl`` by the caller's clock never outlives etcd's view (plus the caller's skew
margin). The elector does not fence: epochs at the journals do (``elector.py``).
"""

from __future__ import annotations

import base64
import logging
import ssl
from typing import Any
from urllib.parse import parse_qs, urlsplit

from squall.common.security.tls import TLSConfig
from squall.master.ha.restjson import JsonHttp, Unreachable

log = logging.getLogger("squall.master.ha.etcd")
DEFAULT_KEY = "/squall/leader"
DEFAULT_TTL = 5.0


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def _unb64(s: Any) -> str | None:
    if not isinstance(s, str):
        return None
    try:
        return base64.b64decode(s, validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        return None


def _num(v: Any) -> int:
    """etcd's JSON gateway sends int64 as strings, and leaves zero values out."""
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


class EtcdElector:
    kind = "etcd"

    def __init__(self, endpoints: list[str], key: str = DEFAULT_KEY, ttl: float = DEFAULT_TTL,
                 timeout_s: float | None = None, tls: TLSConfig | None = None) -> None:
        if not endpoints:
            raise ValueError("etcd elector: name at least one endpoint")
        if ttl < 1 or ttl != int(ttl):
            raise ValueError(f"etcd elector: ttl must be a whole number of seconds >= 1, "
                             f"not {ttl}")
        self.endpoints = list(endpoints)
        self.key = key
        self.lease_secs = float(ttl)
        ctx = (tls or TLSConfig.from_env()).client_context() if any(
            e.startswith("https://") for e in endpoints) else None
        if ctx is True:
            ctx = ssl.create_default_context()  # the system's CAs
        self.http = JsonHttp(ctx if isinstance(ctx, ssl.SSLContext) else None,
                             timeout_s or max(0.5, ttl / 3))
        self._lease: int = 0  # our lease while we believe we hold the key
        self.errors = 0
        self.last_error = ""

    @classmethod
    def from_spec(cls, rest: str) -> EtcdElector:
        """``<endpoint>[,<endpoint>...][/<key>][?ttl=N&timeout=S]`` (see the module)."""
        rest, _, query = rest.partition("?")
        q = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        unknown = set(q) - {"ttl", "timeout"}
        if unknown:
            raise ValueError(f"etcd elector: unknown option(s) {sorted(unknown)}; use ttl, "
                             "timeout")
        parts = [p.strip() for p in rest.split(",") if p.strip()]
        if not parts:
            raise ValueError("etcd elector: name an endpoint, e.g. "
                             "etcd:http://127.0.0.1:2379/squall/leader?ttl=5")
        endpoints, key = [], DEFAULT_KEY
        for i, p in enumerate(parts):
            u = urlsplit(p)
            if u.scheme not in ("http", "https") or not u.hostname:
                raise ValueError(f"etcd elector: endpoint {p!r} is not an http(s) URL")
            if u.path not in ("", "/"):
                if i != len(parts) - 1:
                    raise ValueError("etcd elector: the key goes after the last endpoint")
                key = u.path
            endpoints.append(f"{u.scheme}://{u.netloc}")
        try:
            ttl = float(q.get("ttl", DEFAULT_TTL))
            timeout = float(q["timeout"]) if "timeout" in q else None
        except ValueError as e:
            raise ValueError(f"etcd elector: ttl and timeout are numbers ({e})") from None
        return cls(endpoints, key, ttl, timeout)

    # -- the gateway -----------------------------------------------------------------------
    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """The answer of the first endpoint that gives one; Unreachable if none does, or
        if etcd answered with an error."""
        last = ""
        for _ in range(len(self.endpoints)):
            ep = self.endpoints[0]
            try:
                status, ans = await self.http.call("POST", ep + path, body)
            except Unreachable as e:
                last = str(e)
                self.endpoints.append(self.endpoints.pop(0))  # the next one first
                continue
            if status != 200 or not isinstance(ans, dict):
                raise Unreachable(f"etcd {ep}{path} answered {status}: {str(ans)[:200]}")
            return ans
        raise Unreachable(last or "no etcd endpoint")

    def _failed(self, what: str, e: Exception) -> bool:
        self.errors += 1
        self.last_error = f"{what}: {e}"
        log.warning("etcd elector: %s failed: %s", what, e)
        return False

    # -- the Elector protocol --------------------------------------------------------------
    async def try_acquire(self, me: str) -> bool:
        try:
            if self._lease and await self._renew(me):
                return True
            self._lease = 0
            return await self._acquire(me)
        except Unreachable as e:
            return self._failed("try_acquire", e)

    async def _renew(self, me: str) -> bool:
        ans = await self._post("/v3/lease/keepalive", {"ID": str(self._lease)})
        res = ans.get("result", ans)
        if not isinstance(res, dict) or _num(res.get("TTL")) <= 0:
            return False  # the lease expired: the key is gone (or someone else's)
        held = await self._post("/v3/kv/txn", {
            "compare": [{"key": _b64(self.key), "target": "LEASE", "result": "EQUAL",
                         "lease": str(self._lease)},
                        {"key": _b64(self.key), "target": "VALUE", "result": "EQUAL",
                         "value": _b64(me)}],
            "success": [], "failure": []})
        return bool(held.get("succeeded"))

    async def _acquire(self, me: str) -> bool:
        grant = await self._post("/v3/lease/grant", {"TTL": str(int(self.lease_secs))})
        lease = _num(grant.get("ID"))
        if lease <= 0:
            raise Unreachable(f"etcd granted no lease: {str(grant)[:200]}")
        put = {"requestPut": {"key": _b64(self.key), "value": _b64(me), "lease": str(lease)}}
        ans = await self._post("/v3/kv/txn", {
            "compare": [{"key": _b64(self.key), "target": "CREATE", "result": "EQUAL",
                         "create_revision": "0"}],
            "success": [put],
            "failure": [{"requestRange": {"key": _b64(self.key)}}]})
        if ans.get("succeeded"):
            self._lease = lease
            return True
        kv = _first_kv(ans)
        if kv is not None and _unb64(kv.get("value")) == me:
            # ours under a lease this process lost track of (a restart): take it over
            took = await self._post("/v3/kv/txn", {
                "compare": [{"key": _b64(self.key), "target": "MOD", "result": "EQUAL",
                             "mod_revision": str(_num(kv.get("mod_revision")))}],
                "success": [put], "failure": []})
            if took.get("succeeded"):
                self._lease = lease
                return True
        await self._revoke(lease)
        return False

    async def _revoke(self, lease: int) -> None:
        try:
            await self._post("/v3/lease/revoke", {"ID": str(lease)})
        except Unreachable as e:  # it expires by itself
            log.debug("etcd elector: revoking lease %x failed: %s", lease, e)

    async def holder(self) -> str | None:
        try:
            ans = await self._post("/v3/kv/range", {"key": _b64(self.key)})
        except Unreachable as e:
            self._failed("holder", e)
            return None
        kvs = ans.get("kvs")
        if not isinstance(kvs, list) or not kvs or not isinstance(kvs[0], dict):
            return None
        return _unb64(kvs[0].get("value"))

    async def release(self, me: str) -> None:
        lease, self._lease = self._lease, 0
        if lease:
            await self._revoke(lease)  # the key goes with its lease

    async def close(self) -> None:
        self.http.close()

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "endpoints": list(self.endpoints), "key": self.key,
                "lease_secs": self.lease_secs, "errors": self.errors}


def _first_kv(txn: dict[str, Any]) -> dict[str, Any] | None:
    for r in txn.get("responses") or ():
        rr = r.get("response_range") if isinstance(r, dict) else None
        kvs = rr.get("kvs") if isinstance(rr, dict) else None
        if isinstance(kvs, list) and kvs and isinstance(kvs[0], dict):
            return kvs[0]
    return None
