"""Access keys on the data node: what the master says about an access key id, cached.

The node never holds a secret access key and cannot make one. For a request signed with
access key id K for day D in region R, it asks the master once (``POST /v1/nodes/sqs-key``
under its node credential) and gets: the principal (the credential id, roles, groups and
expiry the key was minted with), the day's SigV4 signing key for (D, R, "sqs") (derived
from the secret, which the master derives from key material only it holds), and a squall
credential for the principal that lives minutes, with the same id (so revoking the id
revokes it too), which the endpoint uses for its calls to the master on the caller's
behalf. An answer is cached for ``CACHE_S`` seconds at most (and never past the
principal's expiry or the short-lived credential's); a revoked id is refused as soon as the
node learns it from its heartbeat, and in any case once the cache entry lapses.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from squall.datanode import masterlink
from squall.datanode.replication.peers import PeerUnreachable
from squall.datanode.sqs.errors import SqsError

if TYPE_CHECKING:
    from squall.datanode.service import DataNode

AKID_RE = re.compile(r"[A-Za-z0-9_]{4,128}")  # minted (SQ + base32) or imported ids
NEGATIVE_S = 10.0  # an unknown access key id is asked about again after this long
CACHE_S = 60.0
CACHE_MAX = 10_000
CRED_MARGIN_S = 30.0  # stop using the short-lived credential this long before it expires


@dataclass(frozen=True, slots=True)
class Principal:
    id: str
    roles: frozenset[str]
    groups: frozenset[str] | None
    expires_at: float

    def may(self, roles: set[str], group: str) -> bool:
        if not (self.roles & roles or "admin" in self.roles):
            return False
        return self.groups is None or group in self.groups

    @property
    def home_group(self) -> str:
        """The group a queue name without a URL lands in: the key's only group, else
        ``default``."""
        if self.groups is not None and len(self.groups) == 1:
            return next(iter(self.groups))
        return "default"


@dataclass(frozen=True, slots=True)
class KeyInfo:
    principal: Principal
    signing_key: bytes
    credential: str
    until: float  # cache deadline (node clock)


class KeyCache:
    def __init__(self, node: DataNode) -> None:
        self.node = node
        self._cache: dict[tuple[str, str, str], KeyInfo] = {}
        self._locks: dict[tuple[str, str, str], asyncio.Lock] = {}
        self._unknown: dict[str, float] = {}  # access key id -> until (no master lookup)
        self.lookups = 0

    def _auth(self) -> str:
        n = self.node
        return "Bearer " + (n.settings.node_credential or n.node_token("heartbeat",
                                                                       [n.node_id]))

    async def get(self, access_key_id: str, date: str, region: str) -> KeyInfo:
        if not AKID_RE.fullmatch(access_key_id):  # not one the master made: no lookup
            raise SqsError("InvalidClientTokenId", "The security token included in the "
                           "request is invalid.")
        k = (access_key_id, date, region)
        now = self.node.clock.now()
        if self._unknown.get(access_key_id, 0.0) > now:
            raise SqsError("InvalidClientTokenId", "The security token included in the "
                           "request is invalid.")
        info = self._cache.get(k)
        if info is None or now >= info.until:
            lock = self._locks.setdefault(k, asyncio.Lock())
            async with lock:
                info = self._cache.get(k)
                if info is None or now >= info.until:
                    info = await self._fetch(access_key_id, date, region)
                    if len(self._cache) >= CACHE_MAX:
                        self._cache.clear()
                        self._locks = {k: lock}
                    self._cache[k] = info
            self._locks.pop(k, None)
        p = info.principal
        if now >= p.expires_at:
            raise SqsError("InvalidClientTokenId", "The security token included in the "
                           "request is expired")
        if p.id in self.node.revoked:
            raise SqsError("InvalidClientTokenId", "The security token included in the "
                           "request is invalid (revoked).")
        return info

    async def _fetch(self, access_key_id: str, date: str, region: str) -> KeyInfo:
        n = self.node
        if n.masters is None or n.peers is None:
            raise SqsError("ServiceUnavailable", "this data node has no master")
        self.lookups += 1
        body = {"node_id": n.node_id, "access_key_id": access_key_id, "date": date,
                "region": region}
        try:
            r = await masterlink.request(n.peers, n.masters, "POST", "/v1/nodes/sqs-key",
                                         orjson.dumps(body),
                                         {"Authorization": self._auth(),
                                          "Content-Type": "application/json"}, replay=True)
        except PeerUnreachable as e:
            raise SqsError("ServiceUnavailable", f"the master is unreachable ({e}); "
                           "retry") from None
        if r.status_code in (400, 401, 404, 422):
            if len(self._unknown) >= CACHE_MAX:
                self._unknown.clear()
            self._unknown[access_key_id] = n.clock.now() + NEGATIVE_S
            raise SqsError("InvalidClientTokenId", "The security token included in the "
                           "request is invalid.")
        if r.status_code >= 400:
            raise SqsError("ServiceUnavailable", f"the master answered {r.status_code} to "
                           "an access key lookup; retry")
        doc: dict[str, Any] = orjson.loads(r.content)
        pr = doc["principal"]
        groups = pr.get("groups")
        p = Principal(str(pr["id"]), frozenset(pr["roles"]),
                      None if groups is None else frozenset(groups), float(pr["expires_at"]))
        now = n.clock.now()
        until = min(now + min(CACHE_S, float(doc.get("cache_secs", CACHE_S))),
                    float(doc["credential_expires_at"]) - CRED_MARGIN_S, p.expires_at)
        return KeyInfo(p, bytes.fromhex(doc["signing_key"]), str(doc["credential"]), until)
