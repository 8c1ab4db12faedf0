"""The master's side of access control: its settings, the credential log and revocation
list (persisted in the data folder), and the `/v1/auth/...` routes that mint, list and
revoke credentials.

Revoked ids live in ``<data_dir>/credentials.json`` (written atomically, fsynced) until
the credential would have expired anyway, so the list stays bounded; data nodes learn it
from heartbeat answers (``revoked``). The log of minted credentials (ids, roles, groups,
expiry, a note; never the credential itself) is there too, for ``squall auth list``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Annotated, Any

import orjson
from fastapi import Path, Request
from pydantic import BaseModel, ConfigDict, Field

from squall.common.errors import NotFound
from squall.common.security import auth
from squall.common.security.files import private_dir
from squall.common.wire.models import ErrorResponse, Name
from squall.master.http.answers import ERROR_RESPONSES, JSON

log = logging.getLogger("squall.master.security")
MAX_LOG = 10_000  # credentials remembered (the oldest expired ones go first)
MAX_TTL_S = 10 * 366 * 86400.0
ADMIN_FILE = "admin.credential"
KEY_FILE = "auth.key"
PUBLIC_FILE = "auth.pub"


@dataclass
class SecuritySettings:
    auth_keys: auth.AuthKeys | None = None  # None: from the environment, else made in data_dir
    auth_key_file: str | None = None
    allowed_hosts: tuple[str, ...] = ()  # names besides loopback ("*": any)
    public: tuple[str, ...] = ()  # "metrics", "status": routes made public
    body_timeout_s: float = 30.0

    def resolve_keys(self, data_dir: str) -> auth.AuthKeys:
        """The configured keys; without any, a key kept in ``data_dir`` (made on first start,
        with an admin credential and the public key next to it), so a master is never open.
        The master mints, so it needs a private key."""
        keys = self.auth_keys or auth.load_auth_keys(self.auth_key_file)
        if keys is None:
            keys = _data_dir_keys(data_dir)
        if not keys.can_sign:
            raise ValueError("the master's auth key file holds no private key "
                             "(ed25519-private:...): only the master mints credentials")
        return keys


def _data_dir_keys(data_dir: str) -> auth.AuthKeys:
    private_dir(data_dir)
    path = os.path.join(data_dir, KEY_FILE)
    if os.path.exists(path):
        with open(path, "rb") as f:
            text = f.read()
        try:
            keys = auth.parse_keys(text)
        except ValueError:  # an HMAC key from before asymmetric credentials: retire it
            os.replace(path, path + ".retired")
            log.warning("%s held an HMAC auth key from before asymmetric credentials: moved "
                        "to %s.retired; credentials minted under it are refused from now on "
                        "(re-mint them; the new admin credential is in %s)", path, path,
                        os.path.join(data_dir, ADMIN_FILE))
        else:
            _write_public(data_dir, keys)
            return keys
    line = auth.new_private_key() + b"\n"
    keys = auth.parse_keys(line)
    auth.write_secret(path, line)
    cred = auth.mint(keys, ["admin"], MAX_TTL_S, time.time())
    auth.write_secret(os.path.join(data_dir, ADMIN_FILE), cred.encode() + b"\n")
    _write_public(data_dir, keys)
    log.warning("no auth key configured: made one in %s, its public key in %s (for the data "
                "nodes: --auth-public-key-file) and an admin credential in %s "
                "(export SQUALL_TOKEN=$(cat %s))", path, os.path.join(data_dir, PUBLIC_FILE),
                os.path.join(data_dir, ADMIN_FILE), os.path.join(data_dir, ADMIN_FILE))
    return keys


def _write_public(data_dir: str, keys: auth.AuthKeys) -> None:
    path = os.path.join(data_dir, PUBLIC_FILE)
    text = keys.public_text()
    try:
        with open(path, "rb") as f:
            if f.read() == text:
                return
    except FileNotFoundError:
        pass
    auth.write_secret(path, text)


@dataclass
class CredentialStore:
    path: str
    minted: dict[str, dict[str, Any]] = field(default_factory=dict)
    revoked: dict[str, float] = field(default_factory=dict)  # id -> its expiry
    lock: threading.Lock = field(default_factory=threading.Lock)
    master: Any = None  # its index's ``revocations``: the logged revocations

    def logged(self) -> dict[tuple[str, str], dict[str, Any]]:
        return self.master.index.revocations if self.master is not None else {}

    def all_revoked(self) -> list[str]:
        """Every revoked credential id: logged (every member of a master set has them),
        and this master's own file (revocations from before they were logged)."""
        return sorted({*self.revoked, *(cid for _, cid in self.logged())})

    @classmethod
    def open(cls, data_dir: str) -> CredentialStore:
        s = cls(os.path.join(data_dir, "credentials.json"))
        try:
            with open(s.path, "rb") as f:
                doc = orjson.loads(f.read())
            s.minted = dict(doc.get("minted", {}))
            s.revoked = {str(k): float(v) for k, v in doc.get("revoked", {}).items()}
        except FileNotFoundError:
            pass
        return s

    def is_revoked(self, cid: str) -> bool:
        return cid in self.revoked or ("", cid) in self.logged()

    def _save(self, now: float) -> None:
        self.revoked = {k: e for k, e in self.revoked.items() if e > now}
        if len(self.minted) > MAX_LOG:
            for k, _ in sorted(self.minted.items(), key=lambda kv: kv[1]["expires_at"]
                               )[:len(self.minted) - MAX_LOG]:
                del self.minted[k]
        auth.write_secret(self.path, orjson.dumps({"minted": self.minted,
                                                   "revoked": self.revoked}))

    def remember(self, cred: auth.Credential, note: str, now: float) -> None:
        with self.lock:
            self.minted[cred.id] = {**cred.describe(), "note": note}
            self._save(now)

    def revoke(self, cid: str, expires_at: float | None, now: float) -> dict[str, Any]:
        with self.lock:
            known = self.minted.get(cid)
            exp = expires_at or (known["expires_at"] if known else now + MAX_TTL_S)
            self.revoked[cid] = float(exp)
            if known:
                known["revoked"] = True
            self._save(now)
            return {"id": cid, "revoked": True, "expires_at": exp}

    def listing(self, now: float) -> list[dict[str, Any]]:
        out = [{**v, "revoked": self.is_revoked(k), "expired": v["expires_at"] <= now}
               for k, v in self.minted.items()]
        return sorted(out, key=lambda d: d["issued_at"])


