"""Replicated writes: store locally and stream to the rest of the replica set in parallel.

The client PUTs to the first node of the replica set the master allocated, naming the
others (``?replicas=URL,URL``; the write token must list them, so a node only forwards
where the master said). That node:

1. takes the body part by part into its local upload; each chunk the upload completes
   (``chunk_bytes``, whatever the client's framing) goes into one bounded queue per peer
   (``forward_queue_chunks`` chunks: the slowest peer paces the upload, nothing is
   buffered whole);
2. each queue feeds a streaming ``PUT {peer}/v1/replicate/{blob_id}`` (``peers.py``) carrying a
   ``replicate`` token this node signs. The replicate endpoint never forwards again: it is
   the "do not fan out" flag;
3. commits locally (synced) while the peers finish, verifies each peer's receipt against
   the local size and CRC32C, and answers only when the write quorum (default: all of the
   replica set) holds the blob, listing every node with its receipt and every failed peer
   with its error. Without quorum the answer is 503 naming the failed peers (the copies
   that did land are orphans the master collects); a local failure fails the request
   with the local error (e.g. 507).

A peer that fails mid-stream stops being fed; the others go on. Heartbeat ``replicate``
commands reuse the same endpoint: :func:`copy_blob` streams a local blob to a target;
``replicate_batch`` commands (re-replication of many small blobs) use the batch endpoint:
:func:`copy_batch` reads them in groups and sends each group as one request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

from squall.common.checksum import CRC_HEADER
from squall.common.errors import StatusError, Unauthorized, Unavailable
from squall.common.security.tokens import verify_batch_receipt, verify_receipt
from squall.common.wire.cluster import (
    REPAIR_HEADER,
    PeerError,
    PutResult,
    ReplicationReport,
    StoredReplica,
)
from squall.common.wire.payload import OK, encode_frame
from squall.datanode.replication.peers import PeerResponse
from squall.datanode.service import DataNode
from squall.datanode.store.blobstore import BlobMeta, Upload

PeerOutcome: TypeAlias = StoredReplica | PeerError
COPY_BATCH_BYTES = 4 << 20  # data per batch replicate request of a replicate_batch command
# ... and blobs: a target stores each request in one transaction, in which a client's write
# waits (repair copies go behind client writes, but one that started runs to its end)
COPY_BATCH_BLOBS = 128


def _describe_http(address: str, r: PeerResponse) -> PeerError:
    code, message = "http_error", r.text[:300]
    with contextlib.suppress(ValueError, AttributeError, TypeError):
        err = r.json()["error"]
        code, message = str(err["code"]), str(err["message"])
    return PeerError(address=address, status=r.status_code, code=code, message=message)


def _transport(address: str, e: BaseException) -> PeerError:
    return PeerError(address=address, code="transport",
                     message=f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)


def _check_receipt(node: DataNode, address: str, r: PeerResponse, blob_id: str,
                   size: int, crc: int) -> PeerOutcome:
    if r.status_code != 200:
        return _describe_http(address, r)
    try:
        res = PutResult.model_validate_json(r.content)
        rep = res.stored[0]
        verify_receipt(node.key, rep.receipt, blob_id, size, crc, rep.node_id)
    except (ValueError, IndexError, Unauthorized) as e:
        return PeerError(address=address, status=200, code="bad_receipt",
                         message=f"no valid receipt for {blob_id} ({size} bytes, crc32c {crc}): "
                                 f"{e}")
    return StoredReplica(node_id=rep.node_id, address=address, receipt=rep.receipt)


class _Forward:
    """One upload streamed to one peer, fed through a bounded queue."""

    def __init__(self, node: DataNode, peer: str, blob_id: str, crc: int | None,
                 length: int | None) -> None:
        self.node, self.peer, self.blob_id = node, peer, blob_id
        self.queue: asyncio.Queue[memoryview | None] = asyncio.Queue(
            node.settings.forward_queue_chunks)
        self.dead = False
        headers = {"Authorization": "Bearer " + node.node_token("replicate", [blob_id]),
                   "Content-Type": "application/octet-stream"}
        if crc is not None:
            headers[CRC_HEADER] = str(crc)
        if length is not None:
            headers["Content-Length"] = str(length)
        self.task: asyncio.Task[PeerResponse | PeerError] = asyncio.create_task(
            self._run(headers))

    async def _body(self) -> AsyncIterator[memoryview]:
        while True:
            part = await self.queue.get()
            if part is None:
                return
            yield part

    async def _run(self, headers: dict[str, str]) -> PeerResponse | PeerError:
        assert self.node.peers is not None
        try:
            return await self.node.peers.put(f"{self.peer}/v1/replicate/{self.blob_id}",
                                             content=self._body(), headers=headers)
        except Exception as e:
            return _transport(self.peer, e)
        finally:
            self.dead = True  # stop feeding; free a producer blocked on a full queue
            while not self.queue.empty():
                self.queue.get_nowait()

    async def feed(self, part: memoryview | None) -> None:
        if not self.dead:
            await self.queue.put(part)


async def _commit(up: Upload) -> tuple[BlobMeta, bool] | StatusError:
    try:
        return await up.commit()
    except StatusError as e:
        return e


async def store_and_forward(node: DataNode, blob_id: str, body: AsyncIterator[bytes],
                            peers: list[str], quorum: int, crc: int | None,
                            length: int | None, background: bool = False) -> PutResult:
    """Store the streamed `body` locally and on `peers`; see the module docstring.
    `background`: a repair copy (written behind client writes)."""
    up = node.store.upload(blob_id, crc, background)
    fwds = [_Forward(node, p, blob_id, crc, length) for p in peers]
    try:
        async for part in body:
            for chunk in await up.write(part):
                for f in fwds:
                    await f.feed(chunk)
        tail = up.finish()
        for f in fwds:
            if tail is not None:
                await f.feed(tail)
            await f.feed(None)
        local, answers = await asyncio.gather(_commit(up),
                                              asyncio.gather(*(f.task for f in fwds)))
    except BaseException:
        for f in fwds:
            f.task.cancel()
        await up.abort()
        raise
    node.puts += 1
    node.forwarded += len(peers)
    if isinstance(local, StatusError):
        errs = [a for a in answers if isinstance(a, PeerError)]
        local.details = {"errors": [e.model_dump() for e in errs]} if errs else local.details
        raise local
    meta, _ = local
    outcomes = [a if isinstance(a, PeerError)
                else _check_receipt(node, f.peer, a, blob_id, meta.size, meta.crc32c)
                for f, a in zip(fwds, answers, strict=True)]
    return _answer(node, meta, outcomes, quorum)


def _answer(node: DataNode, meta: BlobMeta, outcomes: list[PeerOutcome],
            quorum: int) -> PutResult:
    stored = [StoredReplica(node_id=node.node_id, address=node.address,
                            receipt=node.receipt(meta))]
    stored += [o for o in outcomes if isinstance(o, StoredReplica)]
    errors = [o for o in outcomes if isinstance(o, PeerError)]
    node.peer_errors += len(errors)
    res = PutResult(blob_id=meta.blob_id, size=meta.size, crc32c=meta.crc32c, stored=stored,
                    errors=errors)
    if len(stored) < quorum:
        raise Unavailable(quorum_message(meta.blob_id, len(stored), len(outcomes) + 1, quorum,
                                         errors), details=res.model_dump(), retry_after=1)
    return res


def quorum_message(what: str, have: int, total: int, quorum: int,
                   errors: list[PeerError]) -> str:
    why = "; ".join(f"{e.address}: {e.message}" for e in errors)
    return (f"write quorum not met for {what}: durable on {have} of {total} replicas, "
            f"{quorum} needed; failed: {why}")


async def forward_batch(node: DataNode, body: bytes, metas: list[BlobMeta],
                        peers: list[str], batch_receipt: bool = False
                        ) -> list[dict[str, dict[str, str]] | PeerError]:
    """Send a batch body to each peer's batch replicate endpoint; per peer, a stored-replica
    entry (node_id, address, receipt) per blob, its receipt checked, or the peer's error (a
    batch is all or nothing on every node). `batch_receipt`: each peer signs one receipt
    for the whole batch (checked once), and every blob's entry carries it."""
    assert node.peers is not None
    ids = [m.blob_id for m in metas]
    headers = {"Authorization": "Bearer " + node.node_token("replicate", ids),
               "Content-Type": "application/octet-stream"}

    async def one(peer: str) -> dict[str, dict[str, str]] | PeerError:
        return await _post_batch(node, peer, body, headers, metas, batch_receipt)

    out = list(await asyncio.gather(*(one(p) for p in peers)))
    node.forwarded += len(peers)
    return out


