"""SQS access keys: minted and looked up by the master only (docs/sqs.md, decision 0030).

An access key is a squall credential's claims (roles, groups, expiry; the credential id is
its identity) in the shape AWS SDKs sign with:

- access key id: ``"SQ"`` + base32 of the credential id's 16 bytes (28 characters, A-Z2-7);
- secret: base64url of ``HMAC-SHA256(sqs key, b"squall-sqs-secret-v1\\n" + access key id)``,
  where the *sqs key* is key material only masters hold: ``SQUALL_SQS_KEY_FILE`` when set;
  on a master set, ``HMAC-SHA256(auth signing key, b"squall-sqs-key-v1\\n")`` (every member
  signs credentials with the same private auth key, so every member derives the same
  secrets); else ``<data_dir>/sqs.key``, made on first start, mode 0600. Data nodes hold
  the auth *public* key and the cluster key, never these, so they cannot make a secret.

The claims (and an imported key's secret) are logged as config records (``("C", "A",
"", credential id, claims)``, through the group commit like a policy), so every member of
a master set has them and a failover keeps them working; keys that an older master kept
in ``<data_dir>/sqs-keys.json`` are still read from there. They are also in the credential
log (``squall auth list``); ``squall auth revoke <id>`` revokes the key like any
credential.

A data node verifying a request asks ``POST /v1/nodes/sqs-key`` (node credential) for an
access key id, a day and a region, and gets the principal, the day's SigV4 signing key for
(day, region, "sqs") and a squall credential with the principal's claims and id that lives
``SHORT_TTL_S`` (the node's calls to the master on the caller's behalf); it caches the
answer for a minute at most (``datanode/sqs/keys.py``).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import os
import re
from dataclasses import dataclass, field
from typing import Annotated, Any

import orjson
from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field

from squall.common.errors import BadRequest, NotFound, Unauthorized
from squall.common.security import auth
from squall.master.http.answers import JSON
from squall.master.http.deps import MasterDep
from squall.master.security import CredentialStore, MintRequest

KEY_FILE = "sqs.key"
KEYS_FILE = "sqs-keys.json"
KEY_FILE_ENV = "SQUALL_SQS_KEY_FILE"
PREFIX = "SQ"
SHORT_TTL_S = 600.0
CACHE_S = 60.0
MAX_KEYS = 100_000
_SECRET = b"squall-sqs-secret-v1\n"
_SHARED = b"squall-sqs-key-v1\n"
EXPIRED_PER_MINT = 100  # expired keys forgotten (logged) by each mint
AKID_RE = re.compile(r"SQ[A-Z2-7]{26}")
IMPORTED_RE = r"^[A-Za-z0-9_]{4,128}$"  # an imported access key id (AWS: \w{16,128})


def access_key_id(cred_id: str) -> str:
    raw = base64.urlsafe_b64decode(cred_id + "=" * (-len(cred_id) % 4))
    return PREFIX + base64.b32encode(raw).decode().rstrip("=")


def cred_id_of(akid: str) -> str | None:
    if not AKID_RE.fullmatch(akid):
        return None
    try:
        raw = base64.b32decode(akid[2:] + "======")
    except (binascii.Error, ValueError):
        return None
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def signing_key(secret: str, date: str, region: str) -> bytes:
    k = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, "sqs", "aws4_request"):
        k = hmac.new(k, part.encode(), hashlib.sha256).digest()
    return k


@dataclass
class SqsKeys:
    path: str
    key: bytes
    legacy: dict[str, dict[str, Any]] = field(default_factory=dict)  # sqs-keys.json
    master: Any = None  # the logged keys are its index's ``sqs_keys``
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @classmethod
    def open(cls, data_dir: str, shared: bytes | None = None, master: Any = None
             ) -> SqsKeys:
        """`shared`: a master set's private auth key, the SQS key derives from it."""
        os.makedirs(data_dir, exist_ok=True)
        key_path = os.environ.get(KEY_FILE_ENV)
        if not key_path and shared is not None:
            key = hmac.new(shared, _SHARED, hashlib.sha256).digest()
        else:
            key_path = key_path or os.path.join(data_dir, KEY_FILE)
            if not os.path.exists(key_path):
                auth.write_secret(key_path, auth.new_key() + b"\n")
            with open(key_path, "rb") as f:
                key = f.read().strip()  # a random secret of the master's: never an auth key
            if len(key) < 32:
                raise ValueError(f"{key_path}: the SQS key is {len(key)} bytes; use at "
                                 "least 32")
        s = cls(os.path.join(data_dir, KEYS_FILE), key, master=master)
        try:
            with open(s.path, "rb") as f:
                s.legacy = dict(orjson.loads(f.read()))
        except FileNotFoundError:
            pass
        return s

    @property
    def keys(self) -> dict[str, dict[str, Any]]:
        """Credential id -> claims: the logged keys over those of sqs-keys.json."""
        logged = self.master.index.sqs_keys if self.master is not None else {}
        return {**self.legacy, **{cid: v for (_, cid), v in logged.items()}}

    def secret(self, akid: str) -> str:
        """The secret of a minted key (derived), or of an imported one (kept)."""
        rec = self.imported().get(akid)
        if rec is not None:
            return str(rec["secret"])
        mac = hmac.new(self.key, _SECRET + akid.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def imported(self) -> dict[str, dict[str, Any]]:
        return {v["akid"]: v for v in self.keys.values() if "akid" in v}

    def find(self, akid: str) -> tuple[str, dict[str, Any]] | None:
        """(credential id, claims) of an access key id."""
        rec = self.imported().get(akid)
        if rec is not None:
            return str(rec["id"]), rec
        cid = cred_id_of(akid)
        got = self.keys.get(cid) if cid else None
        if cid is None or got is None or "akid" in got:
            return None
        return cid, got

    async def remember(self, master: Any, cred: auth.Credential, note: str, now: float,
                       imported: tuple[str, str] | None = None) -> None:
        """Log the key's claims (durable on the log's majority before this returns),
        forgetting a few expired keys in the same record."""
        async with self.lock:  # one at a time: an imported id is checked, then logged
            keys = self.keys
            expired = [k for k, v in keys.items() if v["expires_at"] <= now]
            if len(keys) - len(expired) >= MAX_KEYS:
                raise BadRequest(f"{MAX_KEYS} unexpired SQS access keys exist; revoke some")
            rec: dict[str, Any] = {**cred.describe(), "note": note}
            if imported is not None:
                if imported[0] in self.imported() or AKID_RE.fullmatch(imported[0]):
                    raise BadRequest(f"access key id {imported[0]!r} exists or is of the "
                                     "minted form (SQ...)")
                rec["akid"], rec["secret"] = imported
            changes: dict[str, dict[str, Any] | None] = {
                k: None for k in expired[:EXPIRED_PER_MINT] if k not in self.legacy}
            changes[cred.id] = rec
            await master.log_config("A", changes)


class SqsMintRequest(MintRequest):
    access_key_id: Annotated[str, Field(pattern=IMPORTED_RE)] | None = Field(
        None, description="import a key with this id and `secret_access_key` (e.g. what a "
        "test suite or an application's configuration already uses) instead of minting "
        "one; the master keeps its secret in its data folder")
    secret_access_key: Annotated[str, Field(min_length=8, max_length=256)] | None = None


class SqsKeyInfo(BaseModel):
    id: str = Field(description="the credential id (`squall auth revoke <id>`)")
    access_key_id: str
    secret_access_key: str = Field(description="shown once, never stored (the master "
                                   "derives it again from the access key id)")
    roles: list[str]
    groups: list[str] | None
    issued_at: float
    expires_at: float
    note: str = ""


class SqsKeyLookup(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    node_id: Annotated[str, Field(min_length=1, max_length=128)]
    access_key_id: Annotated[str, Field(pattern=IMPORTED_RE)]
    date: Annotated[str, Field(pattern=r"^[0-9]{8}$")]
    region: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z0-9-]+$")]


class SqsKeyAnswer(BaseModel):
    principal: dict[str, Any]
    signing_key: str = Field(description="hex: the SigV4 key of (date, region, sqs)")
    credential: str = Field(description="a short-lived squall credential of the principal")
    credential_expires_at: float
    cache_secs: float


async def mint_sqs_key(body: SqsMintRequest, request: Request, m: MasterDep) -> JSON:
    """Mint an SQS access key (admin): an access key id and secret bound to these roles and
    groups, revocable by its id like any credential. With `access_key_id` and
    `secret_access_key`: import that key instead."""
    if body.node is not None or "node" in body.roles:
        raise BadRequest("an SQS access key cannot be a node credential")
    if (body.access_key_id is None) != (body.secret_access_key is None):
        raise BadRequest("import a key with both access_key_id and secret_access_key")
    imported = None
    if body.access_key_id is not None and body.secret_access_key is not None:
        imported = (body.access_key_id, body.secret_access_key)
    access = request.app.state.access
    store: CredentialStore = request.app.state.credentials
    keys: SqsKeys = request.app.state.sqs_keys
    now = access.now()
    try:
        cred = auth.mint(access.keys, body.roles, body.ttl_secs, now, groups=body.groups)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    claims = auth.verify(access.keys, cred, now)
    note = body.note or "SQS access key"
    await keys.remember(m, claims, note, now, imported)
    store.remember(claims, note, now)
    akid = imported[0] if imported else access_key_id(claims.id)
    return JSON({**claims.describe(), "access_key_id": akid,
                 "secret_access_key": keys.secret(akid), "note": note})


async def lookup_sqs_key(body: SqsKeyLookup, request: Request, m: MasterDep) -> JSON:
    """A data node verifying a SigV4 request: the principal of an access key id, the day's
    signing key and a short-lived credential of the principal (role node)."""
    from squall.common.server.guard import PRINCIPAL
    from squall.master.http.routes.frontdoor import node_speaks

    node_speaks(m, request.scope.get(PRINCIPAL), request.headers.get("authorization"),
                body.node_id)
    access = request.app.state.access
    keys: SqsKeys = request.app.state.sqs_keys
    store: CredentialStore = request.app.state.credentials
    now = access.now()
    found = keys.find(body.access_key_id)
    if found is None:
        raise NotFound("no such access key id")
    cid, rec = found
    if rec["expires_at"] <= now or store.is_revoked(cid):
        raise Unauthorized("the access key expired or was revoked")
    ttl = min(SHORT_TTL_S, rec["expires_at"] - now)
    cred = auth.mint(access.keys, rec["roles"], ttl, now, groups=rec["groups"], cid=cid)
    secret = keys.secret(body.access_key_id)
    return JSON({"principal": {k: rec[k] for k in ("id", "roles", "groups", "expires_at")},
                 "signing_key": signing_key(secret, body.date, body.region).hex(),
                 "credential": cred, "credential_expires_at": now + ttl,
                 "cache_secs": CACHE_S})