# -- routes -----------------------------------------------------------------------------------
class MintRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    roles: Annotated[list[str], Field(min_length=1, max_length=4,
                                      description="producer, consumer, admin, monitor, node")]
    groups: Annotated[list[Name], Field(max_length=auth.MAX_GROUPS)] | None = Field(
        None, description="limit to these groups (default: every group)")
    node: Annotated[str, Field(min_length=1, max_length=128)] | None = Field(
        None, description="the data-node id a node credential speaks for")
    ttl_secs: Annotated[float, Field(gt=0, le=MAX_TTL_S)] = 30 * 86400.0
    note: Annotated[str, Field(max_length=256)] = ""


class CredentialInfo(BaseModel):
    id: str
    roles: list[str]
    groups: list[str] | None
    node: str | None
    issued_at: float
    expires_at: float
    note: str = ""
    revoked: bool = False
    expired: bool = False


class MintResponse(CredentialInfo):
    credential: str = Field(description="the bearer credential; shown once, never stored")


class CredentialList(BaseModel):
    credentials: list[CredentialInfo]


# the credential routes' documented answers (their rows are in master/http/table.py)
RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES, 401: {"description": "Missing or invalid credential",
                             "model": ErrorResponse},
    403: {"description": "Not an admin credential", "model": ErrorResponse}}


async def mint_credential(body: MintRequest, request: Request) -> JSON:
    """Mint a credential (admin). The answer holds it; the master keeps only its claims."""
    from squall.common.errors import BadRequest

    access = request.app.state.access
    store: CredentialStore = request.app.state.credentials
    now = access.now()
    try:
        cred = auth.mint(access.keys, body.roles, body.ttl_secs, now, groups=body.groups,
                         node=body.node)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    claims = auth.verify(access.keys, cred, now)
    store.remember(claims, body.note, now)
    return JSON({**claims.describe(), "note": body.note, "credential": cred})


async def list_credentials(request: Request) -> JSON:
    """Credentials minted through this master (not their secrets), revoked or not."""
    return JSON({"credentials": request.app.state.credentials.listing(
        request.app.state.access.now())})


async def revoke_credential(cred_id: Annotated[str, Path(max_length=64)],
                            request: Request) -> JSON:
    """Revoke a credential by id: every server refuses it from now on (data nodes from
    their next heartbeat)."""
    store: CredentialStore = request.app.state.credentials
    now = request.app.state.access.now()
    known = store.minted.get(cred_id)
    if known is None and not store.is_revoked(cred_id) and not _plausible_id(cred_id):
        raise NotFound(f"no credential {cred_id!r}")
    exp = known["expires_at"] if known else now + MAX_TTL_S
    expired = [cid for (_, cid), v in store.logged().items() if v["expires_at"] <= now]
    # logged first (durable on the log's majority): every member refuses it from then on
    await request.app.state.master.log_config(
        "V", {**dict.fromkeys(expired[:100]), cred_id: {"expires_at": float(exp)}})
    store.revoke(cred_id, exp, now)
    info = store.minted.get(cred_id) or {"id": cred_id, "roles": [], "groups": None,
                                         "node": None, "issued_at": 0.0,
                                         "expires_at": store.revoked[cred_id]}
    return JSON({**info, "revoked": True, "expired": info["expires_at"] <= now})


def _plausible_id(cid: str) -> bool:
    """Credentials minted offline (``squall auth mint --key-file``) are not in the log;
    they can still be revoked by id (22 base64url characters)."""
    return len(cid) == 22 and all(c.isalnum() or c in "-_" for c in cid)


def check_update(principal: object, enqueues: bool, acts: bool) -> None:
    """The part of the rule of ``update`` that needs the body: enqueueing needs the
    producer role, acting on leases (dequeue, renew, release) the consumer role."""
    from squall.common.errors import Forbidden

    if not isinstance(principal, auth.Credential) or "admin" in principal.roles:
        return
    if enqueues and "producer" not in principal.roles:
        raise Forbidden("enqueueing needs a producer credential")
    if acts and "consumer" not in principal.roles:
        raise Forbidden("dequeue, renew and release need a consumer credential")


def check_node(principal: object, node_id: str) -> bool:
    """True when `principal` is a node credential for `node_id`; Forbidden when it is one
    for another node; False when it is not a credential (a heartbeat token: the route
    checks its scope)."""
    from squall.common.errors import Forbidden

    if not isinstance(principal, auth.Credential):
        return False
    if principal.node != node_id:
        raise Forbidden(f"this node credential speaks for {principal.node!r}, not {node_id!r}")
    return True
