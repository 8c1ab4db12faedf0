"""Signed access tokens and write receipts: HMAC-SHA256 under the cluster key.

Nobody can write, read or delete a blob the master did not hand out: the master signs a
short-lived token scoped to an operation and to blob ids; data nodes verify it. Data nodes
share the key too, so they sign the node-to-node ``replicate`` requests they make, their
heartbeats to the master (op ``heartbeat``, scoped to the node id), and the **receipts**
that prove to the master that a node durably holds a blob.

Token (sent as ``Authorization: Bearer <token>``)::

    "sqt1." + b64url(claims) + "." + b64url(HMAC-SHA256(key, b"squall-token-v1\\n" + claims))
    claims = JSON {"op": "write" | "read" | "delete" | "replicate" | "heartbeat",
                   "b":  [blob id, ...],          # blobs in scope (heartbeat: [node id])
                   "p":  "prefix", "n": count,    # optional: also the blob ids prefix + 0,
                                                  #   prefix + 1, ..., prefix + (count - 1)
                   "r":  ["http://node:port", ...],  # optional, write only: the replica
                                                  #   set the first node may forward to
                   "exp": 1800000000.0}           # expiry, seconds since the epoch

Receipt (in write answers; the master accepts a payload reference only with a write
quorum of valid receipts)::

    "sqr1." + b64url(claims) + "." + b64url(HMAC-SHA256(key, b"squall-receipt-v1\\n" + claims))
    claims = JSON {"n": node id, "b": blob id, "s": size in bytes, "c": crc32c, "t": issued at}

Batch receipt (a front-door batch: one proof per node for every blob of one request, so
the master checks one MAC per node and request instead of one per blob)::

    "sqb1." + b64url(claims) + "." + b64url(HMAC-SHA256(key, b"squall-batch-receipt-v1\n" + claims))
    claims = JSON {"n": node id, "k": number of blobs, "d": b64url(BLAKE2b-128 of the JSON
                   list of the distinct [blob id, size, crc32c] triples, sorted), "t": issued at}

It proves the node holds *exactly* that set: the master recomputes the digest from the
payload references that carry it in one request (:func:`verify_batch_receipt`).

b64url is URL-safe base64 without ``=`` padding. The MAC covers the claims bytes exactly
as sent (never re-serialised), is compared in constant time, and the two kinds use
different domain prefixes so a token can never pass as a receipt or the other way round.
Errors: missing, malformed, forged or expired → :class:`Unauthorized` (401); a valid
token for another operation, blob or replica → :class:`Forbidden` (403).

The cluster key comes from ``--cluster-key-file``, else ``SQUALL_CLUSTER_KEY``; a master
without one makes its own in its data folder (``cluster.key``, mode 0600), a data node
without one refuses to start. There is no built-in key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import orjson

from squall.common.errors import Forbidden, Unauthorized

OPS = ("write", "read", "delete", "replicate", "heartbeat", "journal")  # journal: master set
TOKEN_PREFIX = "sqt1."
RECEIPT_PREFIX = "sqr1."
BATCH_RECEIPT_PREFIX = "sqb1."
MAX_TOKEN_CHARS = 256 << 10
# key material that was printed in squall's sources, docs or manifests: never a key
PUBLISHED_KEYS = frozenset({
    b"squall-dev-cluster-key-do-not-use-in-production",  # the old built-in fallback
    b"squall-dev-cluster-key-not-secret-0123456789",  # the old dev overlay's
    b"squall-dev-auth-key-not-secret-0123456789",
})
MIN_KEY_BYTES = 16
_TOKEN_DOMAIN = b"squall-token-v1\n"
_RECEIPT_DOMAIN = b"squall-receipt-v1\n"
_BATCH_DOMAIN = b"squall-batch-receipt-v1\n"

log = logging.getLogger("squall.tokens")


def is_published_key(key: bytes) -> bool:
    """Key material printed in squall's sources or docs (anyone can sign with it)."""
    return key.strip() in PUBLISHED_KEYS


