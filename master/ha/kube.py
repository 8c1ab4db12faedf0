"""The Kubernetes elector: the holder of a ``coordination.k8s.io/v1`` Lease may try to lead,
decided as client-go's leader election does with its ``leaselock``.

Spec: ``kubernetes:[<namespace>/]<name>[?lease=<secs>&api=<url>&token_file=<path>&
ca_file=<path>&timeout=<secs>]``, e.g. ``kubernetes:squall/squall-master?lease=10``. In a
pod the defaults are the service account's: the API server at
``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``, the token
``/var/run/secrets/kubernetes.io/serviceaccount/token`` (read again every minute: bound
tokens rotate), its CA ``.../ca.crt`` and, without a namespace in the spec, the pod's own
(``.../namespace``). ``lease`` (``leaseDurationSeconds``, whole seconds, default 10);
``timeout``: each request's (default a third of the lease). The member's name
(``holderIdentity``) is its advertised URL. RBAC: ``get``, ``create`` and ``update`` on
``leases`` in that namespace (deploy/k8s/base/master-rbac.yaml).

:meth:`try_acquire` (client-go's ``tryAcquireOrRenew``):

1. ``GET .../namespaces/<ns>/leases/<name>``; on 404, ``POST`` a Lease naming this member
   (``acquireTime`` = ``renewTime`` = now, ``leaseTransitions`` 0): 201 means it holds,
   409 (AlreadyExists: another member created it first) means it does not.
2. Held by another member (a non-empty ``holderIdentity``) whose record this member saw
   change less than ``leaseDurationSeconds`` ago **by its own monotonic clock** (never by
   the record's timestamps: clocks differ between machines): False.
3. Otherwise ``PUT`` the Lease with the ``resourceVersion`` just read: this member as the
   holder, ``renewTime`` now; ``acquireTime`` now and ``leaseTransitions`` + 1 when the
   holder changes. 200 means it holds; 409 (Conflict: the object changed since it was
   read, someone else wrote first) means it does not.

:meth:`release` writes an empty holder (``leaseDurationSeconds`` 1) if this member holds
it, so another takes over at once. Every failure to reach the API server, and every
answer other than those above (401, 403, 5xx, a Status object), makes ``try_acquire``
False and ``holder`` None, with the Status's message kept in ``last_error``; nothing here
raises for it. Safety does not depend on this elector: epochs at the journals fence.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs, quote

from squall.master.ha.restjson import JsonHttp, Unreachable

log = logging.getLogger("squall.master.ha.kube")
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
GROUP = "/apis/coordination.k8s.io/v1"
DEFAULT_LEASE = 10
TOKEN_REREAD_S = 60.0


def micro_time(t: float | None = None) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.fromtimestamp(time.time() if t is None else t, UTC).strftime(
        "%Y-%m-%dT%H:%M:%S.%fZ")


class KubeLeaseElector:
    kind = "kubernetes"

    def __init__(self, namespace: str, name: str, lease_secs: int = DEFAULT_LEASE,
                 api: str | None = None, token_file: str | None = None,
                 ca_file: str | None = None, timeout_s: float | None = None) -> None:
        if not namespace or not name:
            raise ValueError("kubernetes elector: name the Lease, e.g. "
                             "kubernetes:squall/squall-master?lease=10")
        if lease_secs < 1:
            raise ValueError("kubernetes elector: lease must be at least 1 second")
        self.namespace, self.name = namespace, name
        self.lease_secs = float(lease_secs)
        if api is None:
            host = os.environ.get("KUBERNETES_SERVICE_HOST")
            port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
            if not host:
                raise ValueError("kubernetes elector: not in a pod (no KUBERNETES_SERVICE_HOST)"
                                 "; give the API server as ?api=https://...")
            api = f"https://{'[' + host + ']' if ':' in host else host}:{port}"
        self.api = api.rstrip("/")
        self.token_file = token_file if token_file is not None else f"{SA_DIR}/token"
        ctx: ssl.SSLContext | None = None
        if self.api.startswith("https://"):
            ca = ca_file if ca_file is not None else f"{SA_DIR}/ca.crt"
            ctx = ssl.create_default_context(cafile=ca if os.path.exists(ca) else None)
        self.http = JsonHttp(ctx, timeout_s or max(0.5, lease_secs / 3))
        self.path = (f"{GROUP}/namespaces/{quote(namespace, safe='')}/leases/"
                     f"{quote(name, safe='')}")
        self._token: tuple[float, str | None] = (-1e18, None)
        # client-go's observedRecord / observedTime: the record last seen, and when (ours)
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self.errors = 0
        self.last_error = ""

    @classmethod
    def from_spec(cls, rest: str) -> KubeLeaseElector:
        """``[<namespace>/]<name>[?lease=N&api=URL&token_file=P&ca_file=P&timeout=S]``."""
        rest, _, query = rest.partition("?")
        q = {k: v[-1] for k, v in parse_qs(query, keep_blank_values=True).items()}
        unknown = set(q) - {"lease", "api", "token_file", "ca_file", "timeout"}
        if unknown:
            raise ValueError(f"kubernetes elector: unknown option(s) {sorted(unknown)}; use "
                             "lease, api, token_file, ca_file, timeout")
        ns, sep, name = rest.strip().rpartition("/")
        if not sep:
            try:
                with open(f"{SA_DIR}/namespace") as f:
                    ns = f.read().strip()
            except OSError:
                ns = ""
            if not ns:
                raise ValueError("kubernetes elector: give the namespace "
                                 "(kubernetes:<namespace>/<name>): not in a pod")
        try:
            lease = int(q.get("lease", DEFAULT_LEASE))
            timeout = float(q["timeout"]) if "timeout" in q else None
        except ValueError:
            raise ValueError("kubernetes elector: lease is whole seconds, timeout a "
                             "number") from None
        return cls(ns, name, lease, q.get("api"), q.get("token_file"), q.get("ca_file"),
                   timeout)

    # -- the API server --------------------------------------------------------------------
    def _auth(self) -> dict[str, str]:
        at, token = self._token
        now = time.monotonic()
        if now - at > TOKEN_REREAD_S:
            try:
                with open(self.token_file) as f:
                    token = f.read().strip() or None
            except OSError:
                token = None
            self._token = (now, token)
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return await self.http.call(method, self.api + path, body, self._auth())

    def _failed(self, what: str, status: int | None, ans: Any) -> bool:
        self.errors += 1
        if isinstance(ans, dict) and ans.get("kind") == "Status":
            detail = f"{ans.get('reason', '')}: {ans.get('message', '')}"
        else:
            detail = str(ans)[:200]
        self.last_error = f"{what}: HTTP {status}: {detail}" if status else f"{what}: {detail}"
        log.warning("kubernetes elector: %s", self.last_error)
        return False

    def _lease(self, me: str, spec: dict[str, Any], rv: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if rv is not None:
            meta["resourceVersion"] = rv
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
                "spec": spec}

    # -- the Elector protocol --------------------------------------------------------------
    async def try_acquire(self, me: str) -> bool:
        try:
            return await self._try(me)
        except Unreachable as e:
            return self._failed("try_acquire", None, str(e))

    async def _try(self, me: str) -> bool:
        now = time.time()
        status, ans = await self._call("GET", self.path)
        if status == 404:
            spec = {"holderIdentity": me, "leaseDurationSeconds": int(self.lease_secs),
                    "acquireTime": micro_time(now), "renewTime": micro_time(now),
                    "leaseTransitions": 0}
            status, ans = await self._call(
                "POST", self.path.rsplit("/", 1)[0], self._lease(me, spec))
            if status == 201:
                self._see(ans)
                return True
            if status == 409:  # AlreadyExists: another member created it first
                return False
            return self._failed("create", status, ans)
        if status != 200 or not isinstance(ans, dict) or not isinstance(ans.get("spec"), dict):
            return self._failed("get", status, ans)
        spec = ans["spec"]
        meta = _dict(ans.get("metadata"))
        self._see(ans)
        holder = spec.get("holderIdentity") or ""
        duration = _int(spec.get("leaseDurationSeconds"), int(self.lease_secs))
        if holder and holder != me and time.monotonic() < self._observed_at + duration:
            return False  # another member's, renewed less than a lease ago (as we saw it)
        new = dict(spec)
        new.update(holderIdentity=me, leaseDurationSeconds=int(self.lease_secs),
                   renewTime=micro_time(now))
        if holder != me:
            new["acquireTime"] = micro_time(now)
            new["leaseTransitions"] = _int(spec.get("leaseTransitions"), 0) + 1
        status, ans = await self._call("PUT", self.path,
                                       self._lease(me, new, str(meta.get("resourceVersion", ""))))
        if status == 200:
            self._see(ans)
            return True
        if status == 409:  # Conflict: someone wrote it since we read it
            return False
        return self._failed("update", status, ans)

    def _see(self, lease: Any) -> None:
        """client-go's observed record: the time it last changed, by our clock."""
        spec = lease.get("spec") if isinstance(lease, dict) else None
        if not isinstance(spec, dict):
            return
        rec = (spec.get("holderIdentity"), spec.get("renewTime"), spec.get("acquireTime"),
               spec.get("leaseDurationSeconds"), spec.get("leaseTransitions"))
        if rec != self._observed:
            self._observed, self._observed_at = rec, time.monotonic()

    async def holder(self) -> str | None:
        try:
            status, ans = await self._call("GET", self.path)
        except Unreachable as e:
            self._failed("holder", None, str(e))
            return None
        if status == 404:
            return None
        if status != 200 or not isinstance(ans, dict) or not isinstance(ans.get("spec"), dict):
            self._failed("holder", status, ans)
            return None
        self._see(ans)
        h = ans["spec"].get("holderIdentity")
        return h if isinstance(h, str) and h else None

    async def release(self, me: str) -> None:
        """An empty holder, if `me` holds it (client-go's release); best effort."""
        try:
            status, ans = await self._call("GET", self.path)
            if status != 200 or not isinstance(ans, dict):
                return
            spec = _dict(ans.get("spec"))
            if spec.get("holderIdentity") != me:
                return
            now = micro_time()
            new = dict(spec)
            new.update(holderIdentity="", leaseDurationSeconds=1, renewTime=now,
                       acquireTime=now)
            rv = str((ans.get("metadata") or {}).get("resourceVersion", ""))
            status, ans = await self._call("PUT", self.path, self._lease(me, new, rv))
            if status != 200:
                self._failed("release", status, ans)
        except Unreachable as e:
            self._failed("release", None, str(e))

    async def close(self) -> None:
        self.http.close()


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _int(v: Any, default: int) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default
