"""The master's materialised state in LMDB: layout and the primitives that keep it exact.

Layout (named databases in one environment; integers big-endian so keys sort numerically)::

    meta    b"applied"   -> u64  last WAL ticket whose ops are in this environment
            b"lease_seq" -> u64  last lease token issued (tokens are global, never reused)
            b"auto_pid"  -> u64  last automatic (FIFO) pid issued, in microseconds
            b"next_qid"  -> u64  next queue id to hand out
            b"enqueued_total", b"completed_total" -> u64  tasks ever enqueued / dequeued
                                 (monotonic: queue deletion does not take them back)
    queues  group \\0 name -> msgpack [qid, gen, available, leased, delayed, completed,
                                       enqueued_total, created_ms, pending]
    qids    qid(u32)      -> msgpack [group, name]
    tasks   qid(u32) gen(u32) pidkey  -> msgpack task record (see ``records.Task``)
    ready   qid(u32) gen(u32) pidkey  -> b""     tasks that can be leased now, in pid order
    avail   qid(u32) gen(u32) enq_ms(u64) pidkey -> b""
                                                  the same tasks in enqueue-time order
                                                  (oldest available task age)
    timers  due_ms(u64) qid(u32) gen(u32) pidkey -> b""
                                                  leased tasks (due = lease expiry),
                                                  delayed tasks (due = not_before) and
                                                  pending tasks (due = their deadline)
    conf    b"P" group \\0 name -> msgpack policy  (name "" = the group's default)
            b"S" group \\0 name -> msgpack schedule (with its last enqueued slot)
            b"N" \\0 node_id  -> msgpack {"mark": "draining", "since": secs}: a data
                                 node being decommissioned (see master/cluster/state.py)
    keyed   qid(u32) gen(u32) keyhash(8) state(u8) pidkey -> key (UTF-8)
                                                  tasks with a flow-control key: ready
                                                  ones (state 0, in pid order per key:
                                                  these are *not* in ``ready``/``ready``
                                                  holds keyless tasks only) and leased
                                                  ones (state 1); see master/tasks/flow.py
    reap    qid(u32) gen(u32) -> b""              deleted generations not yet reaped
    blobs   blob id -> u32 references               payloads referenced by tasks and schedules:
                                                  what data nodes keep, at full replication

``pidkey`` is the pid's UTF-8 bytes when they are at most 448 bytes long; a longer pid is
cut to 448 bytes and followed by 16 bytes of its BLAKE2b hash, because LMDB keys are at
most 511 bytes. Pid order is therefore exact except between two pids longer than 448
bytes that share their first 448 bytes, which are ordered by hash.

Every task lives in exactly one of ``ready`` (+ ``avail``; state AVAILABLE, no key),
``keyed`` (+ ``avail``; AVAILABLE with a key) or ``timers`` (LEASED, DELAYED or PENDING; a
keyed leased task is in ``keyed`` too). A queue record's counters always equal the number of
its tasks in each state, as they change in the same LMDB transaction as the tasks.

Why this shape: leasing is a cursor seek to ``qid gen`` in ``ready`` and a short walk, so
it costs O(k log n) whatever the number of leased or delayed tasks; expiry and delays are
one ordered index across all queues that a sweeper walks from its start; deleting a queue
bumps ``gen`` so its old keys become invisible at once and are reaped by key range.

The environment is opened ``sync=True, metasync=False`` by default: one write transaction
per WAL group commit (``commit.py``), each fdatasyncing its pages before its meta page is
written, so a power loss rolls the index back by at most one commit and never corrupts it.
The WAL is what makes a change durable first. Each applied WAL record writes its ticket to
``meta/applied`` in the same transaction as its changes (see ``ops.py``), so replay skips
what the environment already holds.
"""

from __future__ import annotations

import heapq
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, cast

import lmdb
import msgpack
from sortedcontainers import SortedDict

from squall.common.security.files import FILE_MODE, private_dir
from squall.master.storage.records import (
    AVAILABLE,
    DELAYED,
    LEASED,
    PENDING,
    QG,
    W_ENQUEUED,
    W_EXPIRY,
    W_NOT_BEFORE,
    W_PAYLOAD,
    W_PID,
    W_STATE,
    Old,
    QueueRec,
    Task,
    gname,
    keyed_key,
    old_of_wire,
    qprefix,
    task_key,
    wire_key,
)

