"""Access control: the rule table is complete and documented, and every route of the master
and of a data node answers 401 / 403 / through exactly as the table in docs/security.md says,
for no credential, forged, expired and revoked ones, and each role."""

from __future__ import annotations

import os
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from starlette.routing import Route

from squall.common.security import auth
from squall.datanode.config import DataNodeSettings
from squall.datanode.http.app import create_datanode_app
from squall.datanode.http.table import ROUTES as DATANODE_ROUTES
from squall.master.http.app import create_master_app
from squall.master.http.table import ROUTES as MASTER_ROUTES
from squall.master.security import SecuritySettings
from squall.master.service import MasterSettings
from tests.dn_kit import KEY as CLUSTER_KEY
from tests.helpers import TEST_AUTH_KEY, TEST_KEYS, mint

DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "security.md")
ROLES = ("producer", "consumer", "admin", "monitor")
MASTER_RULES, DATANODE_RULES = MASTER_ROUTES.rules(), DATANODE_ROUTES.rules()
PARAMS = {"group": "g", "queue": "q", "pid": "p1", "name": "s1", "blob_id": "b1",
          "cred_id": "A" * 22, "node_id": "dn-x", "path": "dashboard/dashboard.css",
          "batch": "b1", "method": "state"}


def doc_table() -> dict[tuple[str, str, str], tuple[frozenset[str], str]]:
    out = {}
    with open(DOC) as f:
        for line in f:
            m = re.match(r"\| (master|datanode) \| (\w+) \| `([^`]+)` \| ([^|]+) \| (\w+) \|",
                         line)
            if m:
                roles = frozenset(r.strip() for r in m[4].split(","))
                out[(m[1], m[2], m[3])] = (roles, m[5])
    return out


def code_table() -> dict[tuple[str, str, str], tuple[frozenset[str], str]]:
    out = {}
    for server, rules in (("master", MASTER_RULES), ("datanode", DATANODE_RULES)):
        for (method, path), r in rules.items():
            out[(server, method, path)] = (r.roles, r.groups)
    return out


def routes_of(app: Any) -> set[tuple[str, str]]:
    out = set()
    for r in app.routes:
        if isinstance(r, APIRoute | Route):
            for method in r.methods or ():
                if method != "HEAD" or isinstance(r, APIRoute):
                    out.add((method, r.path))
    return out


def test_doc_table_is_the_rule_table() -> None:
    assert doc_table() == code_table()


@pytest.fixture
async def apps(tmp_path) -> AsyncIterator[dict[str, Any]]:  # type: ignore[no-untyped-def]
    m = create_master_app(MasterSettings(data_dir=str(tmp_path / "m"), require_receipts=False),
                          background=False)
    d = create_datanode_app(DataNodeSettings(data_dir=str(tmp_path / "d"),
                                             advertise_url="http://127.0.0.1:1",
                                             cluster_key=CLUSTER_KEY),
                            background=False)
    async with m.router.lifespan_context(m), d.router.lifespan_context(d):
        yield {"master": m, "datanode": d}


