"""Pydantic models of the v1 wire protocol: the contract the OpenAPI document publishes.

Times on the wire are seconds since the epoch as floats (``expires_at``, ``not_before``);
durations are seconds (``lease_secs``, ``delay_secs``). Queue names inside a group's
update are bare names (``fetch``); the group is in the path.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from squall.common.wire.names import PID_MAX_BYTES

MAX_BATCH = 1000  # items per request, every batch form
MAX_LEASE_SECS = 7 * 86400.0
MAX_DELAY_SECS = 366 * 86400.0
MAX_WORKER_CHARS = 256
MAX_WAIT_SECS = 3600.0  # accepted on the wire; the master caps it (lease_wait_max_s)

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$"
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=NAME_PATTERN)]
Pid = Annotated[str, Field(min_length=1, max_length=PID_MAX_BYTES,
                           description="priority-ID: queues serve the smallest pid first")]
LEASE_TOKEN_PATTERN = r"^[0-9]{1,20}\.[0-9a-f]{32}$"
Token = Annotated[str, Field(
    min_length=34, max_length=53, pattern=LEASE_TOKEN_PATTERN,
    description="lease token, as the lease answered it: opaque, good for one lease of one "
                "task (`<fencing number>.<mac>`; the number grows with every lease)")]
LeaseSecs = Annotated[float, Field(gt=0, le=MAX_LEASE_SECS)]
DelaySecs = Annotated[float, Field(ge=0, le=MAX_DELAY_SECS)]
EpochSecs = Annotated[float, Field(ge=0, le=1e11)]


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class PayloadRef(_M):
    """Where a task's payload lives. The master never sees payload bytes, only this.

    On enqueue, `receipts` are the data nodes' signed receipts from the blob write (see
    ``common/security/tokens.py``): the master accepts the reference only with a write quorum of
    valid receipts for this blob id, size and checksum. In lease answers and task lookups,
    `replicas` lists the base URLs of live data nodes holding it. In task lookups, `token`
    is a read token for it; in lease answers it is absent, and the answer's `read_token`
    covers every payload of the answer (valid past the lease's expiry by a margin).
    """

    blob_id: Annotated[str, Field(min_length=1, max_length=128,
                                  pattern=r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,127}$")]
    size: Annotated[int, Field(ge=0, lt=1 << 53)]
    crc32c: Annotated[int, Field(ge=0, lt=1 << 32)]
    # `[]` made by a factory: pydantic deep-copies a literal `[]` default for every model it
    # validates (~0.8 us each here), and a lease answer validates one PayloadRef per task
    replicas: Annotated[list[Annotated[str, Field(max_length=512)]], Field(max_length=16)] = (
        Field(default_factory=list, json_schema_extra={"default": []}))
    receipts: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=16)] = (
        Field(default_factory=list, json_schema_extra={"default": []}))
    token: Annotated[str, Field(max_length=8192)] | None = None


class TaskSpec(_M):
    """One task to enqueue. Without `pid` the master assigns a FIFO pid."""

    pid: Pid | None = None
    payload: PayloadRef | None = None
    not_before: EpochSecs | None = Field(None, description="do not lease before this time")
    delay_secs: DelaySecs | None = Field(None, description="do not lease for this long")
    idempotency_key: Annotated[str, Field(min_length=1, max_length=128)] | None = Field(
        None, description="apply this enqueue at most once per group and key within the "
        "master's retention window (5 min), even if its task was dequeued since; a repeat "
        "answers collapsed with the first enqueue's queue and pid")


class EnqueueItem(TaskSpec):
    queue: Name


class TaskRef(_M):
    queue: Name
    pid: Pid
    token: Token


class RenewItem(TaskRef):
    lease_secs: LeaseSecs = 60.0


class ReleaseItem(TaskRef):
    delay_secs: DelaySecs | None = Field(
        None, description="keep the task invisible this long (default: none, or the queue's "
        "retry backoff when `error` is given)")
    error: Annotated[str, Field(max_length=4096)] | None = Field(
        None, description="the attempt failed: counts toward max_attempts, applies backoff, "
        "and is kept as the task's last error")
    unseen: bool = Field(
        False, description="the holder never started the task (it was leased ahead and is "
        "given back unread): this lease is not counted in `attempts`; not with `error`")

    @model_validator(mode="after")
    def _unseen_without_error(self) -> ReleaseItem:
        if self.unseen and self.error is not None:
            raise ValueError("`unseen` gives back a task that was never started; it cannot "
                             "carry an `error`")
        return self


class UpdateLease(_M):
    """Lease the next tasks in the same atomic update (ack a batch and take the next one in
    one round trip and one WAL record)."""

    queue: Name
    max_tasks: Annotated[int, Field(ge=1, le=MAX_BATCH)] = 1
    lease_secs: LeaseSecs | None = Field(None, description="default: the queue's policy, or 60")
    max_pid: Pid | None = Field(None, description="only lease tasks whose pid <= max_pid")
    worker: Annotated[str, Field(max_length=MAX_WORKER_CHARS)] = ""
    wait_secs: Annotated[float, Field(ge=0, le=MAX_WAIT_SECS)] | None = Field(
        None, description="when the update leases nothing at once, wait up to this long for "
        "a task (long polling, as a lease's wait_secs). The rest of the update is durable "
        "before the wait begins; the tasks then come from a later WAL record")


class UpdateRequest(_M):
    """Applied all or nothing, in this order: dequeue, renew, release, enqueue, lease."""

    enqueue: Annotated[list[EnqueueItem], Field(max_length=MAX_BATCH)] = []
    dequeue: Annotated[list[TaskRef], Field(max_length=MAX_BATCH)] = []
    renew: Annotated[list[RenewItem], Field(max_length=MAX_BATCH)] = []
    release: Annotated[list[ReleaseItem], Field(max_length=MAX_BATCH)] = []
    lease: UpdateLease | None = Field(
        None, description="then lease up to max_tasks of this queue of the group (never a "
        "task this update touched); they come back in `leased`")


class EnqueueRequest(_M):
    tasks: Annotated[list[TaskSpec], Field(min_length=1, max_length=MAX_BATCH)]


class EnqueueResult(_M):
    queue: str
    pid: str
    collapsed: bool = Field(description="true: a task with this pid was already queued")


class RenewResult(_M):
    queue: str
    pid: str
    expires_at: float


class LeasedTask(_M):
    queue: str
    pid: str
    token: str = Field(description="lease token: pass it back to dequeue, renew or release "
                       "(opaque; the fencing number it carries grows with every lease)")
    expires_at: float
    attempts: int = Field(description="times this task has been leased, this lease included")
    enqueued_at: float
    payload: PayloadRef | None = None


class UpdateResponse(_M):
    ticket: int = Field(description="WAL ticket of this update (0: nothing changed)")
    enqueued: list[EnqueueResult]
    dequeued: int
    renewed: list[RenewResult]
    released: int
    leased: list[LeasedTask] = Field([], description="tasks leased by the update's `lease`")
    read_token: str | None = Field(None, description="with `leased`: one read token for "
                                   "every payload of the leased tasks (see LeaseResponse)")


class EnqueueResponse(_M):
    ticket: int
    enqueued: list[EnqueueResult]


class LeaseRequest(_M):
    max_tasks: Annotated[int, Field(ge=1, le=MAX_BATCH)] = 1
    lease_secs: LeaseSecs | None = Field(None, description="default: the queue's policy, or 60")
    max_pid: Pid | None = Field(None, description="only lease tasks whose pid <= max_pid")
    worker: Annotated[str, Field(max_length=MAX_WORKER_CHARS)] = ""
    wait_secs: Annotated[float, Field(ge=0, le=MAX_WAIT_SECS)] | None = Field(
        None, description="when no task is available, wait up to this long for one "
        "(long polling; capped by the master's setting, 20 s by default): the answer comes "
        "as soon as a task is leased, or empty at the deadline")


class LeaseResponse(_M):
    ticket: int = Field(0, description="WAL ticket of this lease (0: nothing leased)")
    tasks: list[LeasedTask]
    read_token: str | None = Field(
        None, description="one read token covering the payload of every task here (their "
        "`payload.token` is absent): send it to the data nodes with each read of these "
        "payloads, as `Authorization: Bearer <read_token>` or the `token` of a batch-get; "
        "null when no task has a payload")


class TaskInfo(_M):
    queue: str
    pid: str
    state: str = Field(description="available | leased | delayed")
    attempts: int
    enqueued_at: float
    error: str | None = Field(None, description="last error, or why it was dead-lettered")
    origin: str | None = Field(None, description="queue a dead-lettered task came from")
    expires_at: float | None = None
    not_before: float | None = None
    worker: str | None = None
    worker_addr: str | None = None
    payload: PayloadRef | None = None


class CancelResponse(_M):
    ticket: int
    cancelled: str = Field(description="pid of the task removed")
    state: str = Field(description="what it was: available | delayed")


class QueueCounts(_M):
    group: str
    queue: str
    available: int
    leased: int
    delayed: int
    pending: int = Field(0, description="tasks enqueued through a data node whose payloads "
                         "are not confirmed on their write quorum yet: counted in `total`, "
                         "never leased until confirmed (usually milliseconds)")
    total: int
    completed: int = Field(description="tasks dequeued since the queue was created")
    enqueued_total: int


class Rates(_M):
    """Events per second, exponentially weighted over 1 and 5 minutes (soft state)."""

    enqueue_1m: float
    enqueue_5m: float
    lease_1m: float
    lease_5m: float
    dequeue_1m: float
    dequeue_5m: float


class LeasedSample(_M):
    pid: str
    worker: str
    worker_addr: str
    lease_age_secs: float
    expires_at: float


class QueueStats(QueueCounts):
    rates: Rates
    mean_lease_secs: float | None = Field(description="mean time from lease to dequeue")
    oldest_available_age_secs: float | None
    leased_sample: list[LeasedSample]


class QueueList(_M):
    queues: list[QueueCounts]
    next: str | None = Field(None, description="pass as `after` for the next page")


class ClusterStats(_M):
    queues: int
    available: int
    leased: int
    delayed: int
    pending: int = 0
    completed: int
    rates: Rates
    wal_ticket: int


class TaskList(_M):
    tasks: list[TaskInfo]
    next: str | None = Field(None, description="pass as `after` for the next page")


class Backoff(_M):
    """Delay before retry n (n = attempts so far): min(cap, base * factor**(n-1)) +- jitter."""

    base_secs: Annotated[float, Field(ge=0, le=MAX_DELAY_SECS)] = 1.0
    factor: Annotated[float, Field(ge=1, le=100)] = 2.0
    cap_secs: Annotated[float, Field(ge=0, le=MAX_DELAY_SECS)] = 300.0
    jitter: Annotated[float, Field(ge=0, le=1)] = 0.1


class Policy(_M):
    """Per queue, or per group as the default of its queues (a queue's fields win)."""

    max_attempts: Annotated[int, Field(ge=1, le=10_000)] | None = None
    dead_letter_queue: Name | None = Field(None, description="default: <queue>.dead")
    backoff: Backoff | None = None
    lease_secs: LeaseSecs | None = None


class RedriveRequest(_M):
    max_tasks: Annotated[int, Field(ge=1, le=MAX_BATCH)] = MAX_BATCH


class RedriveResponse(_M):
    ticket: int
    moved: int
    source: str


class DeleteResponse(_M):
    ticket: int
    deleted: int = Field(description="tasks the queue held; they are reaped in the background")


class ResetResponse(_M):
    ticket: int
    reset: int = Field(description="leases revoked")


class Schedule(_M):
    """A recurring task: at every slot start the master enqueues pid `<name>@<slot time>`."""

    queue: Name
    interval_secs: Annotated[float, Field(ge=1, le=MAX_DELAY_SECS)] | None = None
    cron: Annotated[str, Field(max_length=256)] | None = Field(
        None, description="cron expression (UTC), instead of interval_secs")
    payload: PayloadRef | None = None
    catch_up: Literal["one", "all"] = Field(
        "one", description="after downtime: enqueue the latest missed slot, or every one")


class ScheduleInfo(Schedule):
    name: str
    last_slot: float | None = Field(description="start of the last slot enqueued")
    next_slot: float = Field(description="start of the next slot")


class ScheduleList(_M):
    schedules: list[ScheduleInfo]


class ErrorBody(_M):
    code: str
    message: str
    details: object | None = None


class ErrorResponse(_M):
    error: ErrorBody


class DecommissionProgress(_M):
    requested_at: float = Field(description="when decommissioning was asked (epoch seconds)")
    blobs_remaining: int | None = Field(
        description="blobs it holds that do not have the replication factor on other nodes "
                    "yet (null until the node's next full block report)")


class NodeStatus(_M):
    node_id: str
    address: str
    state: str = Field(description="alive | suspect | dead | draining (being decommissioned: "
                       "no new blobs, its blobs are copied elsewhere) | decommissioned (every "
                       "blob it holds has the replication factor elsewhere: safe to stop "
                       "and forget)")
    health: str = Field("alive", description="from heartbeats: alive | suspect | dead "
                        "(unknown: marked, but not heard from since the master started)")
    last_beat_secs_ago: float | None
    capacity_bytes: int
    used_bytes: int
    free_bytes: int
    blob_count: int
    decommission: DecommissionProgress | None = Field(
        None, description="set while the node is draining or decommissioned")


class ForgetResponse(_M):
    forgotten: str = Field(description="the node id removed from the master's node table")


class BlobScanInfo(_M):
    passes: int = Field(description="finished passes of the scan for unreported blobs")
    running: bool
    scanned: int = Field(description="referenced blobs read in the current or last pass")
    unreported_last_pass: int = Field(description="referenced blobs the last pass found "
                                      "without a live replica")


class ClusterInfo(_M):
    nodes: list[NodeStatus]
    replication_factor: int
    write_quorum: int
    under_replicated: int = Field(description="referenced blobs below the replication factor")
    lost: int = Field(description="referenced blobs with no live replica (reported by no live "
                      "node, found by block reports or the blob scan)")
    copies_in_flight: int
    copy_bytes_in_flight: int = 0
    copies_waiting: int = Field(0, description="under-replicated blobs waiting for budget")
    copies_done: int = Field(0, description="re-replication copies finished since start")
    blobs: int
    blob_scan: BlobScanInfo | None = None