def load_cluster_key(key_file: str | None = None, env: dict[str, str] | None = None
                     ) -> bytes | None:
    """The cluster key: the file's contents (surrounding whitespace stripped), else the
    ``SQUALL_CLUSTER_KEY`` environment variable; None when neither is configured (a master
    then makes one in its data folder, a data node refuses to start). Published key material
    (:data:`PUBLISHED_KEYS`) is refused wherever it comes from: it is no secret."""
    env = dict(os.environ) if env is None else env
    if key_file:
        with open(key_file, "rb") as f:
            key = f.read().strip()
        source = key_file
    elif env.get("SQUALL_CLUSTER_KEY"):
        key, source = env["SQUALL_CLUSTER_KEY"].encode().strip(), "SQUALL_CLUSTER_KEY"
    else:
        return None
    if is_published_key(key):
        raise ValueError(f"the cluster key from {source} is a published development key "
                         "(anyone can forge tokens and receipts with it): make one with "
                         "`squall auth keygen --cluster FILE`")
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"cluster key from {source} is {len(key)} bytes; use at least "
                         f"{MIN_KEY_BYTES} random bytes")
    return key


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    if not text or any(c in text for c in "=+/ \n\r\t"):
        raise ValueError("not unpadded base64url")
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(raw) != text:  # unused low bits set: one value, one spelling
        raise ValueError("non-canonical base64url")
    return raw


def _mac(key: bytes, domain: bytes, claims: bytes) -> bytes:
    return hmac.new(key, domain + claims, hashlib.sha256).digest()


def _seal(key: bytes, prefix: str, domain: bytes, claims: dict[str, object]) -> str:
    raw = orjson.dumps(claims)
    return f"{prefix}{_b64(raw)}.{_b64(_mac(key, domain, raw))}"


def _open(key: bytes, prefix: str, domain: bytes, sealed: object, kind: str) -> dict[str, object]:
    """The claims of a sealed token or receipt, or Unauthorized. Checks the MAC before
    looking at the claims."""
    if not isinstance(sealed, str) or not sealed:
        raise Unauthorized(f"missing {kind}")
    if len(sealed) > MAX_TOKEN_CHARS or not sealed.startswith(prefix):
        raise Unauthorized(f"malformed {kind}: expected {prefix}<claims>.<mac>")
    parts = sealed[len(prefix):].split(".")
    if len(parts) != 2:
        raise Unauthorized(f"malformed {kind}: expected {prefix}<claims>.<mac>")
    try:
        raw, mac = _unb64(parts[0]), _unb64(parts[1])
    except (ValueError, binascii.Error):
        raise Unauthorized(f"malformed {kind}: bad base64url") from None
    if not hmac.compare_digest(mac, _mac(key, domain, raw)):
        raise Unauthorized(f"invalid {kind} signature (forged, tampered or another cluster's key)")
    try:
        claims = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise Unauthorized(f"malformed {kind} claims") from None
    if not isinstance(claims, dict):
        raise Unauthorized(f"malformed {kind} claims")
    return claims


def _norm_url(url: str) -> str:
    return url.strip().rstrip("/")


@dataclass(frozen=True, slots=True)
class TokenClaims:
    op: str
    blob_ids: frozenset[str]
    prefix: str | None
    replicas: tuple[str, ...]
    expires_at: float
    count: int = 0  # with prefix: the ids prefix + "0" ... prefix + str(count - 1)

    def covers(self, blob_id: str) -> bool:
        if blob_id in self.blob_ids:
            return True
        if self.prefix is None or not blob_id.startswith(self.prefix):
            return False
        n = blob_id[len(self.prefix):]  # exactly the allocated ids: one spelling each
        return (n.isascii() and n.isdigit() and (n == "0" or n[0] != "0")
                and len(n) <= 6 and int(n) < self.count)


