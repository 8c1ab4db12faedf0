"""Pydantic models of the v1 wire protocol: the contract the OpenAPI document publishes.

Times on the wire are seconds since the epoch as floats (``expires_at``, ``not_before``);
durations are seconds (``lease_secs``, ``delay_secs``). Queue names inside a group's
update are bare names (``fetch``); the group is in the path.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from squall.common.names import PID_MAX_BYTES

MAX_BATCH = 1000  # items per request, every batch form
MAX_LEASE_SECS = 7 * 86400.0
MAX_DELAY_SECS = 366 * 86400.0
MAX_WORKER_CHARS = 256

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$"
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=NAME_PATTERN)]
Pid = Annotated[str, Field(min_length=1, max_length=PID_MAX_BYTES,
                           description="priority-ID: queues serve the smallest pid first")]
Token = Annotated[int, Field(ge=1, lt=1 << 63, description="lease token (fencing number)")]
LeaseSecs = Annotated[float, Field(gt=0, le=MAX_LEASE_SECS)]
DelaySecs = Annotated[float, Field(ge=0, le=MAX_DELAY_SECS)]
EpochSecs = Annotated[float, Field(ge=0, le=1e11)]


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PayloadRef(_M):
    """Where a task's payload lives. The master never sees payload bytes, only this."""

    blob_id: Annotated[str, Field(min_length=1, max_length=128)]
    size: Annotated[int, Field(ge=0, lt=1 << 53)]
    crc32c: Annotated[int, Field(ge=0, lt=1 << 32)]
    replicas: Annotated[list[Annotated[str, Field(max_length=512)]], Field(max_length=16)] = []


class TaskSpec(_M):
    """One task to enqueue. Without `pid` the master assigns a FIFO pid."""

    pid: Pid | None = None
    payload: PayloadRef | None = None
    not_before: EpochSecs | None = Field(None, description="do not lease before this time")
    delay_secs: DelaySecs | None = Field(None, description="do not lease for this long")


class EnqueueItem(TaskSpec):
    queue: Name


class TaskRef(_M):
    queue: Name
    pid: Pid
    token: Token


class RenewItem(TaskRef):
    lease_secs: LeaseSecs = 60.0


class ReleaseItem(TaskRef):
    delay_secs: DelaySecs = 0.0


class UpdateRequest(_M):
    """Applied all or nothing, in this order: dequeue, renew, release, enqueue."""

    enqueue: Annotated[list[EnqueueItem], Field(max_length=MAX_BATCH)] = []
    dequeue: Annotated[list[TaskRef], Field(max_length=MAX_BATCH)] = []
    renew: Annotated[list[RenewItem], Field(max_length=MAX_BATCH)] = []
    release: Annotated[list[ReleaseItem], Field(max_length=MAX_BATCH)] = []


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


class UpdateResponse(_M):
    ticket: int = Field(description="WAL ticket of this update (0: nothing changed)")
    enqueued: list[EnqueueResult]
    dequeued: int
    renewed: list[RenewResult]
    released: int


class EnqueueResponse(_M):
    ticket: int
    enqueued: list[EnqueueResult]


class LeaseRequest(_M):
    max_tasks: Annotated[int, Field(ge=1, le=MAX_BATCH)] = 1
    lease_secs: LeaseSecs = 60.0
    max_pid: Pid | None = Field(None, description="only lease tasks whose pid <= max_pid")
    worker: Annotated[str, Field(max_length=MAX_WORKER_CHARS)] = ""


class LeasedTask(_M):
    queue: str
    pid: str
    token: int
    expires_at: float
    attempts: int = Field(description="times this task has been leased, this lease included")
    enqueued_at: float
    payload: PayloadRef | None = None


class LeaseResponse(_M):
    tasks: list[LeasedTask]


class TaskInfo(_M):
    queue: str
    pid: str
    state: str = Field(description="available | leased | delayed")
    attempts: int
    enqueued_at: float
    expires_at: float | None = None
    not_before: float | None = None
    worker: str | None = None
    worker_addr: str | None = None
    payload: PayloadRef | None = None


class QueueStats(_M):
    group: str
    queue: str
    available: int
    leased: int
    delayed: int
    total: int
    completed: int
    enqueued_total: int


class QueueList(_M):
    queues: list[QueueStats]


class ErrorBody(_M):
    code: str
    message: str
    details: object | None = None


class ErrorResponse(_M):
    error: ErrorBody