U32 = struct.Struct(">I")
U64 = struct.Struct(">Q")
_TIMER = struct.Struct(">QII")
_packb = msgpack.packb
_U64 = U64.pack
_NO_HINT = object()
MAX_FREED = 1_000_000
# The hottest LMDB calls, with positional arguments: py-lmdb parses keyword arguments
# slowly (~0.1 us a call, ~9 calls per leased and acked task). put(key, value, dupdata,
# overwrite, append, db); delete(key, value, db); get(key, default, db).
_put = lmdb.Transaction.put
_delete = lmdb.Transaction.delete


@dataclass(slots=True)
class Totals:
    """Sums over every queue record, kept as the records change (O(1) per change), so the
    cluster totals never walk the queue table: `queues` (records), `holding` (records
    holding tasks), tasks by state, and completions of the current generations."""

    queues: int = 0
    holding: int = 0
    available: int = 0
    leased: int = 0
    delayed: int = 0
    pending: int = 0
    completed: int = 0

    def add(self, q: QueueRec, sign: int = 1) -> None:
        """Count (sign 1) or uncount (sign -1) a whole queue record."""
        self.queues += sign
        self.holding += sign if q.size else 0
        self.available += sign * q.available
        self.leased += sign * q.leased
        self.delayed += sign * q.delayed
        self.pending += sign * q.pending
        self.completed += sign * q.completed

    @classmethod
    def of(cls, queues: Iterable[QueueRec]) -> Totals:
        t = cls()
        for q in queues:
            t.add(q)
        return t


