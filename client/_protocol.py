"""The protocol core: every verb of the client as a generator of effects (``_effects.py``).

``Client`` and ``AsyncClient`` run these generators with their own driver; all request
building, answer parsing, retry decisions, payload placement and failover happen here, once.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any, TypeVar

from squall.client import _trace
from squall.client._admin import AdminVerbs
from squall.client._blobs import BATCH_BLOB_BYTES, Blobs, NodeBook
from squall.client._effects import Call, Gather, Proto, Retry, call, lost_answer, may_have_applied
from squall.client._fanin import FaninVerbs
from squall.client._frontdoor import FrontDoor
from squall.client._nodelease import NodeLease, checked
from squall.client._paths import qpath
from squall.client._payloads import PayloadVerbs
from squall.client._tasks import (
    NewTask,
    Payload,
    Stream,
    TaskBase,
    TxBuilder,
    as_source,
    fifo_pids,
    held_bytes,
)
from squall.common.errors import (
    BadRequest,
    SquallError,
)
from squall.common.wire.models import (
    MAX_BATCH,
    EnqueueResult,
    UpdateResponse,
)
from squall.common.wire.models import LeasedTask as WireTask
from squall.common.wire.names import split_queue

T = TypeVar("T", bound=TaskBase)
DEFAULT_MASTER = "http://127.0.0.1:7070"


def default_master() -> str:
    return os.environ.get("SQUALL_MASTER") or DEFAULT_MASTER


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def held_wire(queue: str, pid: str, token: str) -> tuple[WireTask, str]:
    """The wire form of a task known only by queue, pid and lease token (and its group)."""
    group, name = split_queue(queue)
    return WireTask(queue=name, pid=pid, token=token, expires_at=0.0, attempts=0,
                    enqueued_at=0.0), group


MAX_IN_FLIGHT = 16  # put_many batches sent at once
# put_many's default. B.put (batches of 100 tasks of 1 KiB) ran at 15.6k tasks/s with 16
# batches at once and 13.3k with 4 (six alternating runs each): the nodes and the master
# group-commit more per fsync. WAVE_BYTES bounds what many batches of large payloads hold.
IN_FLIGHT = 16
WAVE_BYTES = 64 << 20  # payload bytes put_many holds at once (at least one batch)
# leases with payloads through a data node (one client round trip with the payloads): off
# by default; on loopback it cost more CPU per task than it saved (the node's call to the
# master is one more request) and gained nothing beyond the spread; it pays where the
# client's round trips are long (docs/decisions/0029-lease-through-a-data-node.md)
LEASE_VIA_NODE = False


def _spec(t: NewTask, generated: set[str], fifo: Iterator[str],
          trace_ctx: tuple[str | None, str | None] = (None, None)) -> dict[str, Any]:
    """A TaskSpec dict; a task without a pid gets the next client-made FIFO pid of `fifo`
    (so a retried enqueue collapses instead of enqueueing twice)."""
    pid = t.pid
    if pid is None:
        pid = next(fifo)
        generated.add(pid)
    spec: dict[str, Any] = {"pid": pid}
    if t.not_before is not None:
        spec["not_before"] = t.not_before
    if t.delay is not None:
        spec["delay_secs"] = t.delay
    if t.idempotency_key is not None:
        spec["idempotency_key"] = t.idempotency_key
    if t.key is not None:
        spec["key"] = t.key
    if (t.unique or t.debounce or t.batch or t.traceparent or trace_ctx[0]) is not None:
        _extras(t, spec, trace_ctx)
    return spec


def _extras(t: NewTask, spec: dict[str, Any], trace_ctx: tuple[str | None, str | None]
            ) -> None:
    if t.unique is not None:
        spec["unique"] = t.unique
    if t.debounce is not None:
        spec["debounce_secs"] = t.debounce
    if t.debounce_max is not None:
        spec["debounce_max_secs"] = t.debounce_max
    if t.batch is not None:
        spec["batch"] = t.batch
    if t.traceparent is not None:
        spec["traceparent"] = t.traceparent
        if t.tracestate is not None:
            spec["tracestate"] = t.tracestate
    elif trace_ctx[0] is not None:
        spec["traceparent"] = trace_ctx[0]
        if trace_ctx[1] is not None:
            spec["tracestate"] = trace_ctx[1]


def _specs(tasks: list[NewTask], generated: set[str] | None = None
           ) -> tuple[list[dict[str, Any]], set[str]]:
    """TaskSpec dicts of `tasks` (a batch's FIFO pids made at once); the pids made are
    added to `generated`, also returned."""
    generated = set() if generated is None else generated
    fifo = iter(fifo_pids(sum(1 for t in tasks if t.pid is None)))
    ctx = _trace.current()  # once per batch: the producer's context
    return [_spec(t, generated, fifo, ctx) for t in tasks], generated


def first_failure(outcomes: list[Any]) -> list[Any]:
    """The results of a Gather, or its first failure raised."""
    for o in outcomes:
        if isinstance(o, BaseException):
            raise o
    return outcomes


def _results(items: list[dict[str, Any]], generated: set[str], group: str
             ) -> list[EnqueueResult]:
    # a client-made pid cannot collide: "collapsed" means our own earlier, retried attempt
    return [EnqueueResult(queue=f"{group}#{r['queue']}", pid=r["pid"],
                          collapsed=r["collapsed"] and r["pid"] not in generated)
            for r in items]


class Core(AdminVerbs, PayloadVerbs, FaninVerbs):
    """Configuration and shared state of one client, and its verbs as generators."""

    def __init__(self, retry: Retry | None = None, blob_timeout_s: float = 300.0,
                 worker: str | None = None, timeout_s: float = 30.0,
                 front_door: bool = True, token: str | None = None,
                 lease_via_node: bool = LEASE_VIA_NODE) -> None:
        self.retry = retry or Retry()
        self.timeout_s = timeout_s
        self.blobs = Blobs(self.retry, blob_timeout_s)
        self.front = FrontDoor(self.retry, NodeBook(), timeout_s, token) if front_door else None
        self.via_node = (NodeLease(self.retry, self.blobs.nodes, timeout_s, token)
                         if lease_via_node else None)
        self.worker = worker if worker is not None else default_worker_id()

    def _call(self, method: str, url: str, json: Any = None, *, idempotent: bool = True,
              params: dict[str, str] | None = None) -> Proto[Any]:
        return call(Call(method, url, json=json, params=params, idempotent=idempotent),
                    self.retry)

    # -- enqueue -------------------------------------------------------------------------
    def _prepare(self, tasks: list[NewTask], generated: set[str],
                 specs: list[dict[str, Any]] | None = None,
                 sources: list[bytes | Stream | None] | None = None
                 ) -> Proto[list[dict[str, Any]]]:
        """TaskSpec dicts of `tasks`, their payloads written to data nodes first."""
        specs = _specs(tasks, generated)[0] if specs is None else specs
        sources = [as_source(t.payload) for t in tasks] if sources is None else sources
        with_payload = [i for i, s in enumerate(sources) if s is not None]
        if with_payload:
            refs = yield from self.blobs.write_all([s for s in sources if s is not None])
            for i, ref in zip(with_payload, refs, strict=True):
                specs[i]["payload"] = ref
        return specs

    def put(self, queue: str, payload: Payload = None, pid: str | None = None,
            not_before: float | None = None, delay: float | None = None,
            idempotency_key: str | None = None, key: str | None = None,
            **extras: Any) -> Proto[EnqueueResult]:
        """`extras`: NewTask's unique, debounce, debounce_max, batch, traceparent,
        tracestate."""
        res = yield from self._enqueue(queue, [NewTask(payload, pid, None, not_before, delay,
                                                       idempotency_key, key, **extras)])
        return res[0]

    def _enqueue(self, queue: str, tasks: list[NewTask]) -> Proto[list[EnqueueResult]]:
        return (yield from self._send(queue, tasks, _specs(tasks)))

    def _send(self, queue: str, tasks: list[NewTask],
              made: tuple[list[dict[str, Any]], set[str]]) -> Proto[list[EnqueueResult]]:
        group, name, path = qpath(queue)
        specs, generated = made
        sources = [as_source(t.payload) for t in tasks]
        unknown: str | None = None  # a front-door attempt that may have been applied
        if (self.front is not None and self.front.eligible(sources)
                and not any("batch" in spec for spec in specs)):  # a join may be refused
            got, unknown = yield from self.front.enqueue(group, name, specs, sources)
            if got is not None:
                return _results(got, generated, group)
        try:
            specs = yield from self._prepare(tasks, generated, specs, sources)
            ans = yield from self._call("POST", path + "/tasks", {"tasks": specs})
        except SquallError as e:
            if unknown is None or may_have_applied(e):
                raise
            raise lost_answer(e, unknown) from e
        return _results(ans["enqueued"], generated, group)

    def put_many(self, queue: str, items: Iterable[Payload | NewTask], batch_size: int,
                 progress: Callable[[list[EnqueueResult]], Any] | None,
                 in_flight: int = 1) -> Proto[int]:
        """Enqueue `items` (payloads or NewTasks) batch by batch: each batch one request
        (the front door) or one allocation, one write per replica set and one enqueue.
        `in_flight` batches are sent at once (their pids are made in order first, so
        pid-less tasks keep the order of `items`); at most that many are held, and fewer
        once they hold WAVE_BYTES of payload bytes."""
        split_queue(queue)
        if not 1 <= batch_size <= MAX_BATCH:
            raise BadRequest(f"batch_size must be 1..{MAX_BATCH}")
        if not 1 <= in_flight <= MAX_IN_FLIGHT:
            raise BadRequest(f"in_flight must be 1..{MAX_IN_FLIGHT}")
        it: Iterator[Payload | NewTask] = iter(items)
        added = 0
        while True:
            wave: list[list[NewTask]] = []
            held = 0
            while len(wave) < in_flight and held < WAVE_BYTES \
                    and (batch := list(islice(it, batch_size))):
                wave.append([x if isinstance(x, NewTask) else NewTask(x) for x in batch])
                held += sum(held_bytes(t.payload) for t in wave[-1])
            if not wave:
                return added
            made = [_specs(tasks) for tasks in wave]  # pids in the order of `items`
            if len(wave) == 1:
                results = [(yield from self._send(queue, wave[0], made[0]))]
            else:
                results = yield Gather([self._send(queue, tasks, m)
                                        for tasks, m in zip(wave, made, strict=True)])
            for res in results:
                added += sum(1 for r in res if not r.collapsed)
                if progress is not None:
                    progress(res)

    # -- lease and the task verbs --------------------------------------------------------
    def lease(self, queue: str, max_tasks: int, lease_secs: float | None, max_pid: str | None,
              make: Callable[[WireTask, str], T], payloads: bool = False,
              wait_secs: float | None = None, done: list[TaskBase] | None = None,
              tx: TxBuilder | None = None) -> Proto[list[T]]:
        """Lease up to `max_tasks`; with `payloads`, the small payloads (≤ BATCH_BLOB_BYTES)
        are read at once with one batch read per data node (a payload that cannot be read
        now stays unloaded: ``payload()`` tries again and raises); large ones stay lazy.
        `wait_secs`: the master holds the request until a task is available (long poll).
        `done`: dequeue these tasks in the same atomic update (one round trip; all or
        nothing: if one of them cannot be dequeued, nothing is leased either); with
        `wait_secs` too, the dequeues are durable before the lease waits. `tx`: more of
        the same update (a transaction of this queue's group), e.g. follow-up enqueues."""
        group, _, path = qpath(queue)
        body: dict[str, Any] = {"max_tasks": max_tasks, "worker": self.worker}
        if lease_secs is not None:
            body["lease_secs"] = lease_secs
        if max_pid is not None:
            body["max_pid"] = max_pid
        if wait_secs:
            body["wait_secs"] = wait_secs
        if payloads and self.via_node is not None and (tx is None or tx.acks_only):
            got = yield from self._lease_via_node(group, split_queue(queue)[1], body, make,
                                                  done or [], tx)
            if got is not None:
                return got
        if done or tx is not None:
            tx = tx if tx is not None else TxBuilder(group)
            for t in done or ():
                tx.dequeue(t)
            tx.lease_next(split_queue(queue)[1], body)
            res = yield from self.commit(tx)
            wires, read_token = res.leased, res.read_token
        else:
            timeout = self.timeout_s + wait_secs if wait_secs else None
            ans = yield from call(Call("POST", path + "/lease", json=body, idempotent=False,
                                       timeout=timeout), self.retry)
            wires = [WireTask.model_validate(t) for t in ans["tasks"]]
            read_token = ans.get("read_token")
        for w in wires:  # the answer's one read token covers every payload of it
            if w.payload is not None and w.payload.token is None:
                w.payload.token = read_token
        tasks = [make(w, group) for w in wires]
        if payloads:
            yield from self._load([t for t in tasks if t.size <= BATCH_BLOB_BYTES], False)
        return tasks

    def _lease_via_node(self, group: str, name: str, body: dict[str, Any],
                        make: Callable[[WireTask, str], T], done: list[TaskBase],
                        tx: TxBuilder | None) -> Proto[list[T] | None]:
        """A lease answered with its payloads by a data node (``_nodelease.py``), or None
        when no node took it (lease on the master)."""
        acks = TxBuilder(group)  # the acks: the transaction's, then `done`'s
        if tx is not None:
            if tx.group not in (None, group):
                raise BadRequest(f"the transaction is on group {tx.group!r}, the lease on "
                                 f"{group!r}: one update touches one group only")
            acks.dequeues += tx.dequeues
        for t in done:
            acks.dequeue(t)
        assert self.via_node is not None
        got = yield from self.via_node.lease(group, name, body, acks.dequeues)
        if got is None:
            return None
        if tx is not None:
            tx.committed()
        acks.committed()
        doc, payloads = got
        read_token = doc.get("read_token")
        tasks = []
        for d in doc["leased"] if acks.dequeues else doc["tasks"]:
            w = WireTask.model_validate(d)
            t = make(w, group)
            p = w.payload
            if p is not None:
                if p.token is None:  # the answer's one read token covers every payload
                    p.token = read_token
                if checked(payloads.get(p.blob_id), p.size, p.crc32c):
                    t._data = payloads[p.blob_id]
            tasks.append(t)
        yield from self._load([t for t in tasks if t.size <= BATCH_BLOB_BYTES], False)
        return tasks

    def commit(self, tx: TxBuilder) -> Proto[UpdateResponse]:
        """Apply a transaction as one atomic update (payloads written first)."""
        if tx.empty and tx.lease is None:
            return UpdateResponse(ticket=0, enqueued=[], dequeued=0, renewed=[], released=0)
        if tx.group is None:  # pragma: no cover - every op sets the group
            raise BadRequest("a transaction needs a group")
        generated: set[str] = set()
        specs = yield from self._prepare(tx.puts, generated)
        for spec, t in zip(specs, tx.puts, strict=True):
            spec["queue"] = t.queue
        body: dict[str, Any] = {"enqueue": specs, "dequeue": tx.dequeues, "renew": tx.renews,
                "release": tx.releases}
        if tx.lease is not None:
            body["lease"] = tx.lease
        # resending a dequeue or a release that was applied fails (the token is spent)
        idem = not (tx.dequeues or tx.releases or tx.lease)
        wait = (tx.lease or {}).get("wait_secs")  # a long poll: the answer may take that long
        ans = yield from call(Call("POST", f"/v1/groups/{tx.group}/update", json=body,
                                   idempotent=idem,
                                   timeout=self.timeout_s + wait if wait else None), self.retry)
        tx.committed()
        ans["enqueued"] = _results(ans["enqueued"], generated, tx.group)
        return UpdateResponse.model_validate(ans)

    def renew(self, tasks: list[TaskBase], lease_secs: float) -> Proto[UpdateResponse]:
        res = yield from self._per_group(tasks, lambda tx, t: tx.renew(t, lease_secs))
        by_key = {(r.queue, r.pid): r.expires_at for r in res.renewed}
        for t in tasks:
            t.expires_at = by_key.get((t.queue, t.pid), t.expires_at)
        return res

    def _per_group(self, tasks: list[TaskBase], add: Callable[[TxBuilder, TaskBase], Any]
                   ) -> Proto[UpdateResponse]:
        """One update per group of `tasks` (usually exactly one); their answers merged."""
        groups: dict[str, TxBuilder] = {}
        for t in tasks:
            add(groups.setdefault(t.group, TxBuilder(t.group)), t)
        out = UpdateResponse(ticket=0, enqueued=[], dequeued=0, renewed=[], released=0)
        for tx in groups.values():
            r = yield from self.commit(tx)
            out.ticket = max(out.ticket, r.ticket)
            out.dequeued += r.dequeued
            out.released += r.released
            out.renewed += [x.model_copy(update={"queue": f"{tx.group}#{x.queue}"})
                            for x in r.renewed]
        return out

    def done(self, tasks: list[TaskBase]) -> Proto[UpdateResponse]:
        return self._per_group(tasks, lambda tx, t: tx.dequeue(t))

    def release(self, tasks: list[TaskBase], delay: float | None, error: str | None,
                unseen: bool = False) -> Proto[UpdateResponse]:
        return self._per_group(tasks, lambda tx, t: tx.release(t, delay, error, unseen))
