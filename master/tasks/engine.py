"""Task semantics: turn a request into WAL ops (a plan), all or nothing.

Planning reads the index inside the write transaction that will apply the plan, through a
small overlay (:class:`~squall.master.tasks.view.View`) holding what earlier items of the same
request changed, so an update such as "dequeue X from A, enqueue X into B" sees its own
effects. Any invalid item raises before anything is applied; the transaction then aborts
and nothing is logged.

Leases: a lease sets the task LEASED with a new token from one global sequence (tokens are
never reused, so a token from a dequeued-and-requeued task can never match). The holder of
the current token may renew, release or dequeue; an expired lease keeps its token valid
until someone else leases the task. On the wire a token is that number sealed with a MAC
(:mod:`squall.master.tasks.leasetokens`): sealed in lease answers, opened in :meth:`Engine.held`,
where a forged or borrowed token opens to 0 and is refused as stale. The sweeper
(:meth:`Engine.sweep`) moves due timers (expired leases, delays that ended) to ``ready``;
it runs before every lease and in the background, so an expired task is hidden for at
most one sweep interval. With a retry backoff policy an expired task waits out its backoff
first (its token still valid).

Dead letters (SQS's maxReceiveCount): when a task that has been leased ``max_attempts``
times comes up for lease again, or its holder releases it with an error on its last
attempt, it moves to the dead-letter queue with its attempts, payload and a reason.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import lmdb

from squall.common.clock import Clock
from squall.common.errors import BadRequest, LeaseLost, NotFound
from squall.common.wire.models import (
    EnqueueItem,
    LeaseRef,
    LeaseRequest,
    PayloadRef,
    ReleaseItem,
    RenewItem,
    TaskSpec,
    UpdateLease,
    UpdateRequest,
)
from squall.common.wire.names import check_name, check_pid, join_queue
from squall.master.storage.index import Index
from squall.master.storage.records import (
    AVAILABLE,
    DELAYED,
    LEASED,
    PENDING,
    STATE_NAMES,
    W_EXT,
    W_KEY,
    QueueRec,
    Task,
    pidkey,
    qprefix,
)
from squall.master.tasks import batches, pending, policies, unique
from squall.master.tasks.dedup import Dedup
from squall.master.tasks.flow import Flow
from squall.master.tasks.leasetokens import LeaseTokens
from squall.master.tasks.view import Plan, View

AUTO_PID_DIGITS = 20
LEASE_SCAN_FACTOR = 4  # a lease looks at most this many times max_tasks ready tasks


def ms(t: float) -> int:
    return int(t * 1000)


def extras(ext: dict[str, Any]) -> dict[str, Any]:
    """A task's extras (Task.ext) as lease answers and task lookups give them."""
    out = {}
    if "b" in ext:
        out["batch"] = ext["b"]
    if "cb" in ext:
        out["callback_of"] = ext["cb"]
    if "tp" in ext:
        out["traceparent"] = ext["tp"]
        if "ts" in ext:
            out["tracestate"] = ext["ts"]
    return out


def _plain_payload(p: PayloadRef) -> dict[str, Any]:
    return p.model_dump(exclude={"receipts", "token"})


