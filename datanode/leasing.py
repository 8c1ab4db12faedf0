"""Leases answered with their payloads by a data node (docs/decisions/0029).

    consumer --POST {node}/v1/groups/{g}/queues/{q}/lease--> data node
      1. the node sends the lease to the master with the consumer's own credential (the
         master's lease route, or its update route when acknowledgements ride on it): the
         master checks that credential as for a direct lease, leases, answers
      2. the node attaches the small payloads of the leased tasks: those it holds, read
         here (on the event loop when the bytes are few, see ``store/reads.py``), the
         rest fetched from their replicas with one batch-get per peer, concurrently; each
         checked against the size and CRC32C the master's answer gives
      3. the answer is the master's JSON answer as it came, followed by the payloads as
         batch frames (``common/wire/payload.py``, ``encode_lease_answer``)

One client round trip per batch instead of two (the lease on the master, a batch read per
data node). A payload the node could not get (a peer down, larger than ``BLOB_BYTES``, or
beyond ``ANSWER_BYTES`` in all) is simply absent: the client reads it from its replicas,
as after a direct lease.

Failures: the master refused (its status and error, as they came); the master unreachable
before the request was sent: 503, nothing leased (the client leases elsewhere); the
request sent and no answer: 502 ``outcome_unknown`` (tasks may have been leased: they come
back when their lease expires; acknowledgements riding on it may have been applied).

:func:`lease_for` is the whole of it as a plain coroutine, callable in process by any
route of the node that leases on a consumer's behalf.

Test hook: ``SQUALL_TEST_CRASH=lease_after_master`` makes the node SIGKILL itself once the
master answered a lease it sent (crash tests only).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from squall.common.checksum import crc32c
from squall.common.errors import OutcomeUnknown, Unavailable, from_response
from squall.common.wire.payload import OK, batch_get_headers, decode_frames, fewest_nodes
from squall.datanode import masterlink
from squall.datanode.replication.peers import PeerUnreachable

if TYPE_CHECKING:
    from squall.datanode.service import DataNode
    from squall.datanode.store.reads import Small

log = logging.getLogger("squall.datanode.leasing")
BLOB_BYTES = 256 << 10  # payloads up to this size come with the answer (the client's batch limit)
ANSWER_BYTES = 8 << 20  # payload bytes one answer carries at most
PEER_IDS = 1000  # blob ids per batch-get to a peer (its limit)
# test hook: SQUALL_TEST_CRASH=lease_after_master makes the node SIGKILL itself once the
# master answered a lease it sent, before answering the consumer (crash tests only)
_CRASH = os.environ.get("SQUALL_TEST_CRASH", "") == "lease_after_master"


@dataclass
class Leased:
    """A lease taken for a consumer: the master's answer and the payloads attached."""

    answer: bytes  # the master's JSON answer, as it came
    tasks: list[dict[str, Any]]  # its leased tasks (``tasks``, or an update's ``leased``)
    read_token: str | None
    payloads: dict[str, bytes] = field(default_factory=dict)  # blob id -> checked bytes
    from_peers: int = 0  # how many of them came from other nodes


async def lease_for(node: DataNode, group: str, queue: str, lease: dict[str, Any],
                    authorization: str, dequeue: Sequence[dict[str, Any]] = ()) -> Leased:
    """Lease on the master for the holder of `authorization` (a consumer's bearer
    credential, checked by the master): `lease` is a LeaseRequest body; `dequeue` task
    refs (queue, pid, token) of the group to acknowledge in the same atomic update. The
    small payloads of the leased tasks come attached (those that could be read)."""
    if dequeue:
        path = f"/v1/groups/{group}/update"
        body: dict[str, Any] = {"dequeue": list(dequeue), "lease": {**lease, "queue": queue}}
    else:
        path, body = f"/v1/groups/{group}/queues/{queue}/lease", lease
    raw = await _master(node, path, body, authorization, float(lease.get("wait_secs") or 0))
    if _CRASH:
        log.warning("SQUALL_TEST_CRASH=lease_after_master: killing myself")
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        doc = orjson.loads(raw)
        tasks = doc["leased"] if dequeue else doc["tasks"]
        read_token = doc.get("read_token")
        if not isinstance(tasks, list):
            raise TypeError("tasks is not a list")
    except (orjson.JSONDecodeError, KeyError, TypeError) as e:
        raise OutcomeUnknown(f"the master's answer to a lease did not parse on this data "
                             f"node ({e}); leased tasks come back when their lease "
                             "expires") from e
    got = Leased(raw, tasks, read_token)
    if read_token:
        await _attach(node, got)
    return got


