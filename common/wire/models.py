"""Pydantic models of the v1 wire protocol: the contract the OpenAPI document publishes.

Times on the wire are seconds since the epoch as floats (``expires_at``, ``not_before``);
durations are seconds (``lease_secs``, ``delay_secs``). Queue names inside a group's
update are bare names (``fetch``); the group is in the path.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

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


KEY_PATTERN = NAME_PATTERN
FlowKey = Annotated[str, Field(
    min_length=1, max_length=128, pattern=KEY_PATTERN,
    description="flow-control key (a tenant, a customer, a domain): the queue's policy may "
                "limit the tasks of one key leased at once or per second, and lease keys "
                "fairly; 1-128 characters of A-Z a-z 0-9 _ . : - starting with a letter or "
                "digit")]


# W3C Trace Context (https://www.w3.org/TR/trace-context/), version 00 only: a
# traceparent is exactly 55 characters; a tracestate at most 32 list members of at most
# 512 characters in all (the spec's limit for what a vendor must propagate)
TRACEPARENT_PATTERN = r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
TRACESTATE_MAX_CHARS, TRACESTATE_MAX_MEMBERS = 512, 32
_TS_MEMBER = re.compile(r"[a-z0-9][a-z0-9_\-*/]{0,240}(@[a-z][a-z0-9_\-*/]{0,13})?="
                        r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")
Traceparent = Annotated[str, Field(
    min_length=55, max_length=55, pattern=TRACEPARENT_PATTERN,
    description="W3C traceparent of the producer's span (`00-<trace id>-<span id>-<flags>`, "
                "lower-case hex, ids not all zero): handed back with every lease of the task")]
Tracestate = Annotated[str, Field(
    max_length=TRACESTATE_MAX_CHARS,
    description="W3C tracestate going with `traceparent` (at most 32 `key=value` members)")]
RESULT_MAX_BYTES = 64 * 1024  # a batch member's result (UTF-8), see master/tasks/batches.py
MAX_DEBOUNCE_SECS = 86400.0


def check_traceparent(tp: str) -> str:
    """A traceparent that matched TRACEPARENT_PATTERN, refused when an id is all zeros."""
    if tp[3:35] == "0" * 32 or tp[36:52] == "0" * 16:
        raise ValueError("traceparent: the trace id and the parent id must not be all zeros")
    return tp


def check_tracestate(ts: str) -> str:
    members = [m.strip(" \t") for m in ts.split(",")]
    members = [m for m in members if m]
    if len(members) > TRACESTATE_MAX_MEMBERS:
        raise ValueError(f"tracestate: at most {TRACESTATE_MAX_MEMBERS} members")
    for m in members:
        if not _TS_MEMBER.fullmatch(m):
            raise ValueError(f"tracestate: {m[:40]!r} is not a W3C list member (key=value)")
    return ts


class TaskSpec(_M):
    """One task to enqueue. Without `pid` the master assigns a FIFO pid."""

    pid: Pid | None = None
    key: FlowKey | None = None
    payload: PayloadRef | None = None
    not_before: EpochSecs | None = Field(None, description="do not lease before this time")
    delay_secs: DelaySecs | None = Field(None, description="do not lease for this long")
    idempotency_key: Annotated[str, Field(min_length=1, max_length=128)] | None = Field(
        None, description="apply this enqueue at most once per group and key within the "
        "master's retention window (5 min), even if its task was dequeued since; a repeat "
        "answers collapsed with the first enqueue's queue and pid")
    batch: Name | None = Field(
        None, description="add this task to the open batch with this id (same group): the "
        "batch's callback waits for it too")
    unique: Literal["queued", "active"] | None = Field(
        None, description="needs `key`: while a task of this key that was enqueued unique "
        "is queued (`queued`), or queued or leased (`active`), this enqueue collapses into "
        "it (answers collapsed with its pid) instead of adding a task")
    debounce_secs: Annotated[float, Field(gt=0, le=MAX_DEBOUNCE_SECS)] | None = Field(
        None, description="needs `key`: hold the task this long; an enqueue of the same key "
        "with debounce while it is still queued replaces its payload and pushes it back by "
        "this long again (up to `debounce_max_secs` after the first)")
    debounce_max_secs: Annotated[float, Field(gt=0, le=MAX_DELAY_SECS)] | None = Field(
        None, description="latest time to run a debounced task, counted from the first "
        "enqueue of the series (default: 10 times debounce_secs)")
    traceparent: Traceparent | None = None
    tracestate: Tracestate | None = None

    @field_validator("traceparent")
    @classmethod
    def _tp(cls, v: str | None) -> str | None:
        return None if v is None else check_traceparent(v)

    @field_validator("tracestate")
    @classmethod
    def _ts(cls, v: str | None) -> str | None:
        return None if v is None else check_tracestate(v)

    @model_validator(mode="after")
    def _extras(self) -> TaskSpec:
        if (self.unique or self.debounce_secs is not None) and self.key is None:
            raise ValueError("`unique` and `debounce_secs` need the task's `key`")
        if self.debounce_secs is not None and (
                self.unique or self.not_before is not None or self.delay_secs is not None):
            raise ValueError("`debounce_secs` sets the task's time itself: not with "
                             "`unique`, `not_before` or `delay_secs`")
        if self.debounce_max_secs is not None and (
                self.debounce_secs is None or self.debounce_max_secs < self.debounce_secs):
            raise ValueError("`debounce_max_secs` needs `debounce_secs` and must be at least "
                             "as long")
        if self.batch is not None and (self.unique or self.debounce_secs is not None):
            raise ValueError("a batch member cannot be `unique` or debounced (it must run)")
        if self.tracestate is not None and self.traceparent is None:
            raise ValueError("`tracestate` goes with a `traceparent`")
        return self


class EnqueueItem(TaskSpec):
    queue: Name


class LeaseRef(_M):
    queue: Name
    pid: Pid
    token: Token


class TaskRef(LeaseRef):
    """A dequeue (ack): the task held with `token` is done."""

    result: Annotated[str, Field(max_length=RESULT_MAX_BYTES)] | None = Field(
        None, description="the handler's result (text, JSON by convention; at most 64 KiB "
        "UTF-8), kept for the callback of the task's batch; ignored for a task in no batch")

    @field_validator("result")
    @classmethod
    def _result_bytes(cls, v: str | None) -> str | None:
        if v is not None and len(v.encode()) > RESULT_MAX_BYTES:
            raise ValueError(f"result: at most {RESULT_MAX_BYTES} bytes of UTF-8")
        return v


class RenewItem(LeaseRef):
    lease_secs: LeaseSecs = 60.0


class ReleaseItem(LeaseRef):
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
    key: str | None = Field(None, description="the task's flow-control key, if it has one")
    batch: str | None = Field(None, description="the batch this task is a member of")
    callback_of: str | None = Field(None, description="this task is the callback (or error "
                                    "callback) of this batch: read its members' results")
    traceparent: str | None = Field(None, description="W3C trace context of the producer")
    tracestate: str | None = None


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
    key: str | None = Field(None, description="flow-control key")
    batch: str | None = Field(None, description="batch this task is a member of")
    callback_of: str | None = Field(None, description="batch this task is the callback of")
    traceparent: str | None = None
    tracestate: str | None = None


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
    paused: int = Field(0, description="available tasks held by a pause (queue or key)")
    blocked: int = Field(0, description="available tasks a lease cannot take now because "
                         "of a concurrency or rate limit (more workers would not help)")
    queue_paused: bool = False
    paused_keys: list[str] = []
    keys: int = Field(0, description="keys with available or leased tasks")
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
    paused: int = Field(0, description="available tasks held by a pause")
    blocked: int = Field(0, description="available tasks held by a concurrency or rate limit")
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
    # flow control (master/tasks/flow.py, docs/concepts.md#flow-control)
    key_limit: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        None, description="at most this many tasks of one key leased at once")
    queue_limit: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        None, description="at most this many tasks of the queue leased at once")
    key_rate: Annotated[float, Field(gt=0, le=1e6)] | None = Field(
        None, description="tasks of one key leased per second (token bucket)")
    key_burst: Annotated[float, Field(ge=1, le=1e6)] | None = Field(
        None, description="tokens one key's bucket holds (default: max(1, key_rate))")
    rate: Annotated[float, Field(gt=0, le=1e6)] | None = Field(
        None, description="tasks of the queue leased per second (token bucket)")
    burst: Annotated[float, Field(ge=1, le=1e6)] | None = Field(
        None, description="tokens the queue's bucket holds (default: max(1, rate))")
    fair: bool | None = Field(
        None, description="lease keys in weighted round-robin (each key's tasks in pid "
        "order) instead of in pid order across keys")
    key_weights: Annotated[dict[FlowKey, Annotated[int, Field(ge=1, le=1000)]],
                           Field(max_length=1000)] | None = Field(
        None, description="a fair queue's weight per key: tasks it takes in a turn "
        "(default 1)")
    sqs: Annotated[dict[Annotated[str, Field(max_length=160)],
                        Annotated[str, Field(max_length=20480)]],
                   Field(max_length=1000)] | None = Field(
        None, description="what the SQS endpoint keeps for the queue: its attributes "
        "without a squall equivalent, and its tags (docs/sqs.md)")


class PauseRequest(_M):
    key: FlowKey | None = Field(None, description="pause (resume) only this key's tasks")


class PauseState(_M):
    """Whether a queue, or keys in it, are paused: leases skip them, enqueues go on."""

    paused: bool = Field(description="the whole queue is paused")
    paused_keys: list[str] = Field(description="keys paused in it (at most 1,000)")


class BatchRequest(_M):
    """Enqueue a batch: its members, and a callback enqueued (in the same WAL record as the
    last member's dequeue) once every member is done."""

    id: Name | None = Field(None, description="the batch's id in its group (default: one "
                            "the master assigns); an id in use is a 409")
    tasks: Annotated[list[EnqueueItem], Field(max_length=MAX_BATCH)] = Field(
        description="the members (a member whose pid is already queued collapses and is "
        "not a member); more may join later with an enqueue's `batch`")
    callback: EnqueueItem = Field(description="enqueued when every member is done (at "
                                  "once for a batch with no members). With `batch`, it is a "
                                  "member of that (parent) batch from now on")
    error_callback: EnqueueItem | None = Field(
        None, description="with on_dead `fail`: enqueued (instead of the callback) when a "
        "member is dead-lettered")
    on_dead: Literal["fail", "ignore"] = Field(
        "fail", description="a dead-lettered (or cancelled) member: `fail` the batch (the "
        "callback never runs; the error callback does), or `ignore` it (counted in "
        "`failed`; the callback runs once every member is done or failed)")
    traceparent: Traceparent | None = None
    tracestate: Tracestate | None = None

    @model_validator(mode="after")
    def _members(self) -> BatchRequest:
        if any(t.batch is not None for t in self.tasks):
            raise ValueError("members of a new batch cannot name a `batch`: they are this "
                             "batch's")
        for cb in (self.callback, self.error_callback):
            if cb is not None and (cb.unique or cb.debounce_secs is not None):
                raise ValueError("a callback cannot be `unique` or debounced")
        if self.error_callback is not None and self.error_callback.batch is not None:
            raise ValueError("the error callback cannot join a batch (a failed child batch "
                             "counts as a failed member of its parent)")
        if self.traceparent is not None:
            check_traceparent(self.traceparent)
        if self.tracestate is not None:
            check_tracestate(self.tracestate)
        return self


class BatchResponse(_M):
    ticket: int
    batch: str
    enqueued: list[EnqueueResult]


class BatchInfo(_M):
    batch: str
    group: str
    state: str = Field(description="open | done (callback enqueued) | failed (a member "
                       "was dead-lettered with on_dead `fail`)")
    total: int = Field(description="members")
    done: int = Field(description="members dequeued")
    failed: int = Field(description="members dead-lettered or cancelled")
    pending: int
    on_dead: str
    callback_queue: str
    parent: str | None = Field(None, description="the batch the callback is a member of")
    created_at: float
    finished_at: float | None = None
    results: int = Field(description="members' results kept")
    results_dropped: int = Field(0, description="results not kept: the batch's bound (8 MiB)"
                                 " was reached")


class BatchResult(_M):
    queue: str
    pid: str
    result: str


class BatchResults(_M):
    results: list[BatchResult]
    next: str | None = Field(None, description="pass as `after` for the next page")


class BatchList(_M):
    batches: list[BatchInfo]
    next: str | None = None


class RedriveRequest(_M):
    max_tasks: Annotated[int, Field(ge=1, le=MAX_BATCH)] = MAX_BATCH


class RedriveResponse(_M):
    ticket: int
    moved: int
    source: str


class RetryRequest(_M):
    pid: Pid


class RetryResponse(_M):
    ticket: int
    retried: str = Field(description="pid of the task")
    queue: str = Field(description="group#queue it is available in now")
    was: str = Field(description="what it was: a dead letter (moved back into the queue it "
                     "failed in, attempts reset) | delayed (its delay or retry backoff ended "
                     "now)")


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
    uploads_uncommitted: int = Field(
        0, description="of blobs_remaining: uploads allocated on it that no task refers to "
                       "yet; the drain waits for their enqueue or the end of their grace")
    uncommitted_wait_secs: float | None = Field(
        None, description="at most this many seconds more for those uploads (null: none)")


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