def test_every_route_has_a_rule(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A new route without a rule fails here (the OpenAPI document and the non-documented
    routes, e.g. the status page, of both apps)."""
    m = create_master_app(MasterSettings(data_dir=str(tmp_path / "m")), background=False)
    d = create_datanode_app(DataNodeSettings(data_dir=str(tmp_path / "d"),
                                             advertise_url="http://127.0.0.1:1",
                                             cluster_key=CLUSTER_KEY),
                            background=False)
    for server, app, rules in (("master", m, MASTER_RULES), ("datanode", d, DATANODE_RULES)):
        for path, ops in app.openapi()["paths"].items():
            for method in ops:
                assert (method.upper(), path) in rules or (
                    method.upper(), path.replace("{pid}", "{pid:path}")) in rules, \
                    f"{server}: {method.upper()} {path} has no row in its route table"
        missing = routes_of(app) - set(rules)
        assert not missing, f"{server}: routes without a rule: {sorted(missing)}"


def _legacy_hmac() -> str:
    """A credential as squall minted them before asymmetric signing (sq1, HMAC)."""
    import base64
    import hashlib
    import hmac

    import orjson

    raw = orjson.dumps({"id": "x" * 22, "r": ["admin"], "iat": 0, "exp": 4e9})
    mac = hmac.new(b"any-old-hmac-auth-key-0123456789", b"squall-credential-v1\n" + raw,
                   hashlib.sha256).digest()
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()  # noqa: E731
    return f"sq1.{b64(raw)}.{b64(mac)}"


def _url(path: str) -> str:
    return re.sub(r"\{(\w+)(?::path)?\}", lambda m: PARAMS[m[1]], path)


async def _call(app: Any, method: str, path: str, cred: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {cred}"} if cred else {}
    kw: dict[str, Any] = {}
    if method in ("POST", "PUT"):
        kw["json"] = {}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        return await c.request(method, _url(path), headers=headers, **kw)


async def test_every_route_answers_as_the_table_says(apps: dict[str, Any]) -> None:
    now = time.time()
    other_key = auth.mint(auth.parse_keys(auth.new_private_key()), ["admin"], 3600, now)
    expired = auth.mint(TEST_KEYS, ["admin"], 1, now - 10)
    revoked = mint("admin")
    node = mint("node", node="n1")
    own_node = mint("node", node=PARAMS["node_id"])
    by_role = {r: mint(r) for r in ROLES}
    master = apps["master"]
    r = await _call(master, "DELETE", f"/v1/auth/credentials/{auth.credential_id(revoked)}",
                    by_role["admin"])
    assert r.status_code == 200, r.text
    # data nodes learn the list from heartbeat answers (test_heartbeat_carries_revocations)
    apps["datanode"].state.node.revoked = frozenset({auth.credential_id(revoked)})
    checked = 0
    for (server, method, path), (roles, _groups) in doc_table().items():
        app = apps[server]
        if path == "/docs":
            continue
        if "public" in roles:
            r = await _call(app, method, path, None)
            assert r.status_code not in (401, 403), (server, method, path, r.text)
            continue
        if "sigv4" in roles:  # the SQS endpoint checks AWS Signature Version 4 itself
            for cred in (None, by_role["admin"]):  # a squall credential is no signature
                r = await _call(app, method, path, cred)
                assert r.status_code in (400, 403), (server, method, path, r.text)
                assert r.headers["x-amzn-query-error"].split(";")[0] in (
                    "MissingAuthenticationToken", "IncompleteSignature"), r.headers
            continue
        if "payload" in roles:  # the route checks the payload token
            r = await _call(app, method, path, None)
            assert r.status_code in (400, 401), (server, method, path, r.text)
            r = await _call(app, method, path, by_role["admin"])  # a credential is no token
            assert r.status_code == 401, (server, method, path, r.text)
            continue
        for cred in (None, "sq2.bogus.bogus", _legacy_hmac(), other_key, expired, revoked):
            r = await _call(app, method, path, cred)
            assert r.status_code == 401, (server, method, path, cred, r.text)
            assert r.json()["error"]["code"] == "unauthorized"
        creds = {**by_role, "node": node, "own node": own_node}
        for role, cred in creds.items():
            r = await _call(app, method, path, cred)
            allowed = role in roles or (
                role == "admin" and roles != {"node"} and "member" not in roles) or (
                role == "own node" and "node" in roles)
            if role == "node" and _groups == "node":
                allowed = False  # a node credential for another node than the path's
            if allowed:
                assert r.status_code not in (401, 403), (server, method, path, role, r.text)
            else:
                assert r.status_code == 403, (server, method, path, role, r.text)
            checked += 1
    assert checked > 100


async def test_group_limits(apps: dict[str, Any]) -> None:
    m = apps["master"]
    prod = mint("producer", groups=["a"])
    body = {"tasks": [{"pid": "1"}]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=m),
                                 base_url="http://127.0.0.1",
                                 headers={"Authorization": f"Bearer {prod}"}) as c:
        assert (await c.post("/v1/groups/a/queues/q/tasks", json=body)).status_code == 200
        r = await c.post("/v1/groups/b/queues/q/tasks", json=body)
        assert r.status_code == 403 and "group" in r.json()["error"]["message"]
        assert (await c.get("/v1/queues")).status_code == 403
        assert (await c.get("/v1/queues", params={"group": "b"})).status_code == 403
        assert (await c.get("/v1/queues", params={"group": "a"})).status_code == 200
        assert (await c.get("/v1/cluster/stats")).status_code == 403


async def test_update_needs_the_role_of_what_it_does(apps: dict[str, Any]) -> None:
    """update: enqueues need producer, dequeue/renew/release consumer (checked after the
    body is parsed, before anything is applied)."""
    m = apps["master"]

    async def upd(cred: str, body: dict[str, Any]) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=m),
                                     base_url="http://127.0.0.1") as c:
            return await c.post("/v1/groups/g/update", json=body,
                                headers={"Authorization": f"Bearer {cred}"})

    enq = {"enqueue": [{"queue": "q", "pid": "1"}]}
    deq = {"dequeue": [{"queue": "q", "pid": "1", "token": "1." + "0" * 32}]}
    assert (await upd(mint("consumer"), enq)).status_code == 403
    assert (await upd(mint("producer"), deq)).status_code == 403
    assert (await upd(mint("producer"), enq)).status_code == 200
    r = await upd(mint("consumer"), deq)
    assert r.status_code == 409, r.text  # allowed; the task is just not leased
    assert (await upd(mint("producer", "consumer"), {**enq, **deq})).status_code == 409


async def test_minted_credentials_work_and_revocation_sticks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Mint through the master, use it, revoke it: refused, also after a restart."""
    settings = MasterSettings(data_dir=str(tmp_path / "m"), require_receipts=False)
    admin = {"Authorization": f"Bearer {mint('admin')}"}
    app = create_master_app(settings, background=False)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1",
            headers=admin) as c:
        r = await c.post("/v1/auth/credentials", json={"roles": ["producer"], "ttl_secs": 60,
                                                        "note": "ci"})
        assert r.status_code == 200, r.text
        cred, cid = r.json()["credential"], r.json()["id"]
        h = {"Authorization": f"Bearer {cred}"}
        body = {"tasks": [{"pid": "1"}]}
        assert (await c.post("/v1/groups/g/queues/q/tasks", json=body, headers=h)
                ).status_code == 200
        listed = (await c.get("/v1/auth/credentials")).json()["credentials"]
        assert [x["id"] for x in listed] == [cid] and listed[0]["note"] == "ci"
        assert (await c.delete(f"/v1/auth/credentials/{cid}")).status_code == 200
        r = await c.post("/v1/groups/g/queues/q/tasks", json=body, headers=h)
        assert r.status_code == 401 and "revoked" in r.json()["error"]["message"]
        bad = await c.post("/v1/auth/credentials", json={"roles": ["root"]})
        assert bad.status_code == 400
    app = create_master_app(settings, background=False)
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        r = await c.post("/v1/groups/g/queues/q/tasks", json={"tasks": []}, headers=h)
        assert r.status_code == 401


