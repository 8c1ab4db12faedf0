"""Client and node credentials: HMAC-signed bearer tokens under the *auth key*.

The auth key is not the cluster key (which signs payload tokens and receipts, see
``tokens.py``): leaking a payload token's key does not let anyone mint credentials, and the
two rotate independently. A credential names its holder's roles and may be limited to
consistency groups (and, for role ``node``, to one data-node id)::

    "sq1." + b64url(claims) + "." + b64url(HMAC-SHA256(key, b"squall-credential-v1\\n" + claims))
    claims = JSON {"id": "<random 16 bytes, b64url>",   # what `squall auth revoke` names
                   "r": ["producer", "consumer"],        # roles
                   "g": ["reports", ...],                # optional: groups it may touch
                   "n": "dn-1",                          # optional: the node it speaks for
                   "iat": 1800000000.0, "exp": 1800086400.0}

Every server holding the auth key verifies a credential without a round trip. Revocation
is a list of ids held by the master (persisted in its data folder, see
``master/security.py``); an id stays on the list until the credential would have
expired anyway, so the list is bounded by what was minted.

Rotation: the key file holds one key per line; the first signs, every line verifies. Add a
new first line, restart (or roll) the servers, re-mint, then drop the old line.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeGuard

import orjson

from squall.common.errors import Unauthorized
from squall.common.security.tokens import MIN_KEY_BYTES, _b64, _mac, _unb64

CRED_PREFIX = "sq1."
ROLES = ("producer", "consumer", "admin", "node")
MAX_CRED_CHARS = 8192
MAX_GROUPS = 256
_DOMAIN = b"squall-credential-v1\n"
AUTH_KEY_ENV = "SQUALL_AUTH_KEY"
AUTH_KEY_FILE_ENV = "SQUALL_AUTH_KEY_FILE"

log = logging.getLogger("squall.auth")


@dataclass(frozen=True, slots=True)
class Credential:
    id: str
    roles: frozenset[str]
    groups: frozenset[str] | None  # None: every group
    node: str | None
    issued_at: float
    expires_at: float

    def may_group(self, group: str) -> bool:
        return self.groups is None or group in self.groups

    def describe(self) -> dict[str, object]:
        return {"id": self.id, "roles": sorted(self.roles),
                "groups": None if self.groups is None else sorted(self.groups),
                "node": self.node, "issued_at": self.issued_at, "expires_at": self.expires_at}


def parse_keys(text: bytes) -> list[bytes]:
    """Keys of a key file or variable: one per line (or comma-separated), first = current."""
    keys = [k.strip() for line in text.splitlines() for k in line.split(b",")]
    keys = [k for k in keys if k and not k.startswith(b"#")]
    if not keys:
        raise ValueError("no auth key in it")
    for k in keys:
        if len(k) < MIN_KEY_BYTES:
            raise ValueError(f"an auth key is {len(k)} bytes; use at least {MIN_KEY_BYTES} "
                             "random bytes")
    return keys


def load_auth_keys(key_file: str | None = None, env: dict[str, str] | None = None
                   ) -> list[bytes] | None:
    """The auth keys from `key_file`, else ``SQUALL_AUTH_KEY_FILE``, else ``SQUALL_AUTH_KEY``;
    None when none is configured."""
    env = dict(os.environ) if env is None else env
    key_file = key_file or env.get(AUTH_KEY_FILE_ENV) or None
    if key_file:
        with open(key_file, "rb") as f:
            return parse_keys(f.read())
    if env.get(AUTH_KEY_ENV):
        return parse_keys(env[AUTH_KEY_ENV].encode())
    return None


def new_key() -> bytes:
    """A fresh random key, printable (safe in a file, a variable or a Kubernetes secret)."""
    return secrets.token_urlsafe(32).encode()


def write_secret(path: str, data: bytes) -> None:
    """Write `data` to `path` readable by its owner only, atomically."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def mint(key: bytes, roles: Iterable[str], ttl_s: float, now: float, *,
         groups: Iterable[str] | None = None, node: str | None = None,
         cid: str | None = None) -> str:
    """A credential with `roles` (limited to `groups`, and to `node` for role node) valid
    for `ttl_s` seconds from `now`; `cid`: its id (default: a new one; the SQS endpoint's
    short-lived credentials share their access key's id, so revoking it revokes them)."""
    rs = sorted(set(roles))
    if not rs or any(r not in ROLES for r in rs):
        raise ValueError(f"roles must be some of {ROLES}, got {rs}")
    if ttl_s <= 0:
        raise ValueError("ttl must be positive")
    if ("node" in rs) != (node is not None):
        raise ValueError("a node credential names its node id (and only it does)")
    claims: dict[str, object] = {"id": cid or _b64(secrets.token_bytes(16)), "r": rs}
    if groups is not None:
        gs = sorted(set(groups))
        if len(gs) > MAX_GROUPS:
            raise ValueError(f"at most {MAX_GROUPS} groups")
        claims["g"] = gs
    if node is not None:
        claims["n"] = node
    claims["iat"] = round(now, 3)
    claims["exp"] = round(now + ttl_s, 3)
    raw = orjson.dumps(claims)
    return f"{CRED_PREFIX}{_b64(raw)}.{_b64(_mac(key, _DOMAIN, raw))}"


