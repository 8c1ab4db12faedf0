"""Client and node credentials: bearer tokens signed with Ed25519 under the *auth key*.

Only the master holds the private key and can mint; every other server (the data nodes)
holds the public key and can only verify. The auth key is not the cluster key (which signs
payload tokens and receipts, see ``tokens.py``, and which data nodes share). A credential
names its holder's roles and may be limited to consistency groups (and, for role ``node``,
to one data-node id)::

    "sq2." + b64url(claims) + "." + b64url(Ed25519-sign(private key,
                                                          b"squall-credential-v2\\n" + claims))
    claims = JSON {"id": "<random 16 bytes, b64url>",   # what `squall auth revoke` names
                   "k": "<key id>",                      # which public key verifies it
                   "r": ["producer", "consumer"],        # roles
                   "g": ["reports", ...],                # optional: groups it may touch
                   "n": "dn-1",                          # optional: the node it speaks for
                   "iat": 1800000000.0, "exp": 1800086400.0}

Key files hold one key a line, ``#`` comments allowed:

- ``ed25519-private:<b64url 32-byte seed>``: a signing key (the master's ``auth.key``); the
  first one signs, every one verifies;
- ``ed25519-public:<b64url 32-byte key>``: verifies only (a data node's ``auth.pub``, made
  with ``squall auth pubkey``; a data node refuses a file with a private line).

The key id is the b64url of the first 8 bytes of SHA-256 of the public key, so a verifier
picks the one key to check with. Rotation: put a new private line first on the master and
its public line in the data nodes' file (old lines stay: they still verify), roll, re-mint,
then drop the old lines. ``sq1.`` credentials (HMAC, before asymmetric signing) are refused
with a message saying to re-mint.

Revocation is a list of ids held by the master (persisted in its data folder, see
``master/security.py``); an id stays on the list until the credential would have expired
anyway, so the list is bounded by what was minted.

:func:`sign_claims` / :func:`open_signed` are the signing primitives (a domain string per
kind, so a credential never passes for another kind of signed object): the master signs,
everyone else only opens. ``cryptography`` is a dependency of the server extra; importing
this module does not need it (the client library never verifies credentials).
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import os
import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import orjson

from squall.common.errors import Unauthorized
from squall.common.security.tokens import _b64, _unb64

CRED_PREFIX = "sq2."
LEGACY_PREFIX = "sq1."
ROLES = ("producer", "consumer", "admin", "monitor", "node")
MAX_CRED_CHARS = 8192
MAX_GROUPS = 256
_DOMAIN = b"squall-credential-v2\n"
AUTH_KEY_ENV = "SQUALL_AUTH_KEY"
AUTH_KEY_FILE_ENV = "SQUALL_AUTH_KEY_FILE"
PUBLIC_KEY_ENV = "SQUALL_AUTH_PUBLIC_KEY"
PUBLIC_KEY_FILE_ENV = "SQUALL_AUTH_PUBLIC_KEY_FILE"
PRIVATE_TAG = b"ed25519-private:"
PUBLIC_TAG = b"ed25519-public:"
NEEDS = ("Ed25519 credentials need the `cryptography` package: pip install 'squall[server]'")

log = logging.getLogger("squall.auth")


def _ed() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:  # pragma: no cover - the server extra has it
        raise RuntimeError(NEEDS) from None
    return ed25519


def key_id(public_raw: bytes) -> str:
    """The id of a public key: b64url of the first 8 bytes of its SHA-256."""
    return _b64(hashlib.sha256(public_raw).digest()[:8])


@dataclass(frozen=True)
class AuthKeys:
    """Parsed auth keys: the signing key (the first private line; None on a verifier) and
    every public key by id."""

    signer: Any = None  # Ed25519PrivateKey
    signer_id: str | None = None
    public: dict[str, Any] = field(default_factory=dict)  # key id -> Ed25519PublicKey
    public_raw: dict[str, bytes] = field(default_factory=dict)
    private_count: int = 0

    @property
    def can_sign(self) -> bool:
        return self.signer is not None

    def public_text(self) -> bytes:
        """The public half, as a key file for data nodes (``auth.pub``)."""
        return b"".join(PUBLIC_TAG + _b64(raw).encode() + b"\n"
                        for raw in self.public_raw.values())

    def verifier(self) -> AuthKeys:
        """The same keys without the private ones."""
        return AuthKeys(None, None, dict(self.public), dict(self.public_raw), 0)


def parse_keys(text: bytes) -> AuthKeys:
    """The keys of a key file or variable: one per line (or comma-separated)."""
    ed = _ed()
    entries = [k.strip() for line in text.splitlines() for k in line.split(b",")]
    entries = [k for k in entries if k and not k.startswith(b"#")]
    if not entries:
        raise ValueError("no auth key in it")
    signer, signer_id, pub, raws, nprivate = None, None, {}, {}, 0
    for e in entries:
        if e.startswith(PRIVATE_TAG):
            try:
                seed = _unb64(e[len(PRIVATE_TAG):].decode("ascii"))
            except (ValueError, UnicodeDecodeError):
                seed = b""
            if len(seed) != 32:
                raise ValueError("an ed25519-private key is 32 bytes in unpadded base64url")
            priv = ed.Ed25519PrivateKey.from_private_bytes(seed)
            raw = _public_raw(priv.public_key())
            nprivate += 1
            if signer is None:
                signer, signer_id = priv, key_id(raw)
        elif e.startswith(PUBLIC_TAG):
            try:
                raw = _unb64(e[len(PUBLIC_TAG):].decode("ascii"))
            except (ValueError, UnicodeDecodeError):
                raw = b""
            if len(raw) != 32:
                raise ValueError("an ed25519-public key is 32 bytes in unpadded base64url")
        else:
            raise ValueError(
                "not an Ed25519 auth key (expected lines `ed25519-private:...` or "
                "`ed25519-public:...`). A key from before asymmetric credentials (a random "
                "string) cannot sign them: make one with `squall auth keygen FILE` and "
                "re-mint the credentials (docs/security.md, migration)")
        kid = key_id(raw)
        raws[kid] = raw
        pub[kid] = ed.Ed25519PublicKey.from_public_bytes(raw)
    return AuthKeys(signer, signer_id, pub, raws, nprivate)


def _public_raw(pk: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    raw: bytes = pk.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw


def new_private_key() -> bytes:
    """A fresh Ed25519 private key as a key-file line."""
    return PRIVATE_TAG + _b64(secrets.token_bytes(32)).encode()


def load_auth_keys(key_file: str | None = None, env: dict[str, str] | None = None
                   ) -> AuthKeys | None:
    """The master's auth keys from `key_file`, else ``SQUALL_AUTH_KEY_FILE``, else
    ``SQUALL_AUTH_KEY``; None when none is configured."""
    env = dict(os.environ) if env is None else env
    key_file = key_file or env.get(AUTH_KEY_FILE_ENV) or None
    if key_file:
        with open(key_file, "rb") as f:
            return parse_keys(f.read())
    if env.get(AUTH_KEY_ENV):
        return parse_keys(env[AUTH_KEY_ENV].encode())
    return None


def load_public_keys(key_file: str | None = None, env: dict[str, str] | None = None
                     ) -> AuthKeys | None:
    """A verifier's keys (a data node) from `key_file`, else ``SQUALL_AUTH_PUBLIC_KEY_FILE``,
    else ``SQUALL_AUTH_PUBLIC_KEY``; None when none is configured. A private line is refused:
    a verifier must not be able to mint."""
    env = dict(os.environ) if env is None else env
    key_file = key_file or env.get(PUBLIC_KEY_FILE_ENV) or None
    if key_file:
        with open(key_file, "rb") as f:
            text, source = f.read(), key_file
    elif env.get(PUBLIC_KEY_ENV):
        text, source = env[PUBLIC_KEY_ENV].encode(), PUBLIC_KEY_ENV
    else:
        return None
    keys = parse_keys(text)
    if keys.private_count:
        raise ValueError(f"{source} holds a private auth key: a data node takes only the "
                         "public key (squall auth pubkey AUTH_KEY_FILE > auth.pub), so that it "
                         "can verify credentials but never mint them")
    return keys


def new_key() -> bytes:
    """A fresh random symmetric key, printable (the cluster key, the lease key)."""
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


# -- the signing primitives ---------------------------------------------------------------------
def sign_claims(keys: AuthKeys, prefix: str, domain: bytes, claims: dict[str, object]) -> str:
    """`prefix` + b64url(claims + {"k": key id}) + "." + b64url(signature over `domain` +
    claims), signed with the first private key. Only the master holds one."""
    if keys.signer is None:
        raise ValueError("these auth keys can only verify (no private key): only the master "
                         "mints")
    raw = orjson.dumps({**claims, "k": keys.signer_id})
    return f"{prefix}{_b64(raw)}.{_b64(keys.signer.sign(domain + raw))}"


def open_signed(keys: AuthKeys, prefix: str, domain: bytes, text: object, kind: str,
                max_chars: int = MAX_CRED_CHARS) -> dict[str, Any]:
    """The claims of a signed object, or Unauthorized. The signature is checked, with the
    key its `k` names, before any claim is used."""
    from cryptography.exceptions import InvalidSignature

    if not isinstance(text, str) or not text:
        raise Unauthorized(f"missing {kind}: send Authorization: Bearer <{kind}>")
    if len(text) > max_chars or not text.startswith(prefix):
        raise Unauthorized(f"malformed {kind}: expected {prefix}<claims>.<signature>")
    parts = text[len(prefix):].split(".")
    if len(parts) != 2:
        raise Unauthorized(f"malformed {kind}: expected {prefix}<claims>.<signature>")
    try:
        raw, sig = _unb64(parts[0]), _unb64(parts[1])
    except ValueError:
        raise Unauthorized(f"malformed {kind}: bad base64url") from None
    try:
        c = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise Unauthorized(f"malformed {kind} claims") from None
    kid = c.get("k") if isinstance(c, dict) else None
    pk = keys.public.get(kid) if isinstance(kid, str) else None
    if pk is None or len(sig) != 64:
        raise Unauthorized(f"invalid {kind} signature (forged, tampered, or signed with a key "
                           "this server does not hold)")
    try:
        pk.verify(sig, domain + raw)
    except InvalidSignature:
        raise Unauthorized(f"invalid {kind} signature (forged, tampered, or signed with a key "
                           "this server does not hold)") from None
    assert isinstance(c, dict)
    return c


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


def mint(keys: AuthKeys, roles: Iterable[str], ttl_s: float, now: float, *,
         groups: Iterable[str] | None = None, node: str | None = None,
         cid: str | None = None) -> str:
    """A credential with `roles` (limited to `groups`, and to `node` for role node) valid
    for `ttl_s` seconds from `now`, signed with the first private key of `keys`; `cid`: its
    id (default: a new one; the SQS endpoint's short-lived credentials share their access
    key's id, so revoking it revokes them)."""
    rs = sorted(set(roles))
    if not rs or any(r not in ROLES for r in rs):
        raise ValueError(f"roles must be some of {ROLES}, got {rs}")
    if ttl_s <= 0:
        raise ValueError("ttl must be positive")
    if ("node" in rs) != (node is not None):
        raise ValueError("a node credential names its node id (and only it does)")
    if "node" in rs and len(rs) > 1:
        raise ValueError("a node credential has the node role only")
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
    return sign_claims(keys, CRED_PREFIX, _DOMAIN, claims)


def _strs(v: object) -> TypeGuard[list[str]]:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def verify(keys: AuthKeys, cred: object, now: float,
           revoked: Callable[[str], bool] = lambda _id: False) -> Credential:
    """The credential's claims, or Unauthorized (malformed, forged, expired, revoked).
    The signature is checked before the claims are used."""
    if isinstance(cred, str) and cred.startswith(LEGACY_PREFIX):
        raise Unauthorized("an sq1 credential (HMAC-signed, from before asymmetric "
                           "credentials) is no longer accepted: mint a new one "
                           "(squall auth mint)")
    if not isinstance(cred, str) or not cred:
        raise Unauthorized("missing credential: send Authorization: Bearer <credential>")
    c = open_signed(keys, CRED_PREFIX, _DOMAIN, cred, "credential")
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
        body = cred.split(".", 1)[1].split(".")[0]
        c = orjson.loads(_unb64(body))
        return str(c["id"]) if isinstance(c, dict) and isinstance(c.get("id"), str) else None
    except (ValueError, IndexError, orjson.JSONDecodeError):
        return None


def credential_expiry(cred: str) -> float | None:
    """The expiry inside a credential, without checking it (a data node reports its own
    node credential's, ``squall_datanode_credential_expiry_seconds``)."""
    try:
        c = orjson.loads(_unb64(cred.split(".", 1)[1].split(".")[0]))
        exp = c.get("exp") if isinstance(c, dict) else None
        return float(exp) if isinstance(exp, int | float) and not isinstance(exp, bool) else None
    except (ValueError, IndexError, orjson.JSONDecodeError):
        return None


def is_credential(text: str) -> bool:
    return text.startswith((CRED_PREFIX, LEGACY_PREFIX))


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
                               ("an auth key", auth_key_set)) if not ok]
    msg = (f"squall {role} bound to {host} without {' and '.join(missing)}: anyone who can "
           "reach it could forge tokens or credentials")
    if not insecure:
        raise SystemExit(f"refusing to start: {msg}. Configure them, bind to 127.0.0.1, or "
                         "pass --insecure to run like this anyway.")
    log.warning("!!! INSECURE: %s (--insecure) !!!", msg)


def cluster_key_configured(key_file: str | None, env: dict[str, str] | None = None) -> bool:
    """A cluster key is configured (a file, or a variable holding other than published key
    material)."""
    from squall.common.security.tokens import is_published_key

    env = dict(os.environ) if env is None else env
    if key_file:
        return True
    k = env.get("SQUALL_CLUSTER_KEY", "")
    return bool(k) and not is_published_key(k.encode())
