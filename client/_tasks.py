"""Plain data of the client: tasks to enqueue, leased tasks, the transaction builder, payload
sources and client-made FIFO pids. No I/O here."""

from __future__ import annotations

import io
import json
import os
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeAlias

from squall.common.errors import BadRequest
from squall.common.wire.models import LeasedTask as WireTask
from squall.common.wire.models import PayloadRef
from squall.common.wire.names import split_queue

Payload = bytes | bytearray | memoryview | str | Path | IO[bytes] | Iterable[bytes] | None
SMALL_FILE_BYTES = 1 << 20  # files up to this size are read whole (retries, batch writes)
CHUNK_BYTES = 1 << 20


@dataclass(slots=True)
class NewTask:
    """A task to enqueue: in ``put_many`` (queue from the call), as a handler's follow-up
    (queue required), or with ``Transaction.put``."""

    payload: Payload = None
    pid: str | None = None
    queue: str | None = None
    not_before: float | None = None
    delay: float | None = None
    idempotency_key: str | None = None  # at most once per group and key (master's window)
    key: str | None = None  # flow-control key: limits, fairness, pause (docs/concepts.md)
    # unique while "queued" or "active" (queued or leased), for its key
    unique: str | None = None
    debounce: float | None = None  # seconds; a later enqueue of the key replaces it
    debounce_max: float | None = None  # latest run, seconds after the series' first enqueue
    batch: str | None = None  # join this open batch (an id in the task's group)
    traceparent: str | None = None  # W3C trace context (default: the current OpenTelemetry
    tracestate: str | None = None  # context when opentelemetry-api is installed)


# -- FIFO pids ----------------------------------------------------------------------------
_fifo_lock = threading.Lock()
_fifo_last = 0


def fifo_pid() -> str:
    """A time-ordered unique pid for a task enqueued without one: 20 digits of microseconds
    since the epoch (like the master's own FIFO pids, strictly increasing within this
    process) and 48 random bits, so a retried enqueue collapses into the first attempt
    instead of enqueueing twice, and two clients never collide."""
    return fifo_pids(1)[0]