class Engine:
    def __init__(self, index: Index, clock: Clock, tokens: LeaseTokens,
                 store_payload: Callable[[PayloadRef], dict[str, Any]] = _plain_payload
                 ) -> None:
        self.index = index
        self.clock = clock
        self.tokens = tokens  # fencing numbers <-> wire tokens (see leasetokens.py)
        self.store_payload = store_payload  # checks a payload's write receipts
        self.swept_expired = 0
        self.swept: list[tuple[str, str]] = []  # queues the last sweep made tasks due in
        self.dedup: Dedup | None = None  # idempotency keys (set by the master)
        self.flow = Flow(index, self.now_ms)  # keys, limits, fairness, pause (flow.py)
        # pending tasks past their deadline, for housekeeping to settle (pending.py):
        # (group, queue, pid) -> (payload, enqueued_ms)
        self.unsettled: dict[tuple[str, str, str], tuple[dict[str, Any], int]] = {}

    def now_ms(self) -> int:
        return ms(self.clock.now())

    def policy(self, q: QueueRec) -> dict[str, Any]:
        return policies.effective(self.index, q.group, q.name)

    # -- update (enqueue / dequeue / renew / release, atomically) ------------------------
    def plan_update(self, txn: lmdb.Transaction, group: str, req: UpdateRequest,
                    worker_addr: str = "") -> Plan:
        v = View(self, txn, group)
        now = self.now_ms()
        held_ms: dict[tuple[str, str], tuple[int, int]] = {}
        for d in req.dequeue:
            q, w = self.held(v, d)
            v.delete(q, w[0])  # pid
            if len(w) > W_EXT:  # a batch member or callback (batches.py)
                batches.dequeued(v, q, w[W_EXT], w[0], d.result)
            k = (q.group, q.name)
            total, n = held_ms.get(k, (0, 0))
            held_ms[k] = (total + now - w[8], n + 1)  # leased at
        v.plan.lease_secs = {k: (total / 1000, n) for k, (total, n) in held_ms.items()}
        renewed = [self._renew(v, r, now) for r in req.renew]
        for r in req.release:
            self._release(v, r, now)
        enqueued = [self.enqueue(v, e.queue, e, now) for e in req.enqueue]
        result = {"enqueued": enqueued, "dequeued": len(req.dequeue), "renewed": renewed,
                  "released": len(req.release)}
        if req.lease is not None:  # last: it never takes what this update just touched
            result["leased"] = self._lease(v, req.lease.queue, req.lease, worker_addr, now)
        return v.finish(result)

    def plan_enqueue(self, txn: lmdb.Transaction, group: str, queue: str,
                     tasks: list[TaskSpec]) -> Plan:
        v = View(self, txn, group)
        now = self.now_ms()
        return v.finish({"enqueued": [self.enqueue(v, queue, s, now) for s in tasks]})

    def plan_pending(self, txn: lmdb.Transaction, group: str, items: list[EnqueueItem],
                     extra: dict[str, Any], deadline_ms: int) -> Plan:
        """A front door's enqueues logged *pending* (master/tasks/pending.py): never
        leased until confirmed; `extra` (replicas, node) is kept in each payload
        reference until then."""
        v = View(self, txn, group)
        now = self.now_ms()
        return v.finish({"enqueued": [
            self.enqueue(v, e.queue, e, now, hold=(extra, now + deadline_ms))
            if e.payload is not None else self.enqueue(v, e.queue, e, now)
            for e in items]})

    def enqueue(self, v: View, queue: str, s: TaskSpec | EnqueueItem, now: int,
                stored_payload: dict[str, Any] | None = None,
                ext: dict[str, Any] | None = None,
                hold: tuple[dict[str, Any], int] | None = None) -> dict[str, Any]:
        """Enqueue one task; `ext`: extras a batch gives its members and callbacks; `hold`
        (extra payload fields, deadline): logged pending."""
        q = v.queue(queue, create=True)
        assert q is not None
        if s.pid is None:
            v.auto_pid = max(now * 1000, v.auto_pid + 1)
            pid = f"{v.auto_pid:0{AUTO_PID_DIGITS}d}"
            raw = pid.encode()  # digits: a valid pid
        else:
            pid = s.pid
            raw = check_pid(pid)
        if s.not_before is not None and s.delay_secs is not None:  # bad even if it collapses
            raise BadRequest(f"task {pid!r}: give not_before or delay_secs, not both")
        fkey = s.key
        if fkey is not None:
            check_name("key", fkey)
        key = s.idempotency_key
        hit = self._collapse(v, q, queue, pid, raw, key, now)
        if hit is not None:
            return hit
        nb = ms(s.not_before) if s.not_before is not None else now + ms(s.delay_secs or 0)
        if hold is not None and s.payload is not None:
            extra, deadline = hold
            if key is not None:
                extra = {**extra, "key": key}
            v.put_wire(q, raw, pending.pending_wire(pid, s.payload, extra, deadline,
                                                    nb if nb > now else 0, now),
                       enqueue=True)
            return {"queue": queue, "pid": pid, "collapsed": False}
        payload = stored_payload or (self.store_payload(s.payload)
                                     if s.payload is not None else None)
        if (s.unique is not None or s.debounce_secs is not None or s.batch is not None
                or s.traceparent is not None):  # extras (batches.py, unique.py)
            ext = dict(ext or {})
            got = self._extras(v, q, s, pid, payload, now, ext)
            if isinstance(got, dict):
                return got
            nb = got or nb
        # the new task's wire list (Task.to_wire: pid, state, token, live, expiry,
        # not_before, attempts, enqueued, leased, worker, worker_addr, payload, error, origin)
        w = ([pid, DELAYED, 0, False, 0, nb, 0, now, 0, "", "", payload, "", ""] if nb > now
             else [pid, AVAILABLE, 0, False, 0, 0, 0, now, 0, "", "", payload, "", ""])
        if ext:
            w.append(fkey or "")  # W_KEY
            w.append(ext)  # W_EXT
        elif fkey:
            w.append(fkey)  # W_KEY
        v.put_wire(q, raw, w, enqueue=True)
        return {"queue": queue, "pid": pid, "collapsed": False}

    def _collapse(self, v: View, q: QueueRec, queue: str, pid: str, raw: bytes,
                  key: str | None, now: int) -> dict[str, Any] | None:
        """The answer of an enqueue that collapses (its idempotency key used within the
        window, or its pid taken), else None (the key is then recorded)."""
        if key is not None and self.dedup is not None:
            mine = v.keys.get(key)  # used earlier in this request
            first = mine or self.dedup.get(v.txn, v.group, key, now)
            if first is not None:  # applied within the window: nothing to do
                fq = v.queue(first[0]) if mine is None else None
                fw = v.wire(fq, first[1].encode()) if fq is not None else None
                if fw is not None and fw[1] == PENDING:  # it may yet be removed
                    raise pending.busy(first[0], first[1])
                return {"queue": first[0], "pid": first[1], "collapsed": True}
            v.keys[key] = (queue, pid)
            v.plan.ops.append(self.dedup.op(v.group, key, queue, pid, now))
        old = v.wire(q, raw)
        if old is not None:
            # pending since an earlier request, it may yet be removed: a collapse could be
            # lost (one pending in this request stands or falls with this one)
            if old[1] == PENDING and (q.qid, raw) not in v.tasks:
                raise pending.busy(queue, pid)
            return {"queue": queue, "pid": pid, "collapsed": True}
        return None

    def _extras(self, v: View, q: QueueRec, s: TaskSpec, pid: str,
                payload: dict[str, Any] | None, now: int, ext: dict[str, Any]
                ) -> dict[str, Any] | int | None:
        """Fill a new task's extras from its spec; the answer of an enqueue that collapses
        into a unique key's holder, else a debounced task's not-before (ms) or None."""
        nb = None
        if s.key is not None and (s.unique is not None or s.debounce_secs is not None):
            hit = unique.check(v, q, s, s.key, payload, now)
            if hit is not None:
                return hit
            nb = unique.register(v, q, s, s.key, pid, ext, now)
        if s.batch is not None:
            batches.join(v, s.batch)
            ext["b"] = s.batch
        if s.traceparent is not None:
            ext["tp"] = s.traceparent
            if s.tracestate is not None:
                ext["ts"] = s.tracestate
        return nb

    def held(self, v: View, ref: LeaseRef) -> tuple[QueueRec, list[Any]]:
        """The task `ref` names, checked to be held by the caller's lease token, as its
        wire list (read only: see View.wire)."""
        q = v.queue(ref.queue)
        w = v.wire(q, check_pid(ref.pid)) if q is not None else None
        # w[2]: token, w[3]: live
        if (w is None or not w[3] or w[2] == 0
                or w[2] != self.tokens.open(v.group, ref.queue, ref.pid, ref.token)):
            self._not_held(v, ref, None if w is None else Task(*w))
        assert q is not None and w is not None
        return q, w

    def _not_held(self, v: View, ref: LeaseRef, t: Task | None) -> NoReturn:
        """Raise the error that says why `t` (the task `ref` names) is not held by `ref`."""
        where = f"task {ref.pid!r} in queue {join_queue(v.group, ref.queue)}"
        info = {"queue": ref.queue, "pid": ref.pid, "token": ref.token}
        if t is None:
            raise NotFound(f"{where} does not exist (already dequeued, or never enqueued)",
                           info)
        if t.token == 0:
            raise LeaseLost(f"{where} is not leased; lease it before acting on it.", info)
        # a token this master did not issue for this task opens to 0: answered as stale
        if t.token != self.tokens.open(v.group, ref.queue, ref.pid, ref.token):
            raise LeaseLost(
                f"{where}: lease token {ref.token} is stale (or not this task's); the task "
                "was leased again since. Another worker owns it now: drop this result.",
                info)
        raise LeaseLost(f"{where}: lease token {ref.token} was given up (released or "
                        "reset); lease the task again to work on it.", info)

    def _renew(self, v: View, r: RenewItem, now: int) -> dict[str, Any]:
        q, w = self.held(v, r)
        t = Task(*w)
        t.state, t.expiry_ms, t.not_before_ms = LEASED, now + ms(r.lease_secs), 0
        v.put(q, t, enqueue=False)
        return {"queue": r.queue, "pid": r.pid, "expires_at": t.expiry_ms / 1000}

    def _release(self, v: View, r: ReleaseItem, now: int) -> None:
        q, w = self.held(v, r)
        v.plan.events[(q.group, q.name, "release")] += 1
        t = Task(*w)
        t.live, t.expiry_ms = False, 0
        if r.unseen:  # leased ahead, given back unread: not an attempt
            t.attempts = max(0, t.attempts - 1)
        delay = ms(r.delay_secs) if r.delay_secs is not None else 0
        if r.error is not None:
            pol = self.policy(q)
            t.error = r.error
            if policies.exhausted(pol, t.attempts):
                v.dead_letter(q, t, policies.dead_letter_reason(
                    f"dead-lettered: failed {t.attempts} times (max_attempts "
                    f"{pol['max_attempts']})", r.error))
                return
            if r.delay_secs is None:
                delay = policies.backoff_ms(pol, t.attempts, t.pid)
        if delay > 0:
            t.state, t.not_before_ms = DELAYED, now + delay
        else:
            t.state, t.not_before_ms = AVAILABLE, 0
        v.put(q, t, enqueue=False)

    # -- lease ---------------------------------------------------------------------------
    def plan_lease(self, txn: lmdb.Transaction, group: str, queue: str, req: LeaseRequest,
                   worker_addr: str) -> Plan:
        v = View(self, txn, group)
        return v.finish({"tasks": self._lease(v, queue, req, worker_addr, self.now_ms())})

    def _lease(self, v: View, queue: str, req: LeaseRequest | UpdateLease, worker_addr: str,
               now: int) -> list[dict[str, Any]]:
        # validate before the lookup, so bad input is a 400 whether the queue exists or not
        max_key = pidkey(check_pid(req.max_pid)) if req.max_pid is not None else None
        q = v.queue(queue)
        if q is None:
            return []
        txn, group = v.txn, v.group
        pol = self.policy(q)
        expiry = now + ms(policies.lease_secs(pol, req.lease_secs))
        leased: list[dict[str, Any]] = []
        max_attempts = pol.get("max_attempts")
        k = req.max_tasks
        scan = k * LEASE_SCAN_FACTOR if max_attempts else k
        # the loop below runs for every leased task: names bound once, one op per task
        read, seal, seen, ops = self.index.read_wire, self.tokens.seal, v.tasks, v.plan.ops
        qid, gen, worker, expires_at = q.qid, q.gen, req.worker, expiry / 1000
        qf = self.flow.active(q)
        keys = (self.index.ready_keys(txn, q, max_key, scan) if qf is None else
                self.flow.select(txn, q, qf, max_key, k, now))
        for key in keys:
            if len(leased) >= k:
                break
            w = read(txn, key)  # the task's wire list (Task.to_wire), changed in place
            pid, attempts = w[0], w[6]
            tkey = (qid, pid.encode())
            if tkey in seen:  # changed earlier in this request
                continue
            if max_attempts is not None and policies.exhausted(pol, attempts):
                v.dead_letter(q, Task(*w), policies.dead_letter_reason(
                    f"dead-lettered: leased {attempts} times without being dequeued "
                    f"(max_attempts {max_attempts})", w[12]))
                continue
            token = v.lease_seq = v.lease_seq + 1
            attempts += 1
            # state, token, live, expiry; attempts; leased at, worker, worker address
            w[1], w[2], w[3], w[4] = LEASED, token, True, expiry
            w[6], w[8], w[9], w[10] = attempts, now, worker, worker_addr
            seen[tkey] = w  # View.put_wire, inlined
            ops.append(("P", qid, gen, w, False))
            leased.append({"queue": queue, "pid": pid,
                           "token": seal(group, queue, pid, token),
                           "expires_at": expires_at, "attempts": attempts,
                           "enqueued_at": w[7] / 1000, "payload": w[11]})
            if len(w) > W_KEY:
                if w[W_KEY]:
                    leased[-1]["key"] = w[W_KEY]
                if len(w) > W_EXT:
                    leased[-1].update(extras(w[W_EXT]))
        v.plan.events[(group, queue, "lease")] += len(leased)
        return leased

    # -- sweep ---------------------------------------------------------------------------
    def sweep(self, txn: lmdb.Transaction, limit: int) -> int:
        """Make due timers ready: ended delays, and expired leases (token stays valid),
        after their retry backoff if the queue's policy has one."""
        idx = self.index
        now = self.now_ms()
        due = idx.due_timers(txn, now, limit)
        self.swept_expired = 0  # expired leases in this sweep (metrics, once it committed)
        touched: dict[int, QueueRec] = {}
        for due_key, qid, gen, pk in due:
            q = idx.by_qid.get(qid)
            if q is None or q.gen != gen:  # a deleted queue generation: drop the stale timer
                txn.delete(due_key, db=idx.timers)
                continue
            t = idx.read_task(txn, qprefix(qid, gen) + pk)
            if t.state == PENDING:  # past its deadline: housekeeping settles it
                if len(self.unsettled) < pending.UNSETTLED_MAX:
                    self.unsettled[(q.group, q.name, t.pid)] = (t.payload or {}, t.enqueued_ms)
                t.expiry_ms = now + pending.RECHECK_MS  # not derived again before then
                idx.put_task(txn, q, t, enqueue=False)
                continue
            retry_at = 0
            if t.state == LEASED:
                retry_at = t.expiry_ms + policies.backoff_ms(self.policy(q), t.attempts, t.pid)
                t.error = "lease expired"
                self.swept_expired += 1
            if retry_at > now:
                t.state, t.expiry_ms, t.not_before_ms = DELAYED, 0, retry_at
            else:
                t.state, t.expiry_ms, t.not_before_ms = AVAILABLE, 0, 0
            idx.put_task(txn, q, t, enqueue=False)
            touched[qid] = q
        for q in touched.values():
            idx.save_queue(txn, q)
        self.swept = [(q.group, q.name) for q in touched.values()]
        return len(due)

    # -- reads ---------------------------------------------------------------------------
    def describe(self, q: QueueRec, t: Task) -> dict[str, Any]:
        now = self.now_ms()
        state = t.state
        if state != AVAILABLE and state != PENDING and t.due_ms() <= now:
            state = AVAILABLE
        return {
            "queue": q.name, "pid": t.pid, "state": STATE_NAMES[state], "attempts": t.attempts,
            "enqueued_at": t.enqueued_ms / 1000,
            "expires_at": t.expiry_ms / 1000 if state == LEASED else None,
            "not_before": t.not_before_ms / 1000 if state == DELAYED else None,
            "worker": t.worker if state == LEASED else None,
            "worker_addr": t.worker_addr if state == LEASED else None,
            "payload": pending.public(t.payload), "error": t.error or None,
            "origin": t.origin or None, "key": t.key or None, **extras(t.ext or {}),
        }

    def task_info(self, txn: lmdb.Transaction, group: str, queue: str, pid: str
                  ) -> dict[str, Any]:
        q = self.index.queues.get((check_name("group", group), check_name("queue", queue)))
        raw = check_pid(pid)  # a bad pid is a 400/413 whether the queue exists or not
        t = self.index.get_task(txn, q, raw) if q is not None else None
        if t is None or q is None:
            raise NotFound(f"task {pid!r} is not in queue {join_queue(group, queue)} "
                           "(done, deleted, or never enqueued)")
        return self.describe(q, t)