async def _master(node: DataNode, path: str, body: dict[str, Any], authorization: str,
                  wait_s: float) -> bytes:
    if node.masters is None:
        raise Unavailable("this data node has no master (--master): it cannot lease")
    assert node.peers is not None
    try:  # never resent once sent: a lease is not idempotent
        r = await masterlink.request(node.peers, node.masters, "POST", path,
                                     orjson.dumps(body),
                                     {"Authorization": authorization,
                                      "Content-Type": "application/json"},
                                     timeout=node.settings.peer_timeout_s + wait_s)
    except PeerUnreachable as e:
        if e.sent:
            raise OutcomeUnknown(f"the master may have leased tasks for this request, but "
                                 f"its answer did not reach this data node ({e}); they come "
                                 "back when their lease expires, and acknowledgements sent "
                                 "with it may have been applied") from e
        raise Unavailable(f"the master is unreachable from this node ({e}); nothing was "
                          "leased, retry", retry_after=1) from e
    if r.status_code >= 400:
        try:
            err = orjson.loads(r.content) if r.content else {}
        except orjson.JSONDecodeError:
            err = {}
        ra = r.headers.get("retry-after")
        raise from_response(r.status_code, err, float(ra) if ra and ra.isdigit() else None)
    return r.content


def _wanted(node: DataNode, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The payload refs to attach: small ones, up to ANSWER_BYTES in all."""
    out: list[dict[str, Any]] = []
    total = 0
    for t in tasks:
        p = t.get("payload") if isinstance(t, dict) else None
        if not isinstance(p, dict) or not isinstance(p.get("size"), int):
            continue
        size = p["size"]
        if size > BLOB_BYTES or total + size > ANSWER_BYTES:
            continue
        total += size
        out.append(p)
    return out


def _good(ref: dict[str, Any], data: bytes, crc: int | None = None) -> bool:
    return len(data) == ref["size"] and (crc32c(data) if crc is None else crc) == ref["crc32c"]


async def _attach(node: DataNode, got: Leased) -> None:
    refs = _wanted(node, got.tasks)
    if not refs:
        return
    here = [r for r in refs if node.address in (r.get("replicas") or ())]
    found = await read_here(node, [r["blob_id"] for r in here])
    for r in here:
        s = found.get(r["blob_id"])
        if s is not None and s.error is None and not s.too_large and s.meta is not None \
                and _good(r, s.data, s.meta.crc32c):
            got.payloads[r["blob_id"]] = s.data
    rest = [r for r in refs if r["blob_id"] not in got.payloads]
    if rest:
        got.from_peers = await _from_peers(node, rest, got)


async def read_here(node: DataNode, ids: list[str]) -> dict[str, Small]:
    """Blobs of `ids` this node holds (absent: not here), read on the event loop when
    the bytes are few (``read_small_now``), else on read threads."""
    out: dict[str, Small] = {}
    store, limit = node.store, node.settings.batch_blob_bytes_max
    while ids:
        now = store.read_small_now(ids, limit)
        part = now if now else await store.run(store.read_small, ids, limit, ANSWER_BYTES)
        for s in part:
            if s.meta is not None:
                out[s.blob_id] = s
        node.gets += sum(1 for s in part if s.error is None and s.meta is not None)
        ids = ids[len(part):]
    return out


async def _from_peers(node: DataNode, refs: list[dict[str, Any]], got: Leased) -> int:
    """Fetch `refs` from their replicas, from as few peers as they allow, one batch-get
    per peer, concurrently; a peer that fails leaves its payloads to the client."""
    by_peer: dict[str, list[dict[str, Any]]] = {}
    peers = fewest_nodes([[u for u in r.get("replicas") or () if u != node.address]
                          for r in refs])
    for r, peer in zip(refs, peers, strict=True):
        if peer:
            by_peer.setdefault(peer, []).append(r)

    async def one(peer: str, group: list[dict[str, Any]]) -> int:
        n = 0
        for i in range(0, len(group), PEER_IDS):
            part = group[i:i + PEER_IDS]
            body = {"blob_ids": [r["blob_id"] for r in part], "token": got.read_token}
            assert node.peers is not None
            try:
                ans = await node.peers.post(peer + "/v1/blobs:batch-get",
                                            content=orjson.dumps(body),
                                            headers={"Content-Type": "application/json",
                                                     **batch_get_headers([got.read_token or ""])})
                if ans.status_code != 200:
                    raise PeerUnreachable(f"HTTP {ans.status_code}")
                frames = {f.blob_id: f for f in decode_frames(ans.content, verify=False)}
            except Exception as e:  # down, refused, a truncated answer: the client reads them
                node.peer_errors += 1
                log.info("lease for a consumer: no payloads from %s (%s)", peer, e)
                return n
            for r in part:
                f = frames.get(r["blob_id"])
                if f is not None and f.status == OK and _good(r, f.data):
                    got.payloads[r["blob_id"]] = f.data
                    n += 1
        return n

    counts = await asyncio.gather(*(one(p, g) for p, g in by_peer.items()))
    return sum(counts)