def fifo_pids(n: int) -> list[str]:
    """`n` pids as :func:`fifo_pid` makes them, in increasing order: one clock read, one
    lock and one draw of random bytes for all (a batch's pids are made at once)."""
    global _fifo_last
    with _fifo_lock:
        first = max(time.time_ns() // 1000, _fifo_last + 1)
        _fifo_last = first + n - 1
    rnd = secrets.token_hex(6 * n)
    return [f"{first + i:020d}.{rnd[12 * i:12 * i + 12]}" for i in range(n)]


def is_fifo_pid(pid: str) -> bool:
    return len(pid) == 33 and pid[20] == "." and pid[:20].isdigit()


# -- payload sources ----------------------------------------------------------------------
@dataclass(slots=True)
class Stream:
    """A payload too large to hold: streamed once (no retries), size known or not."""

    parts: Iterable[bytes]
    size: int | None = None


def as_source(payload: Payload) -> bytes | Stream | None:
    """Normalise a payload: bytes (small, resendable) or a Stream (large)."""
    if payload is None:
        return None
    if isinstance(payload, bytes):
        return payload
    if isinstance(payload, bytearray | memoryview):
        return bytes(payload)
    if isinstance(payload, str):
        return payload.encode()
    if isinstance(payload, Path):
        size = payload.stat().st_size
        if size <= SMALL_FILE_BYTES:
            return payload.read_bytes()
        return Stream(_read_path(payload), size)
    if hasattr(payload, "read"):
        f: IO[bytes] = payload  # type: ignore[assignment]
        left = _remaining(f)
        if left is not None and left <= SMALL_FILE_BYTES:
            return f.read()
        return Stream(_read_file(f), left)
    return _iterable(payload)


def _iterable(payload: object) -> Stream:
    """An iterable of bytes as a Stream; anything else is a clear error."""
    if isinstance(payload, Mapping):  # iterable (of its keys), but surely not meant so
        raise BadRequest(f"a payload is bytes, str, a path, a binary file or an iterable of "
                         f"bytes, not {type(payload).__name__}: encode it first, e.g. "
                         "json.dumps(obj) (and json.loads(task.payload()) in the worker)")
    if isinstance(payload, list | tuple):
        for part in payload:
            _check_part(part)
        return Stream(iter(payload))
    if isinstance(payload, Iterable):
        return Stream(_checked(payload))
    raise BadRequest(f"a payload is bytes, str, a path, a binary file or an iterable of "
                     f"bytes, not {type(payload).__name__}")


def _check_part(part: object) -> None:
    if not isinstance(part, bytes | bytearray | memoryview):
        raise BadRequest("a payload given as an iterable yields bytes, not "
                         f"{type(part).__name__}: encode what it yields first")


def _checked(parts: Iterable[bytes]) -> Iterator[bytes]:
    for part in parts:
        _check_part(part)
        yield part


def held_bytes(payload: Payload) -> int:
    """Bytes :func:`as_source` holds of a payload until it is sent: bytes-like and str
    payloads (a str by its length), and files and paths it reads whole (at most
    SMALL_FILE_BYTES); 0 for one it streams. A path it cannot stat counts 0 (sending it
    reports the error)."""
    if isinstance(payload, memoryview):
        return payload.nbytes
    if isinstance(payload, bytes | bytearray | str):
        return len(payload)
    size: int | None = None
    if isinstance(payload, Path):
        try:
            size = payload.stat().st_size
        except OSError:
            return 0
    elif hasattr(payload, "read"):
        size = _remaining(payload)  # type: ignore[arg-type]
    return size if size is not None and size <= SMALL_FILE_BYTES else 0


def _remaining(f: IO[bytes]) -> int | None:
    try:
        return os.fstat(f.fileno()).st_size - f.tell()
    except (OSError, AttributeError, io.UnsupportedOperation):
        return None


def _read_file(f: IO[bytes]) -> Iterator[bytes]:
    while part := f.read(CHUNK_BYTES):
        yield part


def _read_path(p: Path) -> Iterator[bytes]:
    with p.open("rb") as f:
        yield from _read_file(f)


# -- leased tasks -------------------------------------------------------------------------
class TaskBase:
    """A leased task's data. ``LeasedTask`` / ``AsyncLeasedTask`` add the verbs."""

    __slots__ = (
        "_client",
        "_data",
        "attempts",
        "batch",
        "callback_of",
        "enqueued_at",
        "expires_at",
        "finished",
        "group",
        "key",
        "leased_at",
        "name",
        "payload_ref",
        "pid",
        "result",
        "token",
        "traceparent",
        "tracestate",
    )

    def __init__(self, client: Any, wire: WireTask, group: str) -> None:
        self._client = client
        self.group = group
        self.name = wire.queue.rpartition("#")[2]  # a listing's group#name works too
        self.pid = wire.pid
        self.token = wire.token
        self.expires_at = wire.expires_at
        self.attempts = wire.attempts
        self.enqueued_at = wire.enqueued_at
        self.key: str | None = wire.key  # the task's flow-control key, if it has one
        self.batch: str | None = wire.batch  # the batch it is a member of
        self.callback_of: str | None = wire.callback_of  # the batch it is the callback of
        self.traceparent: str | None = wire.traceparent  # the producer's trace context
        self.tracestate: str | None = wire.tracestate
        self.result: str | None = None  # sent with its dequeue (see set_result)
        self.payload_ref: PayloadRef | None = wire.payload
        self._data: bytes | None = None  # the payload, once read (lease(payloads=True))
        self.leased_at = time.monotonic()  # local clock: when to renew
        self.finished = False  # dequeued or released through this object

    @property
    def queue(self) -> str:
        """``group#name``."""
        return f"{self.group}#{self.name}"

    @property
    def has_payload(self) -> bool:
        return self.payload_ref is not None

    @property
    def payload_loaded(self) -> bool:
        """True when the payload is held in memory (``payload()`` needs no request)."""
        return self._held_payload() is not None

    def _held_payload(self) -> bytes | None:
        """The payload if it needs no request (b"" without one), else None (the verbs'
        shortcut; not public API)."""
        return b"" if self.payload_ref is None else self._data

    @property
    def size(self) -> int:
        """Payload size in bytes (0 without a payload)."""
        return self.payload_ref.size if self.payload_ref else 0

    def set_result(self, value: Any) -> None:
        """Keep `value` (JSON-encoded; at most 64 KiB) as this task's result: its dequeue
        carries it, and the callback of its batch can read it (ignored outside a batch)."""
        self.result = json.dumps(value, separators=(",", ":"))

    @property
    def batch_id(self) -> str | None:
        """``group#id`` of the batch whose callback this task is (for ``batch_results``)."""
        return f"{self.group}#{self.callback_of}" if self.callback_of else None

    def ref(self) -> dict[str, Any]:
        return {"queue": self.name, "pid": self.pid, "token": self.token}

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.queue} pid={self.pid!r} token={self.token} "
                f"attempts={self.attempts} size={self.size}>")


