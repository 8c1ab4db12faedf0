"""Where payloads go: blob allocation, write receipts on commit, read tokens on lease.

- :meth:`Placement.allocate` hands out blob ids with one replica set per batch (distinct
  alive nodes, least used first, so a batch can be written with the data nodes' batch
  form) and one write token covering them (a prefix scope) and naming the replica set.
- :meth:`Placement.verify` is called while planning an enqueue (:meth:`Placement.flush`
  then records the holders it proved, once per set of nodes): a payload reference is
  accepted only with valid receipts (see ``common/security/tokens.py``) for its blob id, size and
  checksum from at least ``write_quorum`` distinct nodes, written recently enough that blob
  GC cannot have collected it. A *batch* receipt (a front-door request's) is checked once
  for every reference of the request carrying it, by :meth:`Placement.prove` before
  planning: it must name exactly that set of blobs. The stored reference keeps blob id,
  size, checksum and the nodes' addresses; receipts and tokens are not stored.
- :meth:`Placement.for_reader` adds the live replicas and a read token to a reference;
  :meth:`Placement.for_lease` adds the live replicas to each payload of a lease answer and
  signs *one* read token for all of them (the answer's ``read_token``): a batch of 100
  tasks costs one signature on the master and one check on the data node, not 100 each.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Iterable
from typing import Any

from squall.common.errors import BadRequest, Unauthorized, Unavailable
from squall.common.security.tokens import (
    BATCH_RECEIPT_PREFIX,
    sign,
    verify_batch_receipt,
    verify_receipt,
)
from squall.common.wire.models import PayloadRef
from squall.master.cluster.nodes import Node
from squall.master.cluster.state import Cluster

WRITE_TOKEN_SECS = 300.0
READ_TOKEN_MARGIN_SECS = 600.0


class Placement:
    def __init__(self, cluster: Cluster, key: bytes, require_receipts: bool = True) -> None:
        self.cluster, self.key, self.require_receipts = cluster, key, require_receipts
        # batch receipts checked by the last prove(): (receipt, blob, size, crc) -> outcome
        self._proven: dict[tuple[str, str, int, int], tuple[str, float] | Unauthorized] = {}
        self.recorded: list[str] = []  # blobs verify() recorded holders of since prove()
        # the blobs whose holders verify() proved since prove(), by their holders: recorded
        # in the cluster once per set of nodes by flush() (a front-door request's blobs all
        # share theirs), not once per blob
        self._holders: dict[tuple[str, ...], tuple[list[str], list[int]]] = {}
        # receipts -> the nodes they prove (node id -> address), checked once per request:
        # every blob of a batch receipt has the same node and time
        self._nodes_of: dict[tuple[str, ...], dict[str, str]] = {}

    def allocate(self, count: int, size_bytes: int) -> dict[str, Any]:
        c = self.cluster
        now = c.clock.now()
        alive = c.live(now, strict=True)
        quorum = c.s.quorum
        if len(alive) < quorum:
            draining = f" ({len(c.draining)} decommissioning)" if c.draining else ""
            raise Unavailable(
                f"{len(alive)} data node(s) alive and in service{draining}, a write needs "
                f"{quorum}: start data nodes "
                "(`squall datanode --master URL ...`) or wait for them to heartbeat",
                retry_after=c.s.heartbeat_interval_s)
        room = [n for n in alive if n.free_bytes >= size_bytes * count] or alive
        room.sort(key=lambda n: (n.used_bytes / max(1, n.capacity_bytes), random.random()))
        nodes = room[:c.s.replication_factor]
        if len(nodes) < quorum:
            nodes = alive[:c.s.replication_factor]
        replicas = [n.address for n in nodes]
        prefix = secrets.token_hex(8) + "-"
        ids = [f"{prefix}{i}" for i in range(count)]
        for b in ids:
            c.allocated[b] = now
        for n in nodes:  # count it as used until the next heartbeat says otherwise
            n.used_bytes += size_bytes * count
        expires = now + WRITE_TOKEN_SECS
        token = sign(self.key, "write", [], expires, prefix=prefix, count=count,
                     replicas=replicas)  # exactly these ids, no extra blob under it
        return {"blobs": [{"blob_id": b, "replicas": replicas} for b in ids],
                "token": token, "expires_at": expires, "write_quorum": quorum}

    def prove(self, refs: Iterable[PayloadRef]) -> None:
        """Check every batch receipt among `refs` (one request's payload references) once,
        against the set of references carrying it; :meth:`verify` then reads the outcome.
        Called in the same synchronous step as the plan that verifies `refs`."""
        self.flush()  # anything verified outside a proven plan (a schedule's payload)
        self._proven = {}
        self.recorded = []
        self._nodes_of = {}
        if not self.require_receipts:
            return
        groups: dict[str, list[PayloadRef]] = {}
        for p in refs:
            for r in p.receipts:
                if r.startswith(BATCH_RECEIPT_PREFIX):
                    groups.setdefault(r, []).append(p)
        for r, ps in groups.items():
            triples = [(p.blob_id, p.size, p.crc32c) for p in ps]
            try:
                proof: tuple[str, float] | Unauthorized = verify_batch_receipt(self.key, r,
                                                                               triples)
            except Unauthorized as e:
                proof = e
            for t in triples:
                self._proven[(r, *t)] = proof

    def _receipt(self, p: PayloadRef, r: str) -> tuple[str, float]:
        if not r.startswith(BATCH_RECEIPT_PREFIX):
            rec = verify_receipt(self.key, r, p.blob_id, p.size, p.crc32c)
            return rec.node_id, rec.issued_at
        proof = self._proven.get((r, p.blob_id, p.size, p.crc32c))
        if proof is None:
            raise Unauthorized("a batch receipt is only valid with its whole batch")
        if isinstance(proof, Unauthorized):
            raise proof
        return proof

    def verify(self, p: PayloadRef) -> dict[str, Any]:
        """The reference to store for `p`, or an error if its write quorum is not proven."""
        stored = {"blob_id": p.blob_id, "size": p.size, "crc32c": p.crc32c,
                  "replicas": list(p.replicas)}
        if not self.require_receipts:
            return stored
        key = tuple(p.receipts)
        nodes = self._nodes_of.get(key)
        if nodes is None or not self._batch_covers(p):
            nodes = self._check(p)
            if all(r.startswith(BATCH_RECEIPT_PREFIX) for r in key):
                self._nodes_of[key] = nodes  # the next blob of the batch: lookups only
        ids = tuple(nodes)
        blobs, sizes = self._holders.get(ids) or self._holders.setdefault(ids, ([], []))
        blobs.append(p.blob_id)
        sizes.append(p.size)
        self.recorded.append(p.blob_id)
        stored["replicas"] = [a for a in nodes.values() if a] or stored["replicas"]
        return stored

    def _batch_covers(self, p: PayloadRef) -> bool:
        """Every receipt of `p` is a batch receipt proven valid for its triple."""
        proven = self._proven
        for r in p.receipts:
            if not isinstance(proven.get((r, p.blob_id, p.size, p.crc32c)), tuple):
                return False
        return True

    def _check(self, p: PayloadRef) -> dict[str, str]:
        """The nodes (id -> address) whose receipts prove `p`'s write quorum, or the
        BadRequest saying why not."""
        c = self.cluster
        now = c.clock.now()
        nodes: dict[str, str] = {}
        for r in p.receipts:
            try:
                node_id, issued_at = self._receipt(p, r)
            except Unauthorized as e:
                raise BadRequest(f"payload {p.blob_id}: invalid receipt ({e.message})") from None
            if now - issued_at > c.s.orphan_grace_s / 2:
                raise BadRequest(f"payload {p.blob_id} was written {now - issued_at:.0f}s "
                                 "ago, too long before this enqueue: write it again")
            n = c.nodes.get(node_id)
            nodes[node_id] = n.address if n else ""
        if len(nodes) < c.s.quorum:
            raise BadRequest(
                f"payload {p.blob_id}: {len(nodes)} valid receipt(s) from distinct data nodes, "
                f"the write quorum is {c.s.quorum}; send the receipts from the blob write")
        return nodes

    def flush(self) -> None:
        """Record the holders :meth:`verify` proved since :meth:`prove`, once per set of
        nodes (called once the plan that verified them is built)."""
        holders, self._holders = self._holders, {}
        for ids, (blobs, sizes) in holders.items():
            self.cluster.record_holders_many(blobs, ids, sizes)

    def for_reader(self, payload: dict[str, Any] | None, until: float) -> dict[str, Any] | None:
        """`payload` with the live replicas first and a read token valid past `until`."""
        if payload is None:
            return None
        token = sign(self.key, "read", [payload["blob_id"]], until + READ_TOKEN_MARGIN_SECS)
        return {**payload, "replicas": self._replicas(payload, self.cluster.clock.now()),
                "token": token}

    def for_lease(self, tasks: list[dict[str, Any]]) -> str | None:
        """Put the live replicas first in each leased task's payload (which carries no
        token of its own) and return one read token covering every payload of `tasks`,
        valid past their leases' expiry; None when none has a payload."""
        ids: dict[str, None] = {}
        until, alive = 0.0, None
        for t in tasks:
            p = t["payload"]
            if p is not None:
                if alive is None:  # one liveness check per node for the whole answer
                    alive = self.cluster.not_dead(self.cluster.clock.now())
                t["payload"] = {**p, "replicas": self._replicas(p, alive=alive)}
                ids[p["blob_id"]] = None
                until = max(until, t["expires_at"])
        if not ids:
            return None
        return sign(self.key, "read", list(ids), until + READ_TOKEN_MARGIN_SECS)

    def _replicas(self, payload: dict[str, Any], now: float | None = None,
                  alive: dict[str, Node] | None = None) -> list[str]:
        live = [n.address for n in self.cluster.live_holders(payload["blob_id"], now, alive)]
        return live + [a for a in payload.get("replicas", ()) if a not in live]