class Index:
    """The LMDB environment and its databases. One per data directory per process."""

    def __init__(self, path: str, map_size: int = 1 << 38, sync: bool = True) -> None:
        # sync=True (the default): every commit (one per WAL group) fdatasyncs, so a power
        # loss cannot leave a half-flushed B-tree behind. sync=False (--no-index-sync):
        # checkpoints sync LMDB, and a power loss can corrupt it (docs/master.md).
        private_dir(path)  # lmdb would make it with the files' mode
        self.env = lmdb.open(path, map_size=map_size, max_dbs=32, sync=sync, metasync=False,
                             writemap=False, readahead=False, max_readers=256, mode=FILE_MODE)
        db = self.env.open_db
        self.meta, self.queues_db, self.qids_db = db(b"meta"), db(b"queues"), db(b"qids")
        self.tasks, self.ready, self.avail = db(b"tasks"), db(b"ready"), db(b"avail")
        self.timers, self.conf, self.reap_db = db(b"timers"), db(b"conf"), db(b"reap")
        self.blobs = db(b"blobs")
        self.dedup = db(b"dedup")  # enqueue idempotency keys (master/tasks/dedup.py)
        self.keyed = db(b"keyed")  # tasks with a flow-control key (master/tasks/flow.py)
        # batches, their members' results, unique/debounce holders (master/tasks/batches.py
        # and unique.py document their layouts)
        self.batch_db, self.bresults, self.uniq = db(b"batches"), db(b"bresults"), db(b"uniq")
        # a keyed task changed: (queue, pidkey, old key, old state, new key, new state),
        # "" / -1 for none; set by master/tasks/flow.py, which keeps per-key counts
        self.on_key: Callable[[QueueRec, bytes, str, int, str, int], None] | None = None
        # the in-memory state was (re)loaded: flow.py rebuilds its counts from ``keyed``
        self.on_reload: Callable[[], None] | None = None
        self.conf_version = 0  # bumped by every policy or pause change
        self.pauses: dict[tuple[str, str], dict[str, Any]] = {}  # ('C', 'F') ops
        # blob ids whose last task reference went away (dequeued, deleted, reaped): soft
        # state for blob GC, which re-checks `blobs` before deleting anything. Bounded.
        # Frees of the open batch wait in `freed_pending` until it commits (commit.py).
        self.freed: list[str] = []
        self.freed_pending: list[str] = []
        self.queues: SortedDict[tuple[str, str], QueueRec] = SortedDict()
        self.by_qid: dict[int, QueueRec] = {}
        self.totals = Totals()  # sums over `queues`, kept with every counter change
        self.policies: dict[tuple[str, str], dict[str, Any]] = {}
        self.schedules: dict[tuple[str, str], dict[str, Any]] = {}
        self.node_marks: dict[tuple[str, str], dict[str, Any]] = {}  # ("", node_id) -> mark
        # (state, due_ms, enq_ms, blob), or None for absent, of task keys read while planning the
        # current write txn, so applying the plan need not read and decode them again.
        # Valid within one write txn only: begin_write() clears it.
        self.hints: dict[bytes, Old | None] = {}
        self.reload()

    def begin_write(self) -> lmdb.Transaction:
        self.hints.clear()
        return self.env.begin(write=True)

    def reload(self) -> None:
        """(Re)load the in-memory copies (meta, queues, policies, schedules) from LMDB."""
        queues: SortedDict[tuple[str, str], QueueRec] = SortedDict()
        with self.env.begin() as txn:
            self.applied = self._meta_int(txn, b"applied")
            self.lease_seq = self._meta_int(txn, b"lease_seq")
            self.auto_pid = self._meta_int(txn, b"auto_pid")
            self.next_qid = self._meta_int(txn, b"next_qid") or 1
            self.enqueued_total = self._meta_int(txn, b"enqueued_total")
            self.completed_total = self._meta_int(txn, b"completed_total")
            for k, v in txn.cursor(db=self.queues_db):
                group, name = bytes(k).decode().split("\x00", 1)
                queues[(group, name)] = QueueRec(group, name, *msgpack.unpackb(v))
            self.policies, self.schedules, self.node_marks = {}, {}, {}
            self.pauses = {}
            self.ha_conf: dict[tuple[str, str], dict[str, Any]] = {}  # a master set's members
            self.sqs_keys: dict[tuple[str, str], dict[str, Any]] = {}  # ("", credential id)
            self.revocations: dict[tuple[str, str], dict[str, Any]] = {}  # same: expiry
            for k, v in txn.cursor(db=self.conf):
                group, name = bytes(k[1:]).decode().split("\x00", 1)
                self._conf(bytes(k[:1]))[(group, name)] = msgpack.unpackb(v)
        self.queues = queues
        self.by_qid = {q.qid: q for q in queues.values()}
        self.totals = Totals.of(queues.values())
        self.conf_version += 1
        if self.on_reload is not None:
            self.on_reload()

    # -- reads ---------------------------------------------------------------------------
    def _meta_int(self, txn: lmdb.Transaction, key: bytes) -> int:
        raw = txn.get(key, db=self.meta)
        return U64.unpack(raw)[0] if raw else 0

    def get_task(self, txn: lmdb.Transaction, q: QueueRec, pid: bytes) -> Task | None:
        w = self.get_wire(txn, q, pid)
        return None if w is None else Task(*w)

    def get_wire(self, txn: lmdb.Transaction, q: QueueRec, pid: bytes) -> list[Any] | None:
        """:meth:`get_task` as the task's wire list (see Task.to_wire), remembered as a
        hint."""
        key = task_key(q.qid, q.gen, pid)
        raw = txn.get(key, None, self.tasks)  # positional: see _put
        if raw is None:
            self.hints[key] = None
            return None
        w: list[Any] = msgpack.unpackb(raw)
        self.hints[key] = old_of_wire(w)
        return w if w[W_PID].encode() == pid else None

    def read_task(self, txn: lmdb.Transaction, key: bytes) -> Task:
        """The task at a key known to exist (from an index), remembered as a hint."""
        return Task(*self.read_wire(txn, key))

    def read_wire(self, txn: lmdb.Transaction, key: bytes) -> list[Any]:
        """:meth:`read_task` as the task's wire list (see Task.to_wire)."""
        raw = txn.get(key, None, self.tasks)
        assert raw is not None, "index points at a missing task"
        w: list[Any] = msgpack.unpackb(raw)
        self.hints[key] = old_of_wire(w)
        return w

    def iter_ready(self, txn: lmdb.Transaction, q: QueueRec, max_key: bytes | None,
                   limit: int) -> Iterator[bytes]:
        """Yield the pidkeys of up to `limit` ready tasks of `q` (<= max_key): keyless and
        keyed ones. In pid order when every keyed one is among the first `limit` found
        (always, for a limit above the queue's size); for a lease use the engine, whose
        order is exact (and honours flow control)."""
        plain = [k[8:] for k in self.ready_keys(txn, q, max_key, limit)]
        keyed = self.keyed_ready(txn, q, max_key, limit)
        if not keyed:
            yield from plain
            return
        yield from heapq.nsmallest(limit, heapq.merge(plain, sorted(keyed)))

    def keyed_ready(self, txn: lmdb.Transaction, q: QueueRec, max_key: bytes | None,
                    limit: int) -> list[bytes]:
        """Pidkeys of up to `limit` ready keyed tasks of `q` (<= max_key), in no order."""
        out: list[bytes] = []
        prefix = qprefix(q.qid, q.gen)
        cur = txn.cursor(db=self.keyed)
        if limit <= 0 or not cur.set_range(prefix):
            return out
        for k in cast(Iterator[bytes], cur.iternext(keys=True, values=False)):
            if not k.startswith(prefix) or len(out) >= limit:
                break
            if k[16] == AVAILABLE and (max_key is None or k[17:] <= max_key):
                out.append(bytes(k[17:]))
        return out

    def ready_keys(self, txn: lmdb.Transaction, q: QueueRec, max_key: bytes | None,
                   limit: int) -> list[bytes]:
        """:meth:`iter_ready` as the tasks' full keys (``tasks`` and ``ready`` share
        them), for the lease loop."""
        out: list[bytes] = []
        prefix = qprefix(q.qid, q.gen)
        cur = txn.cursor(db=self.ready)
        if limit <= 0 or not cur.set_range(prefix):
            return out
        bound = prefix + max_key if max_key is not None else None
        for k in cast(Iterator[bytes], cur.iternext(keys=True, values=False)):
            if not k.startswith(prefix) or (bound is not None and k > bound):
                break
            out.append(k)
            if len(out) >= limit:
                break
        return out

    def iter_tasks(self, txn: lmdb.Transaction, q: QueueRec, after: bytes = b"",
                   limit: int = 100) -> Iterator[Task]:
        """Up to `limit` tasks of `q` in pid order, starting after pidkey `after`."""
        prefix = qprefix(q.qid, q.gen)
        cur = txn.cursor(db=self.tasks)
        if not cur.set_range(prefix + after):
            return
        n = 0
        for k, v in cast(Iterator[tuple[bytes, bytes]], cur):
            if not k.startswith(prefix) or n >= limit:
                return
            if after and bytes(k[8:]) == after:
                continue
            n += 1
            yield Task.unpack(v)

    def oldest_available_ms(self, txn: lmdb.Transaction, q: QueueRec) -> int | None:
        prefix = qprefix(q.qid, q.gen)
        cur = txn.cursor(db=self.avail)
        if not cur.set_range(prefix) or not bytes(cur.key()).startswith(prefix):
            return None
        return int(U64.unpack_from(cur.key(), 8)[0])

    def due_timers(self, txn: lmdb.Transaction, now_ms: int, limit: int
                   ) -> list[tuple[bytes, int, int, bytes]]:
        """Up to `limit` (timer key, qid, gen, pidkey) due by now_ms, earliest first."""
        out: list[tuple[bytes, int, int, bytes]] = []
        cur = txn.cursor(db=self.timers)
        if not cur.first():
            return out
        for k in cur.iternext(keys=True, values=False):
            due, qid, gen = _TIMER.unpack_from(k)
            if due > now_ms or len(out) >= limit:
                break
            out.append((bytes(k), qid, gen, bytes(k[_TIMER.size:])))
        return out

    # -- writes --------------------------------------------------------------------------
    def _old(self, txn: lmdb.Transaction, key: bytes) -> Old | None:
        old = self.hints.pop(key, _NO_HINT)
        if old is not _NO_HINT:
            return old  # type: ignore[return-value]
        raw = txn.get(key, None, self.tasks)
        if raw is None:
            return None
        return old_of_wire(msgpack.unpackb(raw))

    def _unindex(self, txn: lmdb.Transaction, key: bytes, old: Old) -> None:
        if old[4]:  # keyed
            if old[0] not in (DELAYED, PENDING):  # DELAYED and PENDING: in timers only
                _delete(txn, keyed_key(key, old[4], old[0]), b"", self.keyed)
            if old[0] == AVAILABLE:
                _delete(txn, key[:8] + _U64(old[2]) + key[8:], b"", self.avail)
            else:
                _delete(txn, _U64(old[1]) + key, b"", self.timers)
            return
        if old[0] == AVAILABLE:
            _delete(txn, key, b"", self.ready)
            _delete(txn, key[:8] + _U64(old[2]) + key[8:], b"", self.avail)
        else:
            _delete(txn, _U64(old[1]) + key, b"", self.timers)

    def count(self, q: QueueRec, state: int, delta: int) -> None:
        """`delta` tasks of `q` entered (or left, negative) `state`: the queue's counters
        and :attr:`totals` change together."""
        held = q.size
        q.count(state, delta)
        t = self.totals
        if state == AVAILABLE:
            t.available += delta
        elif state == LEASED:
            t.leased += delta
        elif state == DELAYED:
            t.delayed += delta
        else:
            t.pending += delta
        if not held:
            t.holding += 1
        elif held + delta == 0:
            t.holding -= 1

    def clear_queue(self, q: QueueRec, gen: int, now_ms: int) -> None:
        """A new generation of `q`, empty (its old tasks are reaped later)."""
        self.totals.add(q, -1)
        q.gen, q.available, q.leased, q.delayed, q.pending = gen, 0, 0, 0, 0
        q.completed, q.enqueued_total, q.created_ms = 0, 0, now_ms
        self.totals.add(q)

    def put_task(self, txn: lmdb.Transaction, q: QueueRec, t: Task, *, enqueue: bool) -> None:
        """Insert or replace a task, keeping the indexes and counters exact."""
        self.put_wire(txn, q, t.to_wire(), enqueue=enqueue)

    def put_wire(self, txn: lmdb.Transaction, q: QueueRec, w: list[Any], *, enqueue: bool
                 ) -> bytes:
        """:meth:`put_task` for a task's wire list (a WAL op's); returns its packed record
        (the same bytes msgpack gives the list anywhere, e.g. inside a WAL record)."""
        pid = w[W_PID].encode()
        key = task_key(q.qid, q.gen, pid)
        old = self._old(txn, key)
        if old is not None:
            self._unindex(txn, key, old)
            self.count(q, old[0], -1)
        elif enqueue:
            q.enqueued_total += 1
            self.enqueued_total += 1
        raw = _packb(w)
        _put(txn, key, raw, True, True, False, self.tasks)
        payload, state = w[W_PAYLOAD], w[W_STATE]
        if payload and (old is None or old[3] != payload["blob_id"]):
            self.ref_blob(txn, payload["blob_id"], +1)
        if old is not None and old[3] is not None and (
                not payload or old[3] != payload["blob_id"]):  # a debounce replaced it
            self.ref_blob(txn, old[3], -1)
        fkey = wire_key(w)
        if (fkey or (old is not None and old[4])) and self.on_key is not None:
            if old is not None and old[4]:
                self.on_key(q, key[8:], old[4], old[0], fkey, state)
            else:
                self.on_key(q, key[8:], "", -1, fkey, state)
        if fkey:
            if state not in (DELAYED, PENDING):  # DELAYED and PENDING: in timers only
                _put(txn, keyed_key(key, fkey, state), fkey.encode(), True, True, False,
                     self.keyed)
            if state == AVAILABLE:
                _put(txn, key[:8] + _U64(w[W_ENQUEUED]) + key[8:], b"", True, True, False,
                     self.avail)
            else:
                due = w[W_EXPIRY] if state in (LEASED, PENDING) else w[W_NOT_BEFORE]
                _put(txn, _U64(due) + key, b"", True, True, False, self.timers)
        elif state == AVAILABLE:
            _put(txn, key, b"", True, True, False, self.ready)
            _put(txn, key[:8] + _U64(w[W_ENQUEUED]) + key[8:], b"", True, True, False,
                 self.avail)
        else:
            due = w[W_EXPIRY] if state in (LEASED, PENDING) else w[W_NOT_BEFORE]
            _put(txn, _U64(due) + key, b"", True, True, False, self.timers)
        self.count(q, state, +1)
        return raw

    def delete_task(self, txn: lmdb.Transaction, q: QueueRec, pid: bytes, *,
                    completed: bool) -> bool:
        key = task_key(q.qid, q.gen, pid)
        old = self._old(txn, key)
        if old is None or not _delete(txn, key, b"", self.tasks):
            return False
        self._unindex(txn, key, old)
        self.count(q, old[0], -1)
        if old[4] and self.on_key is not None:
            self.on_key(q, key[8:], old[4], old[0], "", -1)
        if old[3] is not None:
            self.ref_blob(txn, old[3], -1)
        if completed:
            q.completed += 1
            self.totals.completed += 1
            self.completed_total += 1
        return True

    def create_queue(self, txn: lmdb.Transaction, group: str, name: str, qid: int,
                     created_ms: int) -> QueueRec:
        q = self.queues.get((group, name))
        if q is None:
            q = QueueRec(group, name, qid, created_ms=created_ms)
            self.queues[(group, name)] = q
            self.by_qid[qid] = q
            self.totals.queues += 1
            txn.put(U32.pack(qid), msgpack.packb([group, name]), db=self.qids_db)
        self.next_qid = max(self.next_qid, qid + 1)
        return q

    def save_queue(self, txn: lmdb.Transaction, q: QueueRec) -> None:
        txn.put(gname(q.group, q.name), q.pack(), db=self.queues_db)

    def save_meta(self, txn: lmdb.Transaction) -> None:
        txn.put(b"applied", U64.pack(self.applied), db=self.meta)
        txn.put(b"lease_seq", U64.pack(self.lease_seq), db=self.meta)
        txn.put(b"auto_pid", U64.pack(self.auto_pid), db=self.meta)
        txn.put(b"next_qid", U64.pack(self.next_qid), db=self.meta)
        txn.put(b"enqueued_total", U64.pack(self.enqueued_total), db=self.meta)
        txn.put(b"completed_total", U64.pack(self.completed_total), db=self.meta)

    def set_conf(self, txn: lmdb.Transaction, kind: bytes, group: str, name: str,
                 value: dict[str, Any] | None) -> None:
        target = self._conf(kind)
        key = kind + gname(group, name)
        old_blob = (target.get((group, name)) or {}).get("payload") or {}
        new_blob = (value or {}).get("payload") or {}
        if old_blob.get("blob_id") != new_blob.get("blob_id"):  # a schedule's payload
            if new_blob:
                self.ref_blob(txn, new_blob["blob_id"], +1)
            if old_blob:
                self.ref_blob(txn, old_blob["blob_id"], -1)
        if kind in (b"P", b"F"):
            self.conf_version += 1
        if value is None:
            txn.delete(key, db=self.conf)
            target.pop((group, name), None)
        else:
            txn.put(key, msgpack.packb(value), db=self.conf)
            target[(group, name)] = value

    def _conf(self, kind: bytes) -> dict[tuple[str, str], dict[str, Any]]:
        return {b"P": self.policies, b"N": self.node_marks,
                b"F": self.pauses, b"H": self.ha_conf,
                b"A": self.sqs_keys, b"V": self.revocations}.get(kind, self.schedules)

    def ref_blob(self, txn: lmdb.Transaction, blob_id: str, delta: int) -> None:
        """Count a reference to a payload up or down; at zero it is freed for blob GC."""
        k = blob_id.encode()
        raw = txn.get(k, db=self.blobs)
        n = (U32.unpack(raw)[0] if raw else 0) + delta
        if n > 0:
            txn.put(k, U32.pack(n), db=self.blobs)
            return
        txn.delete(k, db=self.blobs)
        if len(self.freed) + len(self.freed_pending) < MAX_FREED:
            self.freed_pending.append(blob_id)

    def blob_referenced(self, txn: lmdb.Transaction, blob_id: str) -> bool:
        return txn.get(blob_id.encode(), db=self.blobs) is not None

    # -- reaping deleted generations ------------------------------------------------------
    def pending_reap(self, txn: lmdb.Transaction) -> tuple[int, int] | None:
        cur = txn.cursor(db=self.reap_db)
        return QG.unpack(cur.key()) if cur.first() else None

    def reap(self, txn: lmdb.Transaction, qid: int, gen: int, limit: int) -> int:
        """Delete up to `limit` tasks of a deleted generation by key range, freeing their
        payloads. Their ``timers`` entries are dropped by the sweeper when due. When
        nothing is left, the generation is done. Returns the tasks deleted."""
        prefix = qprefix(qid, gen)
        n = 0
        cur = txn.cursor(db=self.tasks)
        if cur.set_range(prefix):
            while n < limit and bytes(cur.key()).startswith(prefix):
                v = cur.value()
                if v[-3:] != b"\xc0\xa0\xa0":  # payload, error, origin not nil, "", ""
                    p = msgpack.unpackb(v)[11]
                    if p:
                        self.ref_blob(txn, p["blob_id"], -1)
                n += 1
                if not cur.delete():
                    break
        for db in (self.ready, self.avail, self.keyed, self.uniq):
            c = txn.cursor(db=db)
            m = 0
            if c.set_range(prefix):
                while m < limit and bytes(c.key()).startswith(prefix) and c.delete():
                    m += 1
        if n < limit:
            txn.delete(prefix, db=self.reap_db)
        return n

    def sync(self) -> None:
        self.env.sync(True)

    def close(self) -> None:
        self.env.close()