def _strs(v: object) -> TypeGuard[list[str]]:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def verify(keys: Sequence[bytes], cred: object, now: float,
           revoked: Callable[[str], bool] = lambda _id: False) -> Credential:
    """The credential's claims, or Unauthorized (malformed, forged, expired, revoked).
    The MAC is checked, in constant time, against every key before the claims are read."""
    if not isinstance(cred, str) or not cred:
        raise Unauthorized("missing credential: send Authorization: Bearer <credential>")
    if len(cred) > MAX_CRED_CHARS or not cred.startswith(CRED_PREFIX):
        raise Unauthorized("malformed credential: expected sq1.<claims>.<mac>")
    parts = cred[len(CRED_PREFIX):].split(".")
    if len(parts) != 2:
        raise Unauthorized("malformed credential: expected sq1.<claims>.<mac>")
    try:
        raw, mac = _unb64(parts[0]), _unb64(parts[1])
    except ValueError:
        raise Unauthorized("malformed credential: bad base64url") from None
    ok = False
    for k in keys:  # no early exit: the time does not say which key matched
        ok |= hmac.compare_digest(mac, _mac(k, _DOMAIN, raw))
    if not ok:
        raise Unauthorized("invalid credential signature (forged, tampered, or minted under "
                           "a key this server does not hold)")
    try:
        c = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise Unauthorized("malformed credential claims") from None
    if not isinstance(c, dict):
        raise Unauthorized("malformed credential claims")
    cid, roles, groups, node = c.get("id"), c.get("r"), c.get("g"), c.get("n")
    iat, exp = c.get("iat", 0.0), c.get("exp")
    if (not isinstance(cid, str) or not _strs(roles) or not roles or not set(roles) <= set(ROLES)
            or not (groups is None or _strs(groups))
            or not (node is None or isinstance(node, str))
            or not all(isinstance(t, int | float) and not isinstance(t, bool)
                       for t in (iat, exp))):
        raise Unauthorized("malformed credential claims")
    assert isinstance(roles, list) and isinstance(exp, int | float)
    if now >= exp:
        raise Unauthorized(f"credential expired {now - exp:.0f}s ago; mint a new one")
    if revoked(cid):
        raise Unauthorized(f"credential {cid} was revoked")
    return Credential(cid, frozenset(roles), None if groups is None else frozenset(groups),
                      node, float(iat), float(exp))


def credential_id(cred: str) -> str | None:
    """The id inside a credential, without checking it (for `squall auth revoke <cred>`)."""
    try:
        c = orjson.loads(_unb64(cred[len(CRED_PREFIX):].split(".")[0]))
        return str(c["id"]) if isinstance(c, dict) and isinstance(c.get("id"), str) else None
    except (ValueError, IndexError, orjson.JSONDecodeError):
        return None


LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "ip6-localhost")


def is_loopback(host: str) -> bool:
    h = host.strip("[]")
    if h in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def check_bind(host: str, cluster_key_set: bool, auth_key_set: bool, insecure: bool,
               role: str) -> None:
    """Refuse (SystemExit) to serve beyond loopback without a cluster key and client auth
    configured, unless `insecure` (then warn loudly)."""
    if is_loopback(host) or (cluster_key_set and auth_key_set):
        return
    missing = [n for n, ok in (("a cluster key (--cluster-key-file)", cluster_key_set),
                               ("an auth key (--auth-key-file)", auth_key_set)) if not ok]
    msg = (f"squall {role} bound to {host} without {' and '.join(missing)}: anyone who can "
           "reach it could forge tokens or credentials")
    if not insecure:
        raise SystemExit(f"refusing to start: {msg}. Configure them, bind to 127.0.0.1, or "
                         "pass --insecure to run like this anyway.")
    log.warning("!!! INSECURE: %s (--insecure) !!!", msg)


def cluster_key_configured(key_file: str | None, env: dict[str, str] | None = None) -> bool:
    from squall.common.security.tokens import DEV_CLUSTER_KEY

    env = dict(os.environ) if env is None else env
    if key_file:
        return True
    k = env.get("SQUALL_CLUSTER_KEY", "")
    return bool(k) and k.encode() != DEV_CLUSTER_KEY