async def _post_batch(node: DataNode, peer: str, body: bytes, headers: dict[str, str],
                      metas: list[BlobMeta], batch_receipt: bool = False
                      ) -> dict[str, dict[str, str]] | PeerError:
    """POST a batch body to a peer's batch replicate endpoint: a stored-replica entry per
    blob (its receipt checked against the blob's size and CRC32C), or the peer's error."""
    assert node.peers is not None
    try:
        r = await node.peers.post(f"{peer}/v1/replicate:batch-put"
                                  + ("?receipt=batch" if batch_receipt else ""),
                                  content=body, headers=headers)
    except Exception as e:
        return _transport(peer, e)
    if r.status_code != 200:
        return _describe_http(peer, r)
    try:  # plain JSON, not models: a hundred blobs' worth per batch
        if batch_receipt:
            ans = r.json()
            node_id, receipt = str(ans["node_id"]), str(ans["batch_receipt"])
            verify_batch_receipt(node.key, receipt, [(m.blob_id, m.size, m.crc32c)
                                                     for m in metas], node_id)
            entry = {"node_id": node_id, "address": peer, "receipt": receipt}
            return {m.blob_id: entry for m in metas}
        got = {b["blob_id"]: b["stored"][0] for b in r.json()["blobs"]}
        out = {}
        for m in metas:
            rep = got[m.blob_id]
            node_id, receipt = str(rep["node_id"]), str(rep["receipt"])
            verify_receipt(node.key, receipt, m.blob_id, m.size, m.crc32c, node_id)
            out[m.blob_id] = {"node_id": node_id, "address": peer, "receipt": receipt}
        return out
    except (ValueError, KeyError, IndexError, TypeError, Unauthorized) as e:
        return PeerError(address=peer, status=200, code="bad_receipt",
                         message=f"batch answer without valid receipts: {e}")