def sign(key: bytes, op: str, blob_ids: Iterable[str], expires_at: float, *,
         prefix: str | None = None, count: int = 0, replicas: Sequence[str] = ()) -> str:
    """A token allowing `op` on `blob_ids` (and on the `count` ids `prefix` + "0" ...
    `prefix` + str(count - 1)) until `expires_at`; a write token may also name the replica
    set."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}; one of {OPS}")
    if prefix is not None and not prefix:
        raise ValueError("an empty prefix would cover every blob")
    if prefix is not None and not 0 < count <= 100_000:
        raise ValueError("a prefix covers 1 to 100000 numbered blob ids: give count")
    claims: dict[str, object] = {"op": op, "b": list(blob_ids)}
    if prefix is not None:
        claims["p"] = prefix
        claims["n"] = count
    if replicas:
        claims["r"] = [_norm_url(u) for u in replicas]
    claims["exp"] = round(float(expires_at), 3)
    return _seal(key, TOKEN_PREFIX, _TOKEN_DOMAIN, claims)


def decode(key: bytes, token: object, now: float) -> TokenClaims:
    """Check signature, shape and expiry; the scope is the caller's (see :func:`verify`).
    A token's claims are fixed by its text and the key, so a token checked once is
    remembered (up to DECODED_MAX_CHARS of tokens, then the memory starts over): a member's
    journal token or a node's heartbeat token serves many requests, and a data node's
    guard and route check the same payload token. The expiry is checked every time."""
    known = _DECODED.get(key, token)
    if known is None:
        known = _decode(key, token, now)
        _DECODED.add(key, str(token), known)
    elif now >= known.expires_at:
        raise Unauthorized(f"token expired {now - known.expires_at:.1f}s ago; ask the "
                           "master for a new one")
    return known


DECODED_MAX_CHARS = 8 << 20


class _Decoded:
    """Tokens checked once, by (key, text), up to DECODED_MAX_CHARS of text."""

    def __init__(self) -> None:
        self.claims: dict[tuple[bytes, str], TokenClaims] = {}
        self.chars = 0

    def get(self, key: bytes, token: object) -> TokenClaims | None:
        return self.claims.get((key, token)) if isinstance(token, str) else None

    def add(self, key: bytes, token: str, claims: TokenClaims) -> None:
        if self.chars + len(token) > DECODED_MAX_CHARS:
            self.claims, self.chars = {}, 0
        self.claims[(key, token)] = claims
        self.chars += len(token)


_DECODED = _Decoded()


def _decode(key: bytes, token: object, now: float) -> TokenClaims:
    c = _open(key, TOKEN_PREFIX, _TOKEN_DOMAIN, token, "token")
    op, ids, prefix, reps, exp = c.get("op"), c.get("b"), c.get("p"), c.get("r", []), c.get("exp")
    count = c.get("n", 0)
    if (op not in OPS or not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)
            or not (prefix is None or (isinstance(prefix, str) and prefix))
            or not isinstance(count, int) or isinstance(count, bool)
            or (prefix is not None and count <= 0)
            or not isinstance(reps, list) or not all(isinstance(u, str) for u in reps)
            or not isinstance(exp, int | float) or isinstance(exp, bool)):
        raise Unauthorized("malformed token claims")
    if now >= exp:
        raise Unauthorized(f"token expired {now - exp:.1f}s ago; ask the master for a new one")
    return TokenClaims(str(op), frozenset(ids), prefix, tuple(reps), float(exp), count)


def verify(key: bytes, token: object, op: str, blob_id: str | Iterable[str],
           now: float) -> TokenClaims:
    """Raise Unauthorized or Forbidden unless `token` allows `op` on `blob_id` (or on every
    id of an iterable) at time `now`; return the claims."""
    claims = decode(key, token, now)
    if claims.op != op:
        raise Forbidden(f"token is for {claims.op!r}, not {op!r}")
    for b in [blob_id] if isinstance(blob_id, str) else blob_id:
        if not claims.covers(b):
            raise Forbidden(f"token does not cover blob {b!r}")
    return claims


def check_replicas(claims: TokenClaims, urls: Iterable[str]) -> list[str]:
    """The normalised `urls`, or Forbidden for any the write token does not name: a data
    node forwards only to the replica set the master allocated."""
    out = []
    allowed = set(claims.replicas)
    for u in urls:
        n = _norm_url(u)
        if n not in allowed:
            raise Forbidden(f"token does not allow forwarding to {n!r}")
        out.append(n)
    return out


def bearer(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header, or Unauthorized."""
    if not header:
        raise Unauthorized("missing token: send Authorization: Bearer <token>")
    scheme, _, tok = header.partition(" ")
    if scheme.lower() != "bearer" or not tok.strip():
        raise Unauthorized("malformed Authorization header: expected Bearer <token>")
    return tok.strip()


