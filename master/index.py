"""The master's materialised state in LMDB, and the one function that changes it: :func:`apply`.

Layout (named databases in one environment; all integers big-endian so keys sort numerically)::

    meta    b"applied"   -> u64  last WAL ticket whose ops are in this environment
            b"lease_seq" -> u64  last lease token issued (tokens are global, never reused)
            b"auto_pid"  -> u64  last automatic (FIFO) pid issued, in microseconds
            b"next_qid"  -> u32  next queue id to hand out
    queues  group \\0 name -> msgpack [qid, gen, available, leased, delayed, completed,
                                       enqueued_total, created_ms]
    qids    qid(u32)      -> msgpack [group, name]
    tasks   qid(u32) gen(u32) pidkey  -> msgpack task record (see :class:`Task`)
    ready   qid(u32) gen(u32) pidkey  -> b""     tasks that can be leased now, in pid order
    timers  due_ms(u64) qid(u32) gen(u32) pidkey -> b""
                                                  leased tasks (due = lease expiry) and
                                                  delayed tasks (due = not_before)

``pidkey`` is the pid's UTF-8 bytes when they are at most 448 bytes long; a longer pid is
cut to 448 bytes and followed by 16 bytes of its BLAKE2b hash, because LMDB keys are at
most 511 bytes. Pid order is therefore exact except between two pids longer than 448
bytes that share their first 448 bytes, which are ordered by hash.

Every task lives in exactly one of ``ready`` (state AVAILABLE) or ``timers`` (LEASED or
DELAYED). The queue record's counters always equal the number of tasks in each state, as
they change in the same LMDB transaction as the tasks.

Why this shape: leasing is a cursor seek to ``qid gen`` in ``ready`` and a short walk, so
it costs O(k log n) whatever the number of leased or delayed tasks; expiry and delays are
one ordered index across all queues that a sweeper walks from its start; deleting a queue
bumps ``gen`` so its old keys become invisible at once.

The environment is opened with ``sync=False``: the WAL is what makes a change durable.
Each :func:`apply` writes its WAL ticket to ``meta/applied`` in the same transaction as its
changes, so replaying the WAL skips what the environment already holds: replay is
idempotent by construction. A checkpoint is ``env.sync()``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import lmdb
import msgpack

AVAILABLE, LEASED, DELAYED = 0, 1, 2
STATE_NAMES = {AVAILABLE: "available", LEASED: "leased", DELAYED: "delayed"}
PIDKEY_CUT = 448

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_QG = struct.Struct(">II")
_TIMER = struct.Struct(">QII")


def pidkey(pid: bytes) -> bytes:
    if len(pid) <= PIDKEY_CUT:
        return pid
    return pid[:PIDKEY_CUT] + hashlib.blake2b(pid, digest_size=16).digest()


def qprefix(qid: int, gen: int) -> bytes:
    return _QG.pack(qid, gen)


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

    def due_ms(self) -> int:
        return self.expiry_ms if self.state == LEASED else self.not_before_ms

    def pack(self) -> bytes:
        return msgpack.packb(
            [self.pid, self.state, self.token, self.live, self.expiry_ms, self.not_before_ms,
             self.attempts, self.enqueued_ms, self.leased_ms, self.worker, self.worker_addr,
             self.payload]
        )

    def to_wire(self) -> list[Any]:
        return [self.pid, self.state, self.token, self.live, self.expiry_ms, self.not_before_ms,
                self.attempts, self.enqueued_ms, self.leased_ms, self.worker, self.worker_addr,
                self.payload]

    @classmethod
    def from_wire(cls, v: Sequence[Any]) -> Task:
        return cls(*v)

    @classmethod
    def unpack(cls, raw: bytes) -> Task:
        return cls(*msgpack.unpackb(raw))


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

    @property
    def size(self) -> int:
        return self.available + self.leased + self.delayed

    def pack(self) -> bytes:
        return msgpack.packb([self.qid, self.gen, self.available, self.leased, self.delayed,
                              self.completed, self.enqueued_total, self.created_ms])

    def count(self, state: int, delta: int) -> None:
        if state == AVAILABLE:
            self.available += delta
        elif state == LEASED:
            self.leased += delta
        else:
            self.delayed += delta


def qname_key(group: str, name: str) -> bytes:
    return group.encode() + b"\x00" + name.encode()


class Index:
    """The LMDB environment and its databases. One per data directory per process."""

    def __init__(self, path: str, map_size: int = 1 << 38) -> None:
        self.env = lmdb.open(path, map_size=map_size, max_dbs=8, sync=False, metasync=False,
                             writemap=False, readahead=False, max_readers=256)
        self.meta = self.env.open_db(b"meta")
        self.queues_db = self.env.open_db(b"queues")
        self.qids_db = self.env.open_db(b"qids")
        self.tasks = self.env.open_db(b"tasks")
        self.ready = self.env.open_db(b"ready")
        self.timers = self.env.open_db(b"timers")
        self.queues: dict[tuple[str, str], QueueRec] = {}
        self.by_qid: dict[int, QueueRec] = {}
        self.reload()

    def reload(self) -> None:
        """(Re)load the in-memory copies (meta, queue records) from the environment."""
        queues: dict[tuple[str, str], QueueRec] = {}
        with self.env.begin() as txn:
            self.applied = self._meta_int(txn, b"applied")
            self.lease_seq = self._meta_int(txn, b"lease_seq")
            self.auto_pid = self._meta_int(txn, b"auto_pid")
            self.next_qid = self._meta_int(txn, b"next_qid") or 1
            for k, v in txn.cursor(db=self.queues_db):
                group, name = bytes(k).decode().split("\x00", 1)
                queues[(group, name)] = QueueRec(group, name, *msgpack.unpackb(v))
        self.queues = queues
        self.by_qid = {q.qid: q for q in queues.values()}

    # -- reads ---------------------------------------------------------------------------
    def _meta_int(self, txn: lmdb.Transaction, key: bytes) -> int:
        raw = txn.get(key, db=self.meta)
        return _U64.unpack(raw)[0] if raw else 0

    def get_task(self, txn: lmdb.Transaction, q: QueueRec, pid: bytes) -> Task | None:
        raw = txn.get(qprefix(q.qid, q.gen) + pidkey(pid), db=self.tasks)
        if raw is None:
            return None
        t = Task.unpack(raw)
        return t if t.pid.encode() == pid else None

    def iter_ready(self, txn: lmdb.Transaction, q: QueueRec, max_key: bytes | None,
                   limit: int) -> Iterator[bytes]:
        """Yield the pidkeys of up to `limit` ready tasks of `q` in pid order (<= max_key)."""
        prefix = qprefix(q.qid, q.gen)
        cur = txn.cursor(db=self.ready)
        if not cur.set_range(prefix):
            return
        n = 0
        for k in cur.iternext(keys=True, values=False):
            if not k.startswith(prefix) or n >= limit:
                return
            pk = bytes(k[8:])
            if max_key is not None and pk > max_key:
                return
            n += 1
            yield pk

    def iter_tasks(self, txn: lmdb.Transaction, q: QueueRec, after: bytes = b"",
                   limit: int = 100) -> Iterator[Task]:
        prefix = qprefix(q.qid, q.gen)
        cur = txn.cursor(db=self.tasks)
        if not cur.set_range(prefix + after):
            return
        n = 0
        for k, v in cur:
            if not k.startswith(prefix) or n >= limit:
                return
            if after and bytes(k[8:]) == after:
                continue
            n += 1
            yield Task.unpack(v)

    def due_timers(self, txn: lmdb.Transaction, now_ms: int, limit: int
                   ) -> list[tuple[int, int, bytes]]:
        """Up to `limit` (qid, gen, pidkey) whose due time is <= now_ms, earliest first."""
        out: list[tuple[int, int, bytes]] = []
        cur = txn.cursor(db=self.timers)
        if not cur.first():
            return out
        for k in cur.iternext(keys=True, values=False):
            due, qid, gen = _TIMER.unpack_from(k)
            if due > now_ms or len(out) >= limit:
                break
            out.append((qid, gen, bytes(k[_TIMER.size:])))
        return out

    # -- writes --------------------------------------------------------------------------
    def _unindex(self, txn: lmdb.Transaction, pre: bytes, pk: bytes, t: Task) -> None:
        if t.state == AVAILABLE:
            txn.delete(pre + pk, db=self.ready)
        else:
            txn.delete(_U64.pack(t.due_ms()) + pre + pk, db=self.timers)

    def _index(self, txn: lmdb.Transaction, pre: bytes, pk: bytes, t: Task) -> None:
        if t.state == AVAILABLE:
            txn.put(pre + pk, b"", db=self.ready)
        else:
            txn.put(_U64.pack(t.due_ms()) + pre + pk, b"", db=self.timers)

    def put_task(self, txn: lmdb.Transaction, q: QueueRec, t: Task, *, enqueue: bool) -> None:
        """Insert or replace a task, keeping the indexes and counters exact."""
        pre, pk = qprefix(q.qid, q.gen), pidkey(t.pid.encode())
        raw = txn.get(pre + pk, db=self.tasks)
        if raw is not None:
            old = Task.unpack(raw)
            self._unindex(txn, pre, pk, old)
            q.count(old.state, -1)
        elif enqueue:
            q.enqueued_total += 1
        txn.put(pre + pk, t.pack(), db=self.tasks)
        self._index(txn, pre, pk, t)
        q.count(t.state, +1)

    def delete_task(self, txn: lmdb.Transaction, q: QueueRec, pid: bytes, *,
                    completed: bool) -> bool:
        pre, pk = qprefix(q.qid, q.gen), pidkey(pid)
        raw = txn.pop(pre + pk, db=self.tasks)
        if raw is None:
            return False
        old = Task.unpack(raw)
        self._unindex(txn, pre, pk, old)
        q.count(old.state, -1)
        if completed:
            q.completed += 1
        return True

    def create_queue(self, txn: lmdb.Transaction, group: str, name: str, qid: int,
                     created_ms: int) -> QueueRec:
        q = self.queues.get((group, name))
        if q is None:
            q = QueueRec(group, name, qid, created_ms=created_ms)
            self.queues[(group, name)] = q
            self.by_qid[qid] = q
            txn.put(_U32.pack(qid), msgpack.packb([group, name]), db=self.qids_db)
        self.next_qid = max(self.next_qid, qid + 1)
        return q

    def save_queue(self, txn: lmdb.Transaction, q: QueueRec) -> None:
        txn.put(qname_key(q.group, q.name), q.pack(), db=self.queues_db)

    def save_meta(self, txn: lmdb.Transaction) -> None:
        txn.put(b"applied", _U64.pack(self.applied), db=self.meta)
        txn.put(b"lease_seq", _U64.pack(self.lease_seq), db=self.meta)
        txn.put(b"auto_pid", _U64.pack(self.auto_pid), db=self.meta)
        txn.put(b"next_qid", _U64.pack(self.next_qid), db=self.meta)

    def sync(self) -> None:
        self.env.sync(True)

    def close(self) -> None:
        self.env.close()


# -- ops: what a WAL record holds, and the one function that applies them ---------------
# ("Q", group, name, qid, created_ms)     create a queue
# ("P", qid, gen, task_wire, enqueue)     put a task record (insert or replace)
# ("D", qid, gen, pid, completed)         delete a task (completed: it was dequeued)
# ("M", lease_seq, auto_pid)              raise the token / auto-pid high-water marks
Op = tuple[Any, ...]


def apply(index: Index, txn: lmdb.Transaction, ops: Sequence[Op], ticket: int) -> None:
    """Apply `ops` in `txn` and record `ticket` as applied. The same code runs live and on replay."""
    touched: dict[int, QueueRec] = {}
    for op in ops:
        kind = op[0]
        if kind == "P":
            q = index.by_qid[op[1]]
            if q.gen == op[2]:
                index.put_task(txn, q, Task.from_wire(op[3]), enqueue=op[4])
                touched[q.qid] = q
        elif kind == "D":
            q = index.by_qid[op[1]]
            if q.gen == op[2]:
                index.delete_task(txn, q, op[3].encode(), completed=op[4])
                touched[q.qid] = q
        elif kind == "Q":
            q = index.create_queue(txn, op[1], op[2], op[3], op[4])
            touched[q.qid] = q
        elif kind == "M":
            index.lease_seq = max(index.lease_seq, op[1])
            index.auto_pid = max(index.auto_pid, op[2])
        else:
            raise ValueError(f"unknown op {kind!r}")
    for q in touched.values():
        index.save_queue(txn, q)
    index.applied = max(index.applied, ticket)
    index.save_meta(txn)