async def copy_blob(node: DataNode, blob_id: str, target: str,
                    token: str | None = None) -> ReplicationReport:
    """Stream a local blob to `target` (a heartbeat ``replicate`` command)."""
    assert node.peers is not None
    target = target.rstrip("/")
    meta = await node.store.run(node.store.stat, blob_id)
    if meta is None:
        return ReplicationReport(blob_id=blob_id, target=target, ok=False,
                                 error=f"{node.address} does not hold blob {blob_id}")
    headers: dict[str, Any] = {
        "Authorization": "Bearer " + (token or node.node_token("replicate", [blob_id])),
        CRC_HEADER: str(meta.crc32c), "Content-Length": str(meta.size),
        "Content-Type": "application/octet-stream", REPAIR_HEADER: "1"}
    try:
        r = await node.peers.put(f"{target}/v1/replicate/{blob_id}",
                                 content=node.repair_pacer.paced(node.store.stream(meta)),
                                 headers=headers)
    except Exception as e:
        return ReplicationReport(blob_id=blob_id, target=target, ok=False,
                                 error=_transport(target, e).message)
    o = _check_receipt(node, target, r, blob_id, meta.size, meta.crc32c)
    if isinstance(o, PeerError):
        return ReplicationReport(blob_id=blob_id, target=target, ok=False,
                                 error=f"{o.code}: {o.message}")
    return ReplicationReport(blob_id=blob_id, target=target, ok=True, receipt=o.receipt)


async def copy_batch(node: DataNode, blob_ids: list[str], target: str,
                     token: str | None = None) -> list[ReplicationReport]:
    """Copy many local blobs to `target` (a heartbeat ``replicate_batch`` command): small ones
    framed into ``POST /v1/replicate:batch-put`` requests of up to ``COPY_BATCH_BYTES``
    and ``COPY_BATCH_BLOBS``
    (each one transaction and one sync on the target), larger ones streamed one by one.
    One report per blob: a blob missing or corrupt here fails alone (a corrupt replica is
    dropped and reported as such), the rest still land."""
    target = target.rstrip("/")
    ids = list(dict.fromkeys(blob_ids))
    limit = min(node.settings.batch_blob_bytes_max, COPY_BATCH_BYTES)
    reports: list[ReplicationReport] = []
    large: list[str] = []
    frames: list[bytes] = []
    metas: list[BlobMeta] = []
    nbytes = 0

    def fail(blob_id: str, error: str) -> None:
        reports.append(ReplicationReport(blob_id=blob_id, target=target, ok=False,
                                         error=error))

    async def send() -> None:
        nonlocal frames, metas, nbytes
        if metas:
            reports.extend(await _send_batch(node, target, b"".join(frames), metas, token))
        frames, metas, nbytes = [], [], 0

    while ids:
        got = await node.store.run(node.store.read_small, ids, limit, COPY_BATCH_BYTES)
        ids = ids[len(got):]
        for sm in got:
            if sm.too_large:
                large.append(sm.blob_id)
            elif sm.meta is None and sm.error is None:
                fail(sm.blob_id, f"{node.address} does not hold blob {sm.blob_id}")
            elif sm.error is not None:
                fail(sm.blob_id, f"{node.address}: {sm.error.message}")
            else:
                assert sm.meta is not None
                if metas and (nbytes + sm.meta.size > COPY_BATCH_BYTES
                              or len(metas) >= COPY_BATCH_BLOBS):
                    await send()
                frames.append(encode_frame(sm.blob_id, sm.data, OK, sm.meta.crc32c))
                metas.append(sm.meta)
                nbytes += sm.meta.size
        await send()
    for blob_id in large:  # the master batches only small blobs; stream any other alone
        reports.append(await copy_blob(node, blob_id, target, token))
    return reports


async def _send_batch(node: DataNode, target: str, body: bytes, metas: list[BlobMeta],
                      token: str | None) -> list[ReplicationReport]:
    ids = [m.blob_id for m in metas]
    headers = {"Authorization": "Bearer " + (token or node.node_token("replicate", ids)),
               "Content-Type": "application/octet-stream", REPAIR_HEADER: "1"}
    await node.repair_pacer.take(len(body), len(metas))
    res = await _post_batch(node, target, body, headers, metas)
    if isinstance(res, PeerError):
        error = f"{res.code}: {res.message}"
        return [ReplicationReport(blob_id=b, target=target, ok=False, error=error)
                for b in ids]
    return [ReplicationReport(blob_id=b, target=target, ok=True, receipt=res[b]["receipt"])
            for b in ids]
