"""The master's records: a task's record and its wire list, a queue's record, and the keys
they are stored under (layout: :mod:`squall.master.storage.index`)."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, fields
from typing import Any

import msgpack

AVAILABLE, LEASED, DELAYED = 0, 1, 2
# PENDING: enqueued through a data node's front door while its payload was still being
# stored (the parallel put): never leased, never ready; its timer (at ``expiry_ms``) is the
# deadline by which the node's confirmation is expected (master/tasks/pending.py)
PENDING = 3
STATE_NAMES = {AVAILABLE: "available", LEASED: "leased", DELAYED: "delayed",
               PENDING: "pending"}
PIDKEY_CUT = 448
QG = struct.Struct(">II")
_packb = msgpack.packb
_STATE_BYTE = (b"\x00", b"\x01", b"\x02")


def pidkey(pid: bytes) -> bytes:
    if len(pid) <= PIDKEY_CUT:
        return pid
    return pid[:PIDKEY_CUT] + hashlib.blake2b(pid, digest_size=16).digest()


def qprefix(qid: int, gen: int) -> bytes:
    return QG.pack(qid, gen)


def task_key(qid: int, gen: int, pid: bytes) -> bytes:
    """A task's key in ``tasks`` (and ``ready``): its queue's prefix and its pidkey (one
    call on the hot paths)."""
    return QG.pack(qid, gen) + (pid if len(pid) <= PIDKEY_CUT else pidkey(pid))


_KEY_HASHES: dict[str, bytes] = {}
KEY_HASH_CACHE = 100_000


def key_hash(key: str) -> bytes:
    """8 bytes standing for a flow-control key in index keys (a key of 128 characters and
    a 464-byte pidkey would not fit LMDB's 511-byte keys). Cached (bounded)."""
    h = _KEY_HASHES.get(key)
    if h is None:
        if len(_KEY_HASHES) >= KEY_HASH_CACHE:
            _KEY_HASHES.clear()
        h = _KEY_HASHES[key] = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return h


def keyed_key(task_key: bytes, key: str, state: int) -> bytes:
    """A keyed task's entry in ``keyed``: ``qid gen | key hash | state | pidkey`` (state
    AVAILABLE: ready, in pid order per key; LEASED: counted against the key's limit)."""
    return task_key[:8] + key_hash(key) + _STATE_BYTE[state] + task_key[8:]


@dataclass(slots=True)
class Task:
    """One task's record. Times are integer milliseconds since the epoch."""

    pid: str
    state: int = AVAILABLE
    token: int = 0  # lease token of the latest lease (0: never leased)
    live: bool = False  # the holder of `token` may still renew / release / dequeue
    expiry_ms: int = 0  # lease expiry while LEASED
    not_before_ms: int = 0
    attempts: int = 0  # how many times the task has been leased
    enqueued_ms: int = 0
    leased_ms: int = 0
    worker: str = ""
    worker_addr: str = ""
    payload: dict[str, Any] | None = None
    error: str = ""  # last failure, or why the task was dead-lettered
    origin: str = ""  # for a dead-lettered task: the queue it came from
    key: str = ""  # flow-control key (a tenant, a domain; see master/tasks/flow.py)
    # rarely set extras (master/tasks/batches.py, unique.py): "b" batch id it is a member
    # of, "cb" batch id it is the callback of, "u" unique mode, "dl" debounce deadline ms,
    # "tp"/"ts" W3C trace context
    ext: dict[str, Any] | None = None

    def due_ms(self) -> int:
        return self.expiry_ms if self.state in (LEASED, PENDING) else self.not_before_ms

    def to_wire(self) -> list[Any]:
        # spelled out (not a loop over fields): this runs for every task on the hot paths;
        # _TASK_FIELDS below pins the order. The key is the 15th item, present only when
        # set, so a keyless task's record is what it was before keys existed.
        w = [self.pid, self.state, self.token, self.live, self.expiry_ms,
             self.not_before_ms, self.attempts, self.enqueued_ms, self.leased_ms,
             self.worker, self.worker_addr, self.payload, self.error, self.origin]
        if self.ext:
            w.append(self.key)
            w.append(self.ext)
        elif self.key:
            w.append(self.key)
        return w

    def pack(self) -> bytes:
        return _packb(self.to_wire())

    def copy(self) -> Task:
        return Task(*self.to_wire())

    @classmethod
    def unpack(cls, raw: bytes) -> Task:
        return cls(*msgpack.unpackb(raw))


_TASK_FIELDS = tuple(f.name for f in fields(Task))
assert _TASK_FIELDS == ("pid", "state", "token", "live", "expiry_ms", "not_before_ms",
                        "attempts", "enqueued_ms", "leased_ms", "worker", "worker_addr",
                        "payload", "error", "origin", "key", "ext"), (
                            "Task.to_wire and W_* are out of date")
# positions in a task's wire list (Task.to_wire), for code that works on the list itself
W_PID, W_STATE, W_EXPIRY, W_NOT_BEFORE, W_ENQUEUED, W_PAYLOAD = 0, 1, 4, 5, 7, 11
W_KEY = 14  # only in a keyed task's list (len(w) > W_KEY), or "" before an ext
W_EXT = 15  # only in a list with extras (len(w) > W_EXT): a dict (see Task.ext)
# (state, due_ms, enqueued_ms, blob id, key or "") of a task
Old = tuple[int, int, int, str | None, str]


def wire_key(w: list[Any]) -> str:
    """The flow-control key of a task's wire list ("" without one)."""
    return w[W_KEY] if len(w) > W_KEY else ""


def old_of_wire(w: list[Any]) -> Old:
    state, payload = w[W_STATE], w[W_PAYLOAD]
    return (state, w[W_EXPIRY] if state in (LEASED, PENDING) else w[W_NOT_BEFORE],
            w[W_ENQUEUED], payload["blob_id"] if payload else None,
            w[W_KEY] if len(w) > W_KEY else "")


@dataclass(slots=True)
class QueueRec:
    group: str
    name: str
    qid: int
    gen: int = 0
    available: int = 0
    leased: int = 0
    delayed: int = 0
    completed: int = 0
    enqueued_total: int = 0
    created_ms: int = 0
    pending: int = 0  # the 9th item of the record (records written before it have 8)

    @property
    def size(self) -> int:
        return self.available + self.leased + self.delayed + self.pending

    def pack(self) -> bytes:
        return msgpack.packb([self.qid, self.gen, self.available, self.leased, self.delayed,
                              self.completed, self.enqueued_total, self.created_ms,
                              self.pending])

    def count(self, state: int, delta: int) -> None:
        if state == AVAILABLE:
            self.available += delta
        elif state == LEASED:
            self.leased += delta
        elif state == DELAYED:
            self.delayed += delta
        else:
            self.pending += delta


def gname(group: str, name: str) -> bytes:
    return group.encode() + b"\x00" + name.encode()