@dataclass(frozen=True, slots=True)
class Receipt:
    node_id: str
    blob_id: str
    size: int
    crc32c: int
    issued_at: float


def sign_receipt(key: bytes, node_id: str, blob_id: str, size: int, crc32c: int,
                 issued_at: float = 0.0) -> str:
    """Proof that `node_id` durably holds `blob_id` with this size and checksum."""
    return _seal(key, RECEIPT_PREFIX, _RECEIPT_DOMAIN,
                 {"n": node_id, "b": blob_id, "s": int(size), "c": int(crc32c),
                  "t": round(float(issued_at), 3)})


def verify_receipt(key: bytes, receipt: object, blob_id: str, size: int | None = None,
                   crc32c: int | None = None, node_id: str | None = None) -> Receipt:
    """Check a receipt's signature and that it is for this blob (and size, checksum and
    node when given); Unauthorized otherwise. Returns its claims."""
    c = _open(key, RECEIPT_PREFIX, _RECEIPT_DOMAIN, receipt, "receipt")
    n, b, s, crc, t = c.get("n"), c.get("b"), c.get("s"), c.get("c"), c.get("t", 0.0)
    if (not isinstance(n, str) or not isinstance(b, str) or not isinstance(s, int)
            or not isinstance(crc, int) or not isinstance(t, int | float)):
        raise Unauthorized("malformed receipt claims")
    r = Receipt(n, b, s, crc, float(t))
    for what, want, got in (("blob", blob_id, b), ("size", size, s), ("crc32c", crc32c, crc),
                            ("node", node_id, n)):
        if want is not None and want != got:
            raise Unauthorized(f"receipt is for {what} {got!r}, not {want!r}")
    return r


Triple = tuple[str, int, int]  # blob id, size, crc32c


def blobs_digest(blobs: Iterable[Triple]) -> tuple[str, int]:
    """(digest, count) naming exactly this set of (blob id, size, crc32c) triples."""
    distinct = sorted(set(blobs))
    raw = orjson.dumps(distinct)
    return _b64(hashlib.blake2b(raw, digest_size=16).digest()), len(distinct)


def sign_batch_receipt(key: bytes, node_id: str, blobs: Iterable[Triple],
                       issued_at: float = 0.0) -> str:
    """Proof that `node_id` durably holds every one of `blobs` (one MAC for the set)."""
    digest, count = blobs_digest(blobs)
    return _seal(key, BATCH_RECEIPT_PREFIX, _BATCH_DOMAIN,
                 {"n": node_id, "k": count, "d": digest, "t": round(float(issued_at), 3)})


def verify_batch_receipt(key: bytes, receipt: object, blobs: Iterable[Triple],
                         node_id: str | None = None) -> tuple[str, float]:
    """Check a batch receipt's signature and that it names exactly `blobs` (and this node
    when given); Unauthorized otherwise. Returns (node id, issued at)."""
    c = _open(key, BATCH_RECEIPT_PREFIX, _BATCH_DOMAIN, receipt, "batch receipt")
    n, k, d, t = c.get("n"), c.get("k"), c.get("d"), c.get("t", 0.0)
    if (not isinstance(n, str) or not isinstance(k, int) or not isinstance(d, str)
            or not isinstance(t, int | float)):
        raise Unauthorized("malformed batch receipt claims")
    digest, count = blobs_digest(blobs)
    if (count, digest) != (k, d):
        raise Unauthorized(f"the batch receipt covers {k} blob(s), not exactly these {count}")
    if node_id is not None and node_id != n:
        raise Unauthorized(f"batch receipt is for node {n!r}, not {node_id!r}")
    return n, float(t)
