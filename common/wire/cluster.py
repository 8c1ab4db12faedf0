"""Wire models between data nodes, the master and clients: blob ids, write answers with
receipts, and the heartbeat (request, answer, commands).

Heartbeat: every ``heartbeat_interval_s`` a data node POSTs a :class:`HeartbeatRequest` to
``{master}/v1/nodes/heartbeat``. Block reports are incremental: ``added`` / ``deleted`` list
blob ids committed / removed since the last *successful* beat. ``full`` beats carry the whole
inventory in ``blob_ids`` instead (the first beat after start, the first after a failed beat,
every ``full_report_every`` beats, and whenever the master asks with ``full_report``);
deltas are idempotent, so the master may apply one twice. ``corrupt`` names replicas the
node found damaged (by a read or the scrubber) and dropped; ``replicated`` reports the
outcome of replicate commands, with the target's receipt. Both are resent until a beat
succeeds.

The master answers a :class:`HeartbeatResponse`; the node executes its ``commands``:
``replicate`` streams a local blob to ``target``'s ``PUT /v1/replicate/{blob_id}`` (with the
given token, or one the node signs with the cluster key); ``replicate_batch`` sends many
small blobs to ``target``'s ``POST /v1/replicate:batch-put`` in one request (one report per
blob: a missing or corrupt source blob fails alone, the rest of the batch still lands);
``delete`` removes blobs. A command the node does not understand is logged and skipped, so
the master can add kinds.

Block reports may carry sizes (``blob_sizes`` parallel to ``blob_ids``, ``added_sizes``
parallel to ``added``): the master budgets re-replication by bytes and batches small blobs
with them. A report without them (or with lists of another length) is still valid.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from squall.common.errors import BadRequest
from squall.common.security.tokens import MAX_TOKEN_CHARS
from squall.common.wire.models import MAX_BATCH, EnqueueItem, Name, PayloadRef, Pid

TOKEN_ITEM_CHARS = 4096  # a token in a batch-get's `tokens` list: one covering a few ids
BLOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$"
BLOB_ID_RE = re.compile(BLOB_ID_PATTERN[1:-1])
BlobId = Annotated[str, Field(min_length=1, max_length=128, pattern=BLOB_ID_PATTERN)]
Url = Annotated[str, Field(min_length=1, max_length=512)]
MAX_COMMANDS = 10_000
REPAIR_HEADER = "x-squall-repair"  # "1" on a re-replication copy: written behind client writes
MAX_REPLICATE_BATCH = 1000  # blobs per replicate_batch command (the batch routes' limit)


def check_blob_id(blob_id: str) -> str:
    if not isinstance(blob_id, str) or not BLOB_ID_RE.fullmatch(blob_id):
        raise BadRequest(f"invalid blob id {str(blob_id)[:140]!r}: use 1-128 characters of "
                         "A-Z a-z 0-9 _ . - starting with a letter or digit")
    return blob_id


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _Lenient(BaseModel):
    """Answers a newer peer may extend: unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")


# -- write answers -------------------------------------------------------------------------
class StoredReplica(_Lenient):
    node_id: str
    address: str = Field(description="advertised base URL of the node")
    receipt: str = Field(description="signed proof that the node durably holds the blob")


class PeerError(_Lenient):
    address: str
    status: int | None = Field(None, description="HTTP status the peer answered, if any")
    code: str = Field("transport", description="error code (see errors.py) or 'transport'")
    message: str


class PutResult(_Lenient):
    """The answer to a blob write: where the bytes are durable, with receipts, and which
    replicas failed. Success means at least the write quorum is in `stored`."""

    blob_id: str
    size: int
    crc32c: int
    stored: list[StoredReplica]
    errors: list[PeerError] = []


class BatchPutResult(_Lenient):
    blobs: list[PutResult]
    node_id: str | None = Field(None, description="with `receipt=batch`: the node")
    batch_receipt: str | None = Field(None, description="with `receipt=batch`: one receipt "
                                      "for every blob of the batch (see common/security/tokens.py)")


class BatchGetRequest(_M):
    blob_ids: Annotated[list[BlobId], Field(min_length=1, max_length=1000)]
    tokens: Annotated[list[Annotated[str, Field(max_length=TOKEN_ITEM_CHARS)]] | None, Field(
        None, max_length=1000, description="one read token per blob id (e.g. those of task "
        "lookups), instead of an Authorization header covering them all")]
    token: Annotated[str, Field(max_length=MAX_TOKEN_CHARS)] | None = Field(
        None, description="one read token covering every blob id (e.g. a lease answer's "
        "`read_token`), instead of an Authorization header: a token covering many ids can "
        "be longer than proxies allow a header to be")


# -- heartbeat -----------------------------------------------------------------------------
class ReplicationReport(_M):
    blob_id: BlobId
    target: Url
    ok: bool
    receipt: str | None = Field(None, description="the target's receipt when ok")
    error: str | None = None


class HeartbeatRequest(_M):
    node_id: Annotated[str, Field(min_length=1, max_length=128)]
    address: Url = Field(description="advertised base URL, e.g. http://10.0.0.5:7071")
    started_at: float = Field(description="process start (epoch s): a change means a restart")
    seq: int = Field(ge=0, description="beat number since start")
    capacity_bytes: int = Field(ge=0, description="bytes this node may hold in total")
    used_bytes: int = Field(ge=0, description="payload bytes stored")
    free_bytes: int = Field(ge=0, description="bytes it can still take")
    blob_count: int = Field(ge=0)
    full: bool = Field(False, description="blob_ids is the complete inventory")
    blob_ids: list[BlobId] = []
    blob_sizes: list[Annotated[int, Field(ge=0)]] = Field(
        [], description="sizes in bytes, parallel to blob_ids (optional)")
    added: list[BlobId] = []
    added_sizes: list[Annotated[int, Field(ge=0)]] = Field(
        [], description="sizes in bytes, parallel to added (optional)")
    deleted: list[BlobId] = []
    corrupt: list[BlobId] = []
    replicated: list[ReplicationReport] = []