# -- transactions -------------------------------------------------------------------------
class TxBuilder:
    """Collects enqueues, dequeues, renewals and releases on queues of one group; they are
    committed as one atomic update. Queue names are ``group#name`` or bare names (taken to
    be in the transaction's group)."""

    def __init__(self, group: str | None = None) -> None:
        self.group = split_queue(f"{group}#x")[0] if group else None
        self.puts: list[NewTask] = []
        self.dequeues: list[dict[str, Any]] = []
        self.renews: list[dict[str, Any]] = []
        self.releases: list[dict[str, Any]] = []
        self.lease: dict[str, Any] | None = None
        self._tasks: list[TaskBase] = []

    def _in_group(self, group: str, what: str) -> None:
        if self.group is None:
            self.group = group
        elif group != self.group:
            raise BadRequest(f"{what} is in group {group!r}, but this transaction is on group "
                             f"{self.group!r}: one update touches one group only")

    def put(self, queue: str, payload: Payload = None, *, pid: str | None = None,
            not_before: float | None = None, delay: float | None = None) -> TxBuilder:
        if "#" in queue or self.group is None:
            group, name = split_queue(queue)
            self._in_group(group, f"queue {queue}")
        else:
            name = split_queue(queue)[1]
        self.puts.append(NewTask(payload, pid, name, not_before, delay))
        return self

    def dequeue(self, task: TaskBase) -> TxBuilder:
        self._in_group(task.group, f"task {task.queue} {task.pid!r}")
        ref = task.ref()
        if task.result is not None:
            ref["result"] = task.result
        self.dequeues.append(ref)
        self._tasks.append(task)
        return self

    done = dequeue

    def renew(self, task: TaskBase, lease_secs: float = 60.0) -> TxBuilder:
        self._in_group(task.group, f"task {task.queue} {task.pid!r}")
        self.renews.append({**task.ref(), "lease_secs": lease_secs})
        return self

    def release(self, task: TaskBase, delay: float | None = None,
                error: str | None = None, unseen: bool = False) -> TxBuilder:
        """Give `task` back: after `delay`; `error`: the attempt failed; `unseen`: it was
        never started (read ahead), so its lease is not counted as an attempt."""
        self._in_group(task.group, f"task {task.queue} {task.pid!r}")
        item: dict[str, Any] = task.ref()
        if unseen:
            item["unseen"] = True
        if delay is not None:
            item["delay_secs"] = delay
        if error is not None:
            item["error"] = error[:4096]
        self.releases.append(item)
        self._tasks.append(task)
        return self

    def lease_next(self, name: str, spec: dict[str, Any]) -> TxBuilder:
        """After the rest, lease from queue `name` of this group (a LeaseRequest's fields:
        max_tasks, lease_secs, max_pid, worker); the answer's ``leased`` has them."""
        self.lease = {**spec, "queue": name}
        return self

    @property
    def empty(self) -> bool:
        return not (self.puts or self.dequeues or self.renews or self.releases)

    @property
    def acks_only(self) -> bool:
        """Nothing but acknowledgements (dequeues): what a lease through a data node carries."""
        return not (self.puts or self.renews or self.releases)

    def committed(self) -> None:
        for t in self._tasks:
            t.finished = True


Tasks: TypeAlias = TaskBase | Sequence[TaskBase]  # one task or several, as the verbs take them


def as_list(tasks: Tasks | None) -> list[TaskBase]:
    if tasks is None:
        return []
    return [tasks] if isinstance(tasks, TaskBase) else list(tasks)
