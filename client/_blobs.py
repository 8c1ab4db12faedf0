"""Payload I/O as protocol generators: allocate blob ids on the master, write the bytes to
the replica set (one streamed ``PUT`` per large payload, ``:batch-put`` for many small
ones), and read them back from any healthy replica, verifying the CRC32C.

Write: ``POST /v1/blobs/allocate`` → ``PUT {replicas[0]}/v1/blobs/{id}?replicas=<rest>
&quorum=<write quorum>`` (the node forwards to the rest) → the answer's receipts go into
the enqueue's ``PayloadRef``. If the first node fails, the next one of the replica set
leads; if none can, the blobs are allocated again (the master places them on live nodes).

Read: replicas in the order the master gave, nodes that failed recently last. A replica
that is down, lacks the blob, is corrupt or sends bytes that fail the checksum is skipped.
A streamed read that breaks mid-way resumes on the next replica with ``Range``.

Batch read (:meth:`Blobs.read_many`): the small payloads of many tasks with one
``POST {node}/v1/blobs:batch-get`` per data node (with the lease answer's one read token
for them all, once); a frame that is missing, corrupt or fails the size / CRC32C check falls
back to :meth:`Blobs.read` of that one payload (the other replicas).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from squall.client._effects import Call, Close, Emit, Proto, Read, Reply, Retry, call
from squall.client._tasks import Stream
from squall.common.checksum import CRC_HEADER, Crc32c, crc32c
from squall.common.errors import (
    DataCorrupt,
    Forbidden,
    InsufficientStorage,
    NotFound,
    SquallError,
    StatusError,
    TransportError,
    Unauthorized,
    Unavailable,
)
from squall.common.wire.cluster import AllocateResponse, Allocation
from squall.common.wire.models import PayloadRef
from squall.common.wire.payload import (
    OK,
    batch_get_body,
    batch_get_headers,
    batch_groups,
    decode_frames,
    encode_frame,
    fewest_nodes,
)

BATCH_BLOB_BYTES = 256 << 10  # blobs up to this size go in :batch-put requests ...
BATCH_BODY_BYTES = 8 << 20  # ... of at most this many bytes
BATCH_GET_IDS = 1000  # blob ids per :batch-get request (the node's limit)
NODE_PENALTY_S = 30.0
NODES_TTL_S = 10.0  # how long the list of alive data nodes is used before it is asked again
_SKIP = (TransportError, StatusError)  # a replica failure: try the next replica
_FATAL = (Unauthorized, Forbidden)  # the token is wrong for every replica alike


class NodeBook:
    """Data nodes that failed recently: tried last for `penalty_s` seconds (a small cluster
    map refreshed on failure; the master's answers carry the replica lists)."""

    def __init__(self, penalty_s: float = NODE_PENALTY_S) -> None:
        self.penalty_s = penalty_s
        self._failed: dict[str, float] = {}

    def failed(self, url: str) -> None:
        self._failed[url] = time.monotonic()

    def order(self, urls: Iterable[str]) -> list[str]:
        urls = list(urls)
        if not self._failed:
            return urls
        now = time.monotonic()
        bad = {u: t for u in urls if now - (t := self._failed.get(u, -1e18)) < self.penalty_s}
        return [u for u in urls if u not in bad] + sorted(bad, key=bad.__getitem__)

    def usable(self, urls: Iterable[str]) -> list[str]:
        """`urls` that did not fail recently, or, when all did, the one that failed
        longest ago."""
        order = self.order(urls)
        if not self._failed or not order:
            return order
        now = time.monotonic()
        ok = [u for u in order if now - self._failed.get(u, -1e18) >= self.penalty_s]
        return ok or order[:1]


class AliveNodes:
    """The data nodes the master lists as alive (``GET /v1/cluster``, asked again after
    ``NODES_TTL_S``) for requests sent straight to a node: each request starts one node
    further on, with the nodes `book` saw fail recently last."""

    def __init__(self, retry: Retry, book: NodeBook) -> None:
        self.retry, self.book = retry, book
        self.urls: list[str] = []
        self.at = -1e18
        self.turn = 0

    def next_order(self) -> Proto[list[str]]:
        """The nodes to try for one request, in order; none: use the master's path."""
        if time.monotonic() - self.at >= NODES_TTL_S:
            try:
                ans = yield from call(Call("GET", "/v1/cluster", retries=0), self.retry)
                self.urls = [n["address"] for n in ans.get("nodes", ())
                             if n.get("state") == "alive"]
            except SquallError:
                self.urls = []
            self.at = time.monotonic()
        if not self.urls:
            return []
        self.turn += 1
        k = self.turn % len(self.urls)
        return self.book.order(self.urls[k:] + self.urls[:k])

    def rest(self) -> None:
        """No node for ``NODES_TTL_S``: the requests take the master's path meanwhile."""
        self.urls, self.at = [], time.monotonic()


def _auth(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class Blobs:
    """Payload writes and reads (generators; see ``_effects.py``)."""

    def __init__(self, retry: Retry, timeout_s: float, nodes: NodeBook | None = None) -> None:
        self.retry = retry
        self.timeout_s = timeout_s
        self.nodes = nodes or NodeBook()

    # -- write ---------------------------------------------------------------------------
    def allocate(self, count: int, size_hint: int) -> Proto[AllocateResponse]:
        ans = yield from call(Call("POST", "/v1/blobs/allocate",
                                   json={"count": count, "size_bytes": size_hint}), self.retry)
        return AllocateResponse.model_validate(ans)

    def write_all(self, sources: list[bytes | Stream]) -> Proto[list[dict[str, Any]]]:
        """Store every payload on its replica set; their PayloadRef dicts, in order.
        Payloads whose replicas all failed are allocated again once (fresh placement)."""
        refs: list[dict[str, Any]] = [{} for _ in sources]
        todo = list(range(len(sources)))
        for again in (False, True):
            size_hint = max((len(s) if isinstance(s, bytes) else s.size or 0)
                            for s in (sources[i] for i in todo))
            alloc = yield from self.allocate(len(todo), size_hint)
            failed: list[int] = []
            for group in self._plan(alloc, [sources[i] for i in todo]):
                try:
                    got = yield from self._write_group(alloc, group)
                except _FATAL:
                    raise
                except _SKIP:
                    if again or any(isinstance(src, Stream) for _, src in group):
                        raise
                    failed += [todo[k] for k, _ in group]
                    continue
                for (k, _), ref in zip(group, got, strict=True):
                    refs[todo[k]] = ref
            if not failed:
                break
            todo = failed
        return refs

    def _plan(self, alloc: AllocateResponse, sources: list[bytes | Stream]
              ) -> Iterator[list[tuple[int, bytes | Stream]]]:
        """Groups of (index, source) written by one request: small blobs with the same
        replica set batched up to BATCH_BODY_BYTES, every other blob alone."""
        batches: dict[tuple[str, ...], list[tuple[int, bytes | Stream]]] = {}
        sizes: dict[tuple[str, ...], int] = {}
        for k, src in enumerate(sources):
            if isinstance(src, Stream) or len(src) > BATCH_BLOB_BYTES:
                yield [(k, src)]
                continue
            key = tuple(alloc.blobs[k].replicas)
            if sizes.get(key, 0) + len(src) > BATCH_BODY_BYTES and batches.get(key):
                yield batches.pop(key)
                sizes[key] = 0
            batches.setdefault(key, []).append((k, src))
            sizes[key] = sizes.get(key, 0) + len(src)
        yield from batches.values()

    def _write_group(self, alloc: AllocateResponse, group: list[tuple[int, bytes | Stream]]
                     ) -> Proto[list[dict[str, Any]]]:
        allocs = [alloc.blobs[k] for k, _ in group]
        if len(group) == 1:
            ref = yield from self._put_one(allocs[0], alloc.token, alloc.write_quorum,
                                           group[0][1])
            return [ref]
        items = [(a.blob_id, src, crc32c(src)) for a, (_, src) in zip(allocs, group,
                                                                      strict=True)
                 if isinstance(src, bytes)]
        body = b"".join(encode_frame(b, d, crc=c) for b, d, c in items)
        ans = yield from self._to_replicas(
            allocs[0].replicas, alloc.write_quorum,
            lambda head, peers: Call("POST", f"{head}/v1/blobs:batch-put", content=body,
                                     params=self._params(peers, alloc.write_quorum),
                                     headers={**_auth(alloc.token),
                                              "Content-Type": "application/octet-stream"},
                                     timeout=self.timeout_s, retries=1))
        by_id = {r["blob_id"]: r for r in ans["blobs"]}
        return [self._ref(by_id[b], c, len(d), alloc.write_quorum) for b, d, c in items]

    def _put_one(self, a: Allocation, token: str, quorum: int, src: bytes | Stream
                 ) -> Proto[dict[str, Any]]:
        url = f"/v1/blobs/{a.blob_id}"
        if isinstance(src, bytes):
            crc = crc32c(src)
            headers = {**_auth(token), CRC_HEADER: str(crc)}
            ans = yield from self._to_replicas(
                a.replicas, quorum,
                lambda head, peers: Call("PUT", head + url, content=src, headers=headers,
                                         params=self._params(peers, quorum),
                                         timeout=self.timeout_s, retries=1))
            return self._ref(ans, crc, len(src), quorum)
        counted = Crc32c()
        headers = _auth(token)
        if src.size is not None:
            headers["Content-Length"] = str(src.size)
        head, peers = a.replicas[0], a.replicas[1:]
        try:
            ans = yield from call(Call("PUT", head + url, content=_counting(src.parts, counted),
                                       headers=headers, params=self._params(peers, quorum),
                                       timeout=self.timeout_s, idempotent=False), self.retry)
        except TransportError:
            self.nodes.failed(head)
            raise
        return self._ref(ans, counted.value, counted.size, quorum)

    def _to_replicas(self, replicas: list[str], quorum: int, make: Any) -> Proto[Any]:
        """Send the write to the first replica that takes it, with the others as its
        forward set."""
        err: SquallError = Unavailable("no replicas allocated")
        for head in self.nodes.order(replicas):
            try:
                return (yield from call(make(head, [u for u in replicas if u != head]),
                                        self.retry))
            except _FATAL:
                raise
            except (TransportError, Unavailable, InsufficientStorage, DataCorrupt) as e:
                self.nodes.failed(head)
                err = e
        raise err

    @staticmethod
    def _params(peers: list[str], quorum: int) -> dict[str, str]:
        p = {"quorum": str(min(quorum, 1 + len(peers)))}
        if peers:
            p["replicas"] = ",".join(peers)
        return p

    @staticmethod
    def _ref(ans: dict[str, Any], crc: int, size: int, quorum: int) -> dict[str, Any]:
        if ans.get("crc32c") != crc or ans.get("size") != size:
            raise DataCorrupt(f"blob {ans.get('blob_id')}: the data node stored "
                              f"{ans.get('size')} bytes with CRC32C {ans.get('crc32c')}, "
                              f"the client sent {size} bytes with CRC32C {crc}")
        stored = ans.get("stored") or []
        if len(stored) < quorum:
            raise Unavailable(f"blob {ans.get('blob_id')} is durable on {len(stored)} "
                              f"replicas; the write quorum is {quorum}")
        return {"blob_id": ans["blob_id"], "size": size, "crc32c": crc,
                "replicas": [s["address"] for s in stored],
                "receipts": [s["receipt"] for s in stored]}

    # -- read ----------------------------------------------------------------------------
    def read(self, ref: PayloadRef) -> Proto[bytes]:
        """The whole payload, checked against its size and CRC32C before it is returned;
        any replica that fails is skipped."""
        errors: list[SquallError] = []
        for node in self._replicas(ref):
            c = Call("GET", f"{node}/v1/blobs/{ref.blob_id}", headers=_auth(ref.token),
                     raw=True, timeout=self.timeout_s, retries=0)
            try:
                reply: Reply = yield from call(c, self.retry)
            except _FATAL:
                raise
            except _SKIP as e:
                self.nodes.failed(node)
                errors.append(e)
                continue
            data = reply.content
            if len(data) == ref.size and crc32c(data) == ref.crc32c:
                return data
            self.nodes.failed(node)
            errors.append(DataCorrupt(f"{node}: {len(data)} bytes with CRC32C "
                                      f"{crc32c(data)}, expected {ref.size} / {ref.crc32c}"))
        raise _unreadable(ref, errors)

    def read_many(self, refs: list[PayloadRef]) -> Proto[list[bytes | SquallError]]:
        """The payloads of `refs` (all small: ≤ BATCH_BLOB_BYTES), in order, each checked
        against its size and CRC32C: one batch-get per data node, then one read per payload
        the batch did not deliver whole. An entry is the error if no replica had it."""
        out: list[bytes | SquallError | None] = [None] * len(refs)
        for node, idx in self._read_groups(refs):
            toks = [refs[i].token or "" for i in idx]
            c = Call("POST", f"{node}/v1/blobs:batch-get", raw=True, timeout=self.timeout_s,
                     retries=0, json=batch_get_body([refs[i].blob_id for i in idx], toks),
                     headers=batch_get_headers(toks))
            try:
                reply: Reply = yield from call(c, self.retry)
                frames = {f.blob_id: f for f in decode_frames(reply.content, verify=False)}
            except _FATAL:
                raise
            except _SKIP:  # incl. BadRequest: a truncated answer
                self.nodes.failed(node)
                continue
            for i in idx:
                f, ref = frames.get(refs[i].blob_id), refs[i]
                if (f is not None and f.status == OK and len(f.data) == ref.size
                        and crc32c(f.data) == ref.crc32c):
                    out[i] = f.data
        for i, got in enumerate(out):
            if got is None:
                try:
                    out[i] = yield from self.read(refs[i])
                except _FATAL:
                    raise
                except SquallError as e:
                    out[i] = e
        return [x for x in out if x is not None]

    def _read_groups(self, refs: list[PayloadRef]) -> list[tuple[str, list[int]]]:
        """(node, indexes): the blobs spread over as few nodes as their replicas allow
        (those that failed recently last), requests within the batch-get bounds (ids and
        bytes). With RF 2 on three nodes any two hold everything: a lease's payloads take
        at most two batch-gets, not one per node."""
        idx = [i for i, r in enumerate(refs) if r.replicas and r.token]
        nodes = fewest_nodes([self.nodes.usable(refs[i].replicas) for i in idx])
        return batch_groups(((i, node, refs[i].token or "", refs[i].size)
                             for i, node in zip(idx, nodes, strict=True)),
                            BATCH_GET_IDS, BATCH_BODY_BYTES)

    def iter_read(self, ref: PayloadRef, chunk_bytes: int) -> Proto[None]:
        """Stream the payload (Emit per chunk). A replica that breaks mid-way is replaced by
        the next, resuming at the same byte. The CRC32C of everything emitted is checked at
        the end: a mismatch raises DataCorrupt (the bytes are already out: fail loudly)."""
        pos, crc = 0, Crc32c()
        errors: list[SquallError] = []
        for node in self._replicas(ref):
            headers = _auth(ref.token)
            if pos:
                headers["Range"] = f"bytes={pos}-"
            c = Call("GET", f"{node}/v1/blobs/{ref.blob_id}", headers=headers, stream=True,
                     timeout=self.timeout_s, retries=0)
            try:
                reply: Reply = yield from call(c, self.retry)
                while part := (yield Read(reply)):
                    if pos + len(part) > ref.size:
                        raise DataCorrupt(f"{node}: blob {ref.blob_id} is longer than "
                                          f"{ref.size} bytes")
                    crc.update(part)
                    pos += len(part)
                    for i in range(0, len(part), chunk_bytes):
                        yield Emit(part[i:i + chunk_bytes])
                yield Close(reply)
            except _FATAL:
                raise
            except _SKIP as e:
                self.nodes.failed(node)
                errors.append(e)
                continue
            if pos == ref.size:
                break
            self.nodes.failed(node)
            errors.append(TransportError(f"{node}: stream ended at byte {pos} of {ref.size}"))
        if pos != ref.size:
            raise _unreadable(ref, errors)
        if crc.value != ref.crc32c:
            raise DataCorrupt(f"blob {ref.blob_id}: CRC32C of the {pos} bytes read is "
                              f"{crc.value}, expected {ref.crc32c}")

    def _replicas(self, ref: PayloadRef) -> list[str]:
        if not ref.replicas:
            raise Unavailable(f"blob {ref.blob_id} has no live replica right now (its data "
                              "nodes are down); try again when they are back")
        return self.nodes.order(ref.replicas)


def _counting(parts: Iterable[bytes], crc: Crc32c) -> Iterator[bytes]:
    for p in parts:
        crc.update(p)
        yield p


def _unreadable(ref: PayloadRef, errors: list[SquallError]) -> SquallError:
    why = "; ".join(str(e) for e in errors[-4:])
    msg = f"no replica of blob {ref.blob_id} could be read ({len(errors)} tried): {why}"
    if any(isinstance(e, DataCorrupt) for e in errors):
        return DataCorrupt(msg)
    if all(isinstance(e, NotFound) for e in errors):
        return NotFound(msg)
    if all(isinstance(e, TransportError) for e in errors):
        return TransportError(msg)
    return Unavailable(msg)