async def test_rotation_accepts_the_previous_key(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Key file with a new first line: old credentials still verify, new ones are signed
    with the new key; dropping the old line retires the old credentials."""
    from squall.master.security import SecuritySettings

    new = auth.new_private_key()
    old_cred = mint("admin")
    keyfile = tmp_path / "auth.key"
    keyfile.write_bytes(new + b"\n" + TEST_AUTH_KEY + b"\n")
    settings = MasterSettings(data_dir=str(tmp_path / "m"), require_receipts=False)
    app = create_master_app(settings, background=False,
                            security=SecuritySettings(auth_key_file=str(keyfile)))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        h = {"Authorization": f"Bearer {old_cred}"}
        r = await c.post("/v1/auth/credentials", json={"roles": ["admin"]}, headers=h)
        assert r.status_code == 200
        new_cred = r.json()["credential"]
        assert auth.verify(auth.parse_keys(new).verifier(), new_cred, time.time())
    keyfile.write_bytes(new + b"\n")
    app = create_master_app(settings, background=False,
                            security=SecuritySettings(auth_key_file=str(keyfile)))
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
        assert (await c.get("/v1/cluster/stats", headers={
            "Authorization": f"Bearer {old_cred}"})).status_code == 401
        assert (await c.get("/v1/cluster/stats", headers={
            "Authorization": f"Bearer {new_cred}"})).status_code == 200


async def test_heartbeat_carries_revocations_and_node_credentials(apps: dict[str, Any]
                                                                  ) -> None:
    """A node credential speaks for its node id only; the heartbeat answer lists revoked
    credential ids for the data nodes."""
    m = apps["master"]
    beat = {"node_id": "n1", "address": "http://127.0.0.1:9", "started_at": 1.0, "seq": 0,
            "capacity_bytes": 10, "used_bytes": 0, "free_bytes": 10, "blob_count": 0,
            "full": True}
    gone = mint("consumer")
    r = await _call(m, "DELETE", f"/v1/auth/credentials/{auth.credential_id(gone)}",
                    mint("admin"))
    assert r.status_code == 200
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=m),
                                 base_url="http://127.0.0.1") as c:
        h = {"Authorization": f"Bearer {mint('node', node='n1')}"}
        r = await c.post("/v1/nodes/heartbeat", json=beat, headers=h)
        assert r.status_code == 200, r.text
        assert auth.credential_id(gone) in r.json()["revoked"]
        r = await c.post("/v1/nodes/heartbeat", json={**beat, "node_id": "n2"}, headers=h)
        assert r.status_code == 403, r.text
        # the front door's routes: the same rule (n1 exists now, so n1 gets its block)
        r = await c.post("/v1/nodes/blocks", json={"node_id": "n1", "count": 10}, headers=h)
        assert r.status_code in (200, 503), r.text  # 503: no peer for RF 2 (not a refusal)
        commit = {"node_id": "n2", "updates": [{"group": "g", "enqueue": [
            {"queue": "q", "pid": "p"}]}]}
        for path, body in (("/v1/nodes/blocks", {"node_id": "n2", "count": 10}),
                           ("/v1/nodes/commit", commit)):
            r = await c.post(path, json=body, headers=h)
            assert r.status_code == 403, (path, r.text)
        h = {"Authorization": f"Bearer {mint('admin')}"}
        assert (await c.post("/v1/nodes/heartbeat", json=beat, headers=h)).status_code == 403
        assert (await c.post("/v1/nodes/commit", json={**commit, "node_id": "n1"},
                             headers=h)).status_code == 403  # admin is no node


async def test_dashboard_page_is_public_its_data_is_admin(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The dashboard's page and assets hold no data (a browser cannot attach a bearer header
    to a page load); the JSON it polls needs an admin credential unless --public-status,
    and its actions (here: node management, cancel) stay admin either way."""
    settings = MasterSettings(data_dir=str(tmp_path / "m"))
    for public in ((), ("status",)):
        app = create_master_app(settings, background=False,
                                security=SecuritySettings(public=public))
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            assert (await c.get("/")).status_code == 200
            css = await c.get("/static/dashboard/dashboard.css")
            assert css.status_code == 200 and css.text
            for path in ("/v1/overview", "/v1/overview/queues/g/q", "/v1/overview/workers"):
                r = await c.get(path)
                assert (r.status_code == 401) == (not public), (public, path, r.text)
                r = await c.get(path, headers={"Authorization": f"Bearer {mint('consumer')}"})
                assert (r.status_code == 403) == (not public), (public, path, r.text)
            # payloads are never public, --public-status or not
            for method, path in (("POST", "/v1/nodes/n1/decommission"),
                                 ("DELETE", "/v1/nodes/n1"),
                                 ("DELETE", "/v1/groups/g/queues/q/tasks/p"),
                                 ("POST", "/v1/groups/g/queues/q/retry"),
                                 ("GET", "/v1/overview/queues/g/q/payload?pid=p")):
                assert (await c.request(method, path)).status_code == 401
                r = await c.request(method, path,
                                    headers={"Authorization": f"Bearer {mint('producer')}"})
                assert r.status_code == 403, (method, path, r.text)
