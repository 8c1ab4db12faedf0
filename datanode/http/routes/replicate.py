"""Node-to-node replication: ``PUT /v1/replicate/{blob_id}`` and
``POST /v1/replicate:batch-put``.

These take a ``replicate`` token (signed by a data node or the master with the cluster key)
and store only here: they never forward, which is what stops a fan-out from fanning out
again. The answer carries this node's receipt. Used by the write pipeline and by
heartbeat ``replicate`` commands (re-replication).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Header, Query, Request

from squall.common.checksum import parse_crc
from squall.common.errors import BadRequest
from squall.common.security.tokens import TokenClaims
from squall.common.server.http import JSON
from squall.common.wire.cluster import REPAIR_HEADER
from squall.datanode.http.deps import AuthH, BlobIdP, NodeDep
from squall.datanode.http.routes.batch import answers, check_scope, parse_batch, store_batch
from squall.datanode.http.routes.blobs import CrcH, LengthH
from squall.datanode.replication.pipeline import store_and_forward
from squall.datanode.service import DataNode

ReceiptQ = Annotated[Literal["blob", "batch"], Query(
    description="`batch`: one batch receipt for all the blobs instead of one each")]
RepairH = Annotated[str | None, Header(alias=REPAIR_HEADER, description="`1`: a "
                    "re-replication copy, written behind client writes")]
CutsQ = Annotated[str | None, Query(max_length=1024, description="with `receipt=batch`: "
                  "the frame counts of the client requests the batch carries, in order "
                  "(`n1,n2,...`): one batch receipt each (datanode/replication/coalesce.py)")]
MAX_CUTS = 64


async def replicate_blob(blob_id: BlobIdP, request: Request, node: NodeDep,
                         authorization: AuthH = None, crc: CrcH = None,
                         content_length: LengthH = None, repair: RepairH = None) -> JSON:
    """Store a copy of a blob sent by another node (no further forwarding)."""
    node.authorize(authorization, "replicate", blob_id)
    declared = parse_crc(crc)
    if content_length is not None:
        await node.store.run(node.store.check_space, content_length)
    res = await store_and_forward(node, blob_id, request.stream(), [], 1, declared,
                                  content_length, background=repair == "1")
    return JSON(res.model_dump())


async def replicate_batch(request: Request, node: NodeDep, authorization: AuthH = None,
                          receipt: ReceiptQ = "blob", repair: RepairH = None,
                          cuts: CutsQ = None) -> JSON:
    """Store copies of a batch of small blobs sent by another node, all or nothing.
    `receipt=batch`: answer one batch receipt for the lot instead of one per blob (the
    front door's forwards; the blob list is then left out); with `cuts`, one per slice of
    the frames (several client requests' forwards sharing this request)."""
    claims = node.authorize(authorization, "replicate", [])
    return JSON(await replicate_frames(node, claims, await request.body(), receipt,
                                       repair == "1", cuts))


def _cuts(cuts: str, n: int) -> list[int]:
    try:
        out = [int(c) for c in cuts.split(",")]
    except ValueError:
        raise BadRequest("cuts must be comma-separated frame counts") from None
    if not 1 <= len(out) <= MAX_CUTS or min(out) < 1 or sum(out) != n:
        raise BadRequest(f"cuts must be 1-{MAX_CUTS} positive counts adding up to the "
                         f"batch's {n} frames")
    return out


async def replicate_frames(node: DataNode, claims: TokenClaims, body: bytes, receipt: str,
                           background: bool = False, cuts: str | None = None
                           ) -> dict[str, Any]:
    """The batch route's work once authorized."""
    frames = parse_batch(body)
    check_scope(claims.covers, frames)
    sizes = _cuts(cuts, len(frames)) if cuts is not None and receipt == "batch" else None
    metas = await store_batch(node, frames, background)
    if sizes is not None:
        receipts, at = [], 0
        for k in sizes:
            receipts.append(node.batch_receipt(metas[at:at + k]))
            at += k
        return {"blobs": [], "node_id": node.node_id, "batch_receipts": receipts}
    if receipt == "batch":
        return {"blobs": [], "node_id": node.node_id,
                "batch_receipt": node.batch_receipt(metas)}
    return {"blobs": answers(node, metas, [], [])}
