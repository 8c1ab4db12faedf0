"""A stand-in for the Kubernetes API server's Lease API (coordination.k8s.io/v1), for the
Kubernetes elector's tests: a tiny ASGI app served by uvicorn on 127.0.0.1.

It answers as the API server documents it:

- ``GET /apis/coordination.k8s.io/v1/namespaces/{ns}/leases/{name}``: 200 and the Lease,
  404 and a ``Status`` (reason NotFound) when there is none;
- ``POST .../namespaces/{ns}/leases``: 201 and the created Lease (its ``resourceVersion``,
  ``uid``, ``creationTimestamp`` set by the server); 409 (reason AlreadyExists) when it
  exists;
- ``PUT .../leases/{name}``: 200 and the Lease with a new ``resourceVersion``; 409
  (reason Conflict, "the object has been modified") when the body's ``resourceVersion``
  is not the stored one; 404 when there is none; 400 when the body names another object;
- 401 (Status, reason Unauthorized) without the expected bearer token, 403 (Forbidden) on
  any other path or verb (what an RBAC Role of get/create/update on leases allows), 422
  (Invalid) for a Lease without a positive ``leaseDurationSeconds``.

Every request is recorded (method, path, status). ``fail_with``: answer every request with
that status (a Status object) while set. ``before_put``: run once before the next update
(another writer's change between an elector's read and its write).
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

from tests.helpers import asgi_body

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
_ITEM = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases/([^/]+)$")
_LIST = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/([^/]+)/leases$")
_REASON = {400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
           409: "Conflict", 422: "Invalid", 500: "InternalError", 503: "ServiceUnavailable"}


def status(code: int, message: str, reason: str | None = None,
           details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason or _REASON.get(code, "Unknown"),
            "details": details or {}, "code": code}


class LeaseApi:
    def __init__(self, token: str = "sa-token") -> None:
        self.token = token
        self.leases: dict[tuple[str, str], dict[str, Any]] = {}
        self.rv = 100
        self.lock = threading.Lock()
        self.requests: list[tuple[str, str, int]] = []
        self.fail_with: int | None = None
        # called (under the lock) before the next PUT is handled, then cleared: another
        # writer's update landing between an elector's GET and its PUT
        self.before_put: Callable[[], None] | None = None

    def lease(self, ns: str, name: str) -> dict[str, Any] | None:
        with self.lock:
            return self.leases.get((ns, name))

    def statuses(self, method: str) -> list[int]:
        with self.lock:
            return [s for m, _p, s in self.requests if m == method]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await asgi_body(receive)
        method, path = scope["method"], scope["path"]
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        code, ans = self.handle(method, path, headers.get("authorization"), body)
        with self.lock:
            self.requests.append((method, path, code))
        data = orjson.dumps(ans)
        await send({"type": "http.response.start", "status": code, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})

    def handle(self, method: str, path: str, auth: str | None, body: bytes
               ) -> tuple[int, dict[str, Any]]:
        if self.fail_with is not None:
            return self.fail_with, status(self.fail_with, "the stand-in was told to fail")
        if auth != f"Bearer {self.token}":
            return 401, status(401, "Unauthorized")
        item, coll = _ITEM.match(path), _LIST.match(path)
        with self.lock:
            if item and method == "GET":
                got = self.leases.get((item[1], item[2]))
                if got is None:
                    return 404, status(404, f'leases.coordination.k8s.io "{item[2]}" not found',
                                       details={"name": item[2], "group":
                                                "coordination.k8s.io", "kind": "leases"})
                return 200, got
            if coll and method == "POST":
                return self._create(coll[1], body)
            if item and method == "PUT":
                hook, self.before_put = self.before_put, None
                if hook is not None:
                    hook()
                return self._update(item[1], item[2], body)
        verb = {"GET": "get", "POST": "create", "PUT": "update"}.get(method, method.lower())
        return 403, status(403, f'leases.coordination.k8s.io is forbidden: cannot {verb} '
                                f'resource at {path}')

    def _parse(self, ns: str, body: bytes) -> tuple[dict[str, Any] | None,
                                                    tuple[int, dict[str, Any]] | None]:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError as e:
            return None, (400, status(400, f"the body is not JSON: {e}"))
        if not isinstance(obj, dict) or obj.get("kind") != "Lease" or \
                obj.get("apiVersion") != "coordination.k8s.io/v1":
            return None, (400, status(400, "the body is not a coordination.k8s.io/v1 Lease"))
        meta = obj.get("metadata") or {}
        if meta.get("namespace", ns) != ns:
            return None, (400, status(400, "the namespace of the provided object does not "
                                           "match the namespace sent on the request"))
        spec = obj.get("spec") or {}
        d = spec.get("leaseDurationSeconds")
        if not isinstance(d, int) or d <= 0:
            return None, (422, status(422, "spec.leaseDurationSeconds: must be greater than "
                                           "0"))
        return obj, None

    def _create(self, ns: str, body: bytes) -> tuple[int, dict[str, Any]]:
        obj, err = self._parse(ns, body)
        if err is not None:
            return err
        assert obj is not None
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return 422, status(422, "metadata.name: Required value")
        if (ns, name) in self.leases:
            return 409, status(409, f'leases.coordination.k8s.io "{name}" already exists',
                               "AlreadyExists")
        self.rv += 1
        obj["metadata"] = {"name": name, "namespace": ns, "uid": str(uuid.uuid4()),
                           "resourceVersion": str(self.rv),
                           "creationTimestamp": "2026-01-01T00:00:00Z"}
        self.leases[(ns, name)] = obj
        return 201, obj

    def write_holder(self, ns: str, name: str, holder: str) -> None:
        """Another writer (under the lock): `holder` renews the Lease now."""
        cur = self.leases[(ns, name)]
        self.rv += 1
        cur["spec"] = {**cur["spec"], "holderIdentity": holder,
                       "renewTime": "2026-01-01T00:00:01.000000Z"}
        cur["metadata"] = {**cur["metadata"], "resourceVersion": str(self.rv)}

    def _update(self, ns: str, name: str, body: bytes) -> tuple[int, dict[str, Any]]:
        obj, err = self._parse(ns, body)
        if err is not None:
            return err
        assert obj is not None
        meta = obj.get("metadata") or {}
        if meta.get("name") != name:
            return 400, status(400, "the name of the object does not match the name on "
                                    "the URL")
        cur = self.leases.get((ns, name))
        if cur is None:
            return 404, status(404, f'leases.coordination.k8s.io "{name}" not found')
        rv = meta.get("resourceVersion")
        if rv and rv != cur["metadata"]["resourceVersion"]:
            return 409, status(409, f'Operation cannot be fulfilled on leases.coordination.'
                                    f'k8s.io "{name}": the object has been modified; please '
                                    'apply your changes to the latest version and try again')
        self.rv += 1
        obj["metadata"] = {**cur["metadata"], "resourceVersion": str(self.rv)}
        self.leases[(ns, name)] = obj
        return 200, obj