class ReplicateCommand(_Lenient):
    op: Literal["replicate"]
    blob_id: BlobId
    target: Url = Field(description="base URL of the node to copy the blob to")
    token: str | None = Field(None, description="replicate token for the target; without it "
                              "the node signs one itself")


class ReplicateBatchCommand(_Lenient):
    op: Literal["replicate_batch"]
    blob_ids: Annotated[list[BlobId], Field(min_length=1, max_length=MAX_REPLICATE_BATCH)]
    target: Url = Field(description="base URL of the node to copy the blobs to")
    token: str | None = Field(None, description="replicate token covering every blob id for "
                              "the target; without it the node signs one itself")


class DeleteCommand(_Lenient):
    op: Literal["delete"]
    blob_ids: Annotated[list[BlobId], Field(max_length=MAX_COMMANDS)]


Command = Annotated[ReplicateCommand | ReplicateBatchCommand | DeleteCommand,
                    Field(discriminator="op")]


class HeartbeatResponse(_Lenient):
    commands: Annotated[list[Command], Field(max_length=MAX_COMMANDS)] = []
    full_report: bool = Field(False, description="send the full inventory in the next beat")
    epoch: int = Field(0, ge=0, description="the answering leader's epoch on a master set "
                       "(0: a single master); a data node runs no delete command from an "
                       "epoch below the highest it has seen")
    revoked: Annotated[list[str], Field(max_length=100_000)] = Field(
        [], description="ids of revoked client credentials (data nodes refuse them)")


# -- blob ids for the three-request path (large payloads) ------------------------------
class AllocateRequest(_M):
    count: Annotated[int, Field(ge=1, le=MAX_BATCH)] = 1
    size_bytes: Annotated[int, Field(ge=0, lt=1 << 53)] = Field(
        0, description="expected bytes per blob (placement prefers nodes with room)")


class Allocation(_M):
    blob_id: str
    replicas: list[str] = Field(description="data node base URLs: PUT to the first with "
                                "?replicas= the others; it forwards to them")


class AllocateResponse(_M):
    blobs: list[Allocation]
    token: str = Field(description="write token covering every blob id here")
    expires_at: float
    write_quorum: int = Field(description="receipts the master needs on enqueue")


# -- the data-node front door (see datanode/frontdoor.py) ----------------------------------
class BlockRequest(_M):
    """A data node asks the master for a block of blob ids for front-door writes."""

    node_id: Annotated[str, Field(min_length=1, max_length=128)]
    count: Annotated[int, Field(ge=1, le=1_000_000)] = 1000  # ids are a prefix + counter


class BlockGrant(_Lenient):
    prefix: str = Field(description="blob ids are prefix + 0, 1, ... count-1")
    count: int
    expires_at: float = Field(description="no blob id of the block may be written after this")
    replicas: list[str] = Field(description="the peers to replicate the block's blobs to")
    write_quorum: int = Field(description="receipts the master needs per payload")


class NodeUpdate(_M):
    """One client request's enqueues, committed all or nothing."""

    group: Annotated[str, Field(min_length=1, max_length=128)]
    enqueue: Annotated[list[EnqueueItem], Field(min_length=1, max_length=MAX_BATCH)]
    # shared by every payload of the update that names none of its own (a front-door
    # request's blobs are on the same nodes, with one batch receipt per node): sent once,
    # not once per payload
    replicas: Annotated[list[Annotated[str, Field(max_length=512)]], Field(max_length=16)] = (
        Field(default_factory=list, json_schema_extra={"default": []}))
    receipts: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=16)] = (
        Field(default_factory=list, json_schema_extra={"default": []}))
    # the parallel put: the payloads are being stored on `replicas` while this is logged;
    # their tasks are pending (never leased) until a settle confirms them
    pending: bool = False


class SettleItem(_M):
    queue: Name
    pid: Pid
    payload: PayloadRef


class NodeSettle(_M):
    """A front-door request's pending tasks settled by their node: `durable` (confirm,
    with the write quorum's receipts, shared like an update's) or not (remove them: the
    request is answered as refused)."""

    group: Annotated[str, Field(min_length=1, max_length=128)]
    items: Annotated[list[SettleItem], Field(min_length=1, max_length=MAX_BATCH)]
    durable: bool
    replicas: Annotated[list[Annotated[str, Field(max_length=512)]], Field(max_length=16)] = (
        Field(default_factory=list, json_schema_extra={"default": []}))
    receipts: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=16)] = (
        Field(default_factory=list, json_schema_extra={"default": []}))


class NodeCommitRequest(_M):
    """Many clients' front-door enqueues, and settles of pending ones, in one
    node-to-master request."""

    node_id: Annotated[str, Field(min_length=1, max_length=128)]
    updates: Annotated[list[NodeUpdate], Field(max_length=MAX_BATCH)] = Field(
        default_factory=list, json_schema_extra={"default": []})
    settles: Annotated[list[NodeSettle], Field(max_length=MAX_BATCH)] = Field(
        default_factory=list, json_schema_extra={"default": []})


class NodeCommitResponse(_Lenient):
    results: list[dict[str, Any]] = Field(
        description="per update, in order: {\"ok\": UpdateResponse} or {\"error\": {...}}")
    settled: list[dict[str, Any]] = Field(
        default_factory=list, description="per settle, in order: {\"ok\": {\"confirmed\", "
        "\"removed\"}} or {\"error\": {...}}")
