"""A request's view of the index and the plan it builds (see :mod:`squall.master.tasks.engine`).

Planning reads the index inside the write transaction that will apply the plan, through
:class:`View`: committed state plus what earlier items of the same request changed, so an
update such as "dequeue X from A, enqueue X into B" sees its own effects. Every change is
recorded as a WAL op in the :class:`Plan`; nothing touches the index until the plan is
logged and applied.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import lmdb

from squall.common.wire.names import check_name
from squall.master.storage.ops import Op
from squall.master.storage.records import AVAILABLE, QueueRec, Task
from squall.master.tasks import batches, policies

if TYPE_CHECKING:
    from squall.master.tasks.engine import Engine


@dataclass
class Plan:
    """Ops to log and apply, what to answer once they are durable, and metric events."""

    ops: list[Op] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)
    events: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    # (group, queue) -> (seconds from lease to dequeue, summed; dequeues)
    lease_secs: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)


class View:
    """The index as seen by one request: committed state plus this request's own changes."""

    def __init__(self, engine: Engine, txn: lmdb.Transaction, group: str) -> None:
        self.e, self.txn, self.group = engine, txn, check_name("group", group)
        # tasks this request changed: a Task, or the wire list of one (see wire()), or None
        self.tasks: dict[tuple[int, bytes], Task | list[Any] | None] = {}
        self.new_queues: dict[str, QueueRec] = {}
        self.plan = Plan()
        self.lease_seq = engine.index.lease_seq
        self.auto_pid = engine.index.auto_pid
        self.keys: dict[str, tuple[str, str]] = {}  # idempotency keys used by this request
        # batches read or changed by this request (batches.py), unique holders (unique.py)
        self.batches: dict[str, dict[str, Any] | None] = {}
        self.batches_dirty: set[str] = set()
        self.uniq: dict[tuple[int, str], str] = {}

    def queue(self, name: str, create: bool = False) -> QueueRec | None:
        q = self.new_queues.get(name) or self.e.index.queues.get((self.group, name))
        if q is None:
            check_name("queue", name)  # known queues' names were checked when created
        if q is None and create:
            qid = self.e.index.next_qid + len(self.new_queues)
            q = QueueRec(self.group, name, qid)
            self.new_queues[name] = q
            self.plan.ops.append(("Q", self.group, name, qid, self.e.now_ms()))
        return q

    def task(self, q: QueueRec, pid: bytes) -> Task | None:
        w = self.wire(q, pid)
        return None if w is None else Task(*w)

    def wire(self, q: QueueRec, pid: bytes) -> list[Any] | None:
        """The task's wire list (Task.to_wire) as this request sees it: read it, never
        change it (it may be a pending op's)."""
        key = (q.qid, pid)
        if key in self.tasks:
            t = self.tasks[key]
            return t.to_wire() if isinstance(t, Task) else t
        if q.name in self.new_queues:
            return None
        return self.e.index.get_wire(self.txn, q, pid)

    def put(self, q: QueueRec, t: Task, *, enqueue: bool) -> None:
        self.tasks[(q.qid, t.pid.encode())] = t
        self.plan.ops.append(("P", q.qid, q.gen, t.to_wire(), enqueue))
        if enqueue:
            self.plan.events[(q.group, q.name, "enqueue")] += 1

    def put_wire(self, q: QueueRec, pid_raw: bytes, w: list[Any], *, enqueue: bool) -> None:
        """:meth:`put` of a task's wire list (no Task object made; nobody changes `w`
        afterwards: it is the op's)."""
        self.tasks[(q.qid, pid_raw)] = w
        self.plan.ops.append(("P", q.qid, q.gen, w, enqueue))
        if enqueue:
            self.plan.events[(q.group, q.name, "enqueue")] += 1

    def delete(self, q: QueueRec, pid: str, *, completed: bool = True) -> None:
        self.tasks[(q.qid, pid.encode())] = None
        self.plan.ops.append(("D", q.qid, q.gen, pid, completed))
        if completed:
            self.plan.events[(q.group, q.name, "dequeue")] += 1

    def dead_letter(self, q: QueueRec, t: Task, reason: str) -> None:
        """Move `t` from `q` to its dead-letter queue (same group), keeping its payload."""
        dlq = self.queue(policies.dead_letter_queue(self.e.policy(q), q.name), create=True)
        assert dlq is not None
        self.delete(q, t.pid, completed=False)
        d = t.copy()
        d.state, d.live, d.expiry_ms, d.not_before_ms = AVAILABLE, False, 0, 0
        d.error, d.origin = reason, q.name
        if d.ext and "b" in d.ext:  # a batch member: counted failed, it leaves the batch
            batches.failed(self, d)
        self.put(dlq, d, enqueue=True)
        self.plan.events[(q.group, q.name, "dead_letter")] += 1

    def finish(self, result: dict[str, Any]) -> Plan:
        idx = self.e.index
        if self.batches_dirty:
            batches.flush(self)
        if self.lease_seq != idx.lease_seq or self.auto_pid != idx.auto_pid:
            self.plan.ops.append(("M", self.lease_seq, self.auto_pid))
        self.plan.result = result
        return self.plan
