"""The master service: recovery, the commit path, the verbs and reads.

Commit path of every mutating request (see :mod:`squall.master.storage.commit`)::

    child txn of the open batch txn: plan (read + validate) -> apply ops, applied = ticket
    the batch closes: its WAL records are written as one group and fdatasynced
    the batch txn commits (one index fdatasync per group: power-loss safe)
    answer

A request refused at any step changed nothing: its child txn (or, when the WAL fails, the
whole batch) is aborted and the in-memory state reloaded. A request that changed nothing
(all pids collapsed, an empty lease) still waits for its batch, so it never reports state
that could vanish in a crash.

Recovery: open LMDB (its ``applied`` ticket says how far it got), replay WAL records after
it in large transactions, and resume appending after the larger of the two tickets.

Background work and checkpoints: :mod:`squall.master.housekeeping`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import lmdb
import msgpack

from squall.common.clock import Clock, SystemClock
from squall.common.errors import StatusError
from squall.common.security.auth import new_key, write_secret
from squall.common.security.files import private_dir
from squall.common.security.tokens import load_cluster_key
from squall.common.server.tracing import Spans
from squall.common.wire.cluster import NodeSettle
from squall.common.wire.models import (
    BatchRequest,
    EnqueueItem,
    LeaseRequest,
    PayloadRef,
    Policy,
    Schedule,
    TaskSpec,
    UpdateLease,
    UpdateRequest,
)
from squall.common.wire.names import check_name, check_pid
from squall.master.cluster import blobgc, drain
from squall.master.cluster.blobscan import blob_ids_after
from squall.master.cluster.placement import Placement
from squall.master.cluster.state import Cluster, ClusterSettings
from squall.master.housekeeping import Housekeeping
from squall.master.storage.commit import GroupCommit
from squall.master.storage.index import Index
from squall.master.storage.ops import apply, replay
from squall.master.storage.records import LEASED, QueueRec
from squall.master.storage.wal import WAL
from squall.master.storage.walfile import Tail, read_records
from squall.master.tasks import admin, batches, pending
from squall.master.tasks.dedup import Dedup
from squall.master.tasks.engine import Engine
from squall.master.tasks.leasetokens import LeaseTokens, load_or_make_key
from squall.master.tasks.stats import Meters
from squall.master.tasks.view import Plan, View
from squall.master.tasks.waiters import Waiters

log = logging.getLogger("squall.master")
REPLAY_TXN_RECORDS = 5000


@dataclass
class MasterSettings:
    data_dir: str
    fsync: bool = True
    segment_bytes: int = 64 << 20
    checkpoint_interval_s: float = 30.0
    checkpoint_wal_bytes: int = 256 << 20
    sweep_interval_s: float = 0.1
    sweep_batch: int = 2000
    reap_batch: int = 500  # bench/admin_bench: ~250-400k tasks/s with paced ticks
    map_size: int = 1 << 38
    max_body_bytes: int = 16 << 20
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    cluster_key: bytes | None = None  # else --cluster-key-file / SQUALL_CLUSTER_KEY / made
    cluster_key_file: str | None = None
    require_receipts: bool = True  # payload refs need a write quorum of data-node receipts
    # fdatasync each index commit (one per WAL group): a power loss cannot corrupt the
    # index. False trades that for speed: the index is synced at checkpoints only.
    index_sync: bool = True
    lease_wait_max_s: float = 20.0  # cap of a lease's wait_secs (see waiters.py)
    lease_waiters_per_queue: int = 100  # parked leases per queue (429 beyond)
    lease_waiters_max: int = 1000  # parked leases in all (503 beyond)
    dedup_retention_s: float = 300.0  # window of enqueue idempotency keys (see dedup.py)
    lease_key: bytes | None = None  # seals lease tokens; None: <data_dir>/lease.key
    # a task enqueued pending (the parallel put, master/tasks/pending.py) is settled by
    # housekeeping if its node has not confirmed it this long after it was logged
    pending_deadline_s: float = 10.0
    # a lease that does not wait, on a queue with pending tasks and fewer available than it
    # asks for, waits this long at most for them to be confirmed (a put's answer comes
    # before its confirmation: a put-then-lease still finds its task)
    pending_lease_wait_s: float = 1.0
    # a member of a master set (master/ha/role.py SetSettings); None: a single master
    master_set: Any = None


CLUSTER_KEY_FILE = "cluster.key"


def cluster_key(settings: MasterSettings) -> bytes:
    """The configured cluster key, else the one kept in the data folder (``cluster.key``,
    mode 0600, made on first start): there is no built-in key. Data nodes need a copy."""
    key = load_cluster_key(settings.cluster_key_file)
    if key is not None:
        return key
    path = os.path.join(settings.data_dir, CLUSTER_KEY_FILE)
    if not os.path.exists(path):
        write_secret(path, new_key() + b"\n")
        log.warning("no cluster key configured: made one in %s; give the data nodes a copy "
                    "(squall datanode --cluster-key-file)", path)
    found = load_cluster_key(path)
    assert found is not None
    return found


class Master(Housekeeping):
    def __init__(self, settings: MasterSettings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        private_dir(settings.data_dir)
        self.wal_dir = private_dir(os.path.join(settings.data_dir, "wal"))
        t0 = time.monotonic()
        self.index = Index(os.path.join(settings.data_dir, "index"), settings.map_size,
                           sync=settings.index_sync)
        self.key = settings.cluster_key or cluster_key(settings)
        self.cluster = Cluster(self.clock, settings.cluster, self.key, self.referenced,
                               lambda after, n: blob_ids_after(self.index.env,
                                                               self.index.blobs, after, n))
        self.placement = Placement(self.cluster, self.key, settings.require_receipts)
        # a master set's members share the lease key (a lease survives a failover): it is
        # derived from the cluster key they share
        lease_key = settings.lease_key or (
            hashlib.blake2b(self.key, person=b"squall-leasekey").digest()
            if settings.master_set is not None else load_or_make_key(settings.data_dir))
        self.ha: Any = None  # the MasterSet when a member of one (master/http/app.py)
        self.engine = Engine(self.index, self.clock, LeaseTokens(lease_key),
                             self.placement.verify)
        self.dedup = self.engine.dedup = Dedup(self.index.dedup, settings.dedup_retention_s)
        self.meters = Meters()
        self.spans = Spans("master")  # enqueue/lease/ack spans, if OTEL_TRACES_EXPORTER says
        self.waiters = Waiters(settings.lease_wait_max_s, settings.lease_waiters_per_queue,
                               settings.lease_waiters_max, self._available)
        records, tail = read_records(self.wal_dir, after=self.index.applied)
        if settings.master_set is not None:
            # a set member's log may end in groups no majority acknowledged (a new leader
            # may cut them): replay only what its journal knows is committed; the rest is
            # applied once a leader says it is (master/ha/role.py)
            from squall.master.ha.journal import FileMeta

            meta = FileMeta(os.path.join(settings.data_dir, "journal.json")).load() or {}
            records = [r for r in records if r[0] <= int(meta.get("committed", 0))]
        self.replayed = self._replay(records)
        for (_, node_id), mark in self.index.node_marks.items():  # decommissions resume
            drain.start(self.cluster, node_id, float(mark.get("since", 0.0)))
        if self.index.applied > tail.last_ticket:
            # LMDB holds commits whose WAL frames were lost (kill -9 before the write).
            # New records will build on them: make them durable first, or a power loss
            # would leave a log that no longer replays onto the synced index.
            self.index.sync()
        self.wal = WAL(self.wal_dir, Tail(max(tail.last_ticket, self.index.applied),
                                          tail.path, tail.offset),
                       segment_bytes=settings.segment_bytes, fsync=settings.fsync)
        self.commit = GroupCommit(self.index, self.wal, self._reapply)
        self.recovery_secs = time.monotonic() - t0
        self.last_checkpoint = time.monotonic()
        self.wal_bytes_since_checkpoint = 0
        self.checkpoints = 0
        self.reaped = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._settled = asyncio.Event()  # set (and replaced) whenever pending tasks settle
        self._settled_n: dict[tuple[str, str], int] = {}  # pending tasks settled, per queue
        log.info("recovered: %d WAL records replayed in %.2fs, at ticket %d",
                 self.replayed, self.recovery_secs, self.wal.last_ticket)

    def _replay(self, records: list[tuple[int, bytes]]) -> int:
        for i in range(0, len(records), REPLAY_TXN_RECORDS):
            with self.index.begin_write() as txn:
                replay(self.index, txn, [(t, msgpack.unpackb(body))
                                         for t, body in records[i : i + REPLAY_TXN_RECORDS]])
            self.index.freed.extend(self.index.freed_pending)
            self.index.freed_pending.clear()
        return len(records)

    def _reapply(self, records: list[tuple[int, bytes]]) -> None:
        """Apply durable records again after their batch's index commit failed (runs on
        the commit thread; replay is idempotent)."""
        with self.index.begin_write() as txn:
            replay(self.index, txn, [(t, msgpack.unpackb(body)) for t, body in records])
        self.index.freed.extend(self.index.freed_pending)
        self.index.freed_pending.clear()

    # -- commit path ---------------------------------------------------------------------
    async def _execute(self, build: Callable[[lmdb.Transaction], Plan],
                       sweep_first: bool = False, early: bool = False) -> dict[str, Any]:
        """Plan and apply in the open batch; `early`: answer once durable in the WAL
        (``GroupCommit.run``'s `answer_when_durable`)."""
        def work(txn: lmdb.Transaction, ticket: int) -> tuple[bytes | None, Plan]:
            plan = build(txn)
            if not plan.ops:
                return None, plan
            return apply(self.index, txn, plan.ops, ticket), plan

        # plans only read; apply() writes, and logs what it writes
        if not sweep_first:
            ticket, plan = await self.commit.run(work, logged_only=True,
                                                 answer_when_durable=early)
        else:
            swept: list[tuple[str, str]] = []
            try:
                ticket, plan = await self.commit.run(work, pre=self._sweeper(swept),
                                                     logged_only=True,
                                                     answer_when_durable=early)
            finally:
                # a refused `work` does not take its sweep back: whoever is woken leases in
                # this batch or a later one, so it still answers only once they are durable
                if swept:
                    self.waiters.notify(swept)
        self._record(plan)
        plan.result["ticket"] = ticket
        return plan.result

    def _record(self, plan: Plan) -> None:
        now = self.clock.now()
        for (group, queue, kind), n in plan.events.items():
            self.meters.record((group, queue), kind, n, now)
        for key, (secs, n) in plan.lease_secs.items():
            self.meters.lease_done(key, secs, n)

    async def _execute_proven(self, refs: list[PayloadRef],
                              build: Callable[[lmdb.Transaction], Plan],
                              sweep_first: bool = False, early: bool = False
                              ) -> dict[str, Any]:
        """:meth:`_execute` for a plan that may enqueue payloads `refs`: their batch
        receipts are checked right before the plan uses them, and once the enqueue is
        durable its blobs, now referenced, are examined at once (``blobgc.enqueued``)."""
        recorded: list[str] = []

        def work(txn: lmdb.Transaction) -> Plan:
            self.placement.prove(refs)  # batch receipts, once per batch, right before use
            try:
                plan = build(txn)
            finally:
                self.placement.flush()  # the holders it proved, once per set of nodes
            recorded[:] = self.placement.recorded
            return plan

        res = await self._execute(work, sweep_first=sweep_first, early=early)
        blobgc.enqueued(self.cluster, recorded)  # durable: these blobs are referenced
        return res

    def _available(self, key: tuple[str, str]) -> int:
        """Tasks of a queue a lease could take now (paused and limited ones left out)."""
        q = self.index.queues.get(key)
        if q is None:
            return 0
        return self.engine.flow.leasable(q) if self.engine.flow.queues else q.available

    def _woke(self, group: str, queues: Iterable[str]) -> None:
        """After a commit: tasks of these queues may be available (parked leases look)."""
        self.waiters.notify((group, q) for q in queues)

    async def update(self, group: str, req: UpdateRequest, addr: str = "", *,
                     answer_when_durable: bool = False) -> dict[str, Any]:
        """The atomic update. `answer_when_durable` (as for every method that writes):
        answer once the WAL group is durable, while the index commit runs (the HTTP
        routes); else once the index is committed too (``GroupCommit.run``)."""
        if req.lease is not None:
            check_name("group", group)
        refs = [e.payload for e in req.enqueue if e.payload is not None]
        res = await self._execute_proven(
            refs, lambda txn: self.engine.plan_update(txn, group, req, addr),
            sweep_first=req.lease is not None, early=answer_when_durable)
        self._woke(group, {*(e.queue for e in req.enqueue), *(r.queue for r in req.release),
                           *self._freed(group, req)})
        if req.lease is not None:
            self._leased(group, req.lease.queue, res, "leased")
            if req.lease.wait_secs and not res["leased"] and not self.waiters.closed:
                await self._wait_after_update(group, req.lease, addr, res,
                                              answer_when_durable)
        return res

    def _freed(self, group: str, req: UpdateRequest) -> set[str]:
        """Queues whose dequeued tasks may have freed a concurrency limit's slot."""
        if not req.dequeue or not self.engine.flow.queues:
            return set()
        out = set()
        for d in req.dequeue:
            q = self.index.queues.get((group, d.queue))
            if q is not None and q.qid in self.engine.flow.queues:
                out.add(d.queue)
        return out

    async def _wait_after_update(self, group: str, ul: UpdateLease, addr: str,
                                 res: dict[str, Any], early: bool) -> None:
        """The update is durable and leased nothing: wait for tasks as a lease would. The
        update stays acknowledged whatever happens now: a refused wait (too many parked,
        a write refused) answers it with nothing leased."""
        lr = LeaseRequest(max_tasks=ul.max_tasks, lease_secs=ul.lease_secs,
                          max_pid=ul.max_pid, worker=ul.worker, wait_secs=ul.wait_secs)
        try:
            more = await self.lease(group, ul.queue, lr, addr, answer_when_durable=early)
        except StatusError as e:
            log.info("an update's lease could not wait (%s); answered with nothing leased", e)
            return
        res["leased"], res["read_token"] = more["tasks"], more["read_token"]
        res["ticket"] = max(res["ticket"], more["ticket"])

    async def enqueue(self, group: str, queue: str, tasks: list[TaskSpec], *,
                      answer_when_durable: bool = False) -> dict[str, Any]:
        refs = [t.payload for t in tasks if t.payload is not None]
        res = await self._execute_proven(
            refs, lambda txn: self.engine.plan_enqueue(txn, group, queue, tasks),
            early=answer_when_durable)
        self._woke(group, (queue,))
        return res

    # -- the parallel put (master/tasks/pending.py) -------------------------------------
    async def enqueue_pending(self, group: str, items: list[EnqueueItem], node_id: str,
                              replicas: list[str], *, answer_when_durable: bool = False
                              ) -> dict[str, Any]:
        """A front door's enqueues, logged while their payloads are being stored: tasks
        with a payload are pending until :meth:`settle` confirms them."""
        extra = {"replicas": list(replicas), "node": node_id}
        deadline_ms = int(self.settings.pending_deadline_s * 1000)
        res = await self._execute(
            lambda txn: self.engine.plan_pending(txn, group, items, extra, deadline_ms),
            early=answer_when_durable)
        self._woke(group, {e.queue for e in items if e.payload is None})
        return res

    async def settle(self, group: str, s: NodeSettle, *, answer_when_durable: bool = False
                     ) -> dict[str, Any]:
        """A node confirms (its write quorum's receipts) or abandons pending tasks."""
        refs: list[PayloadRef] = []
        items: list[pending.Settle] = []
        for it in s.items:
            p = it.payload
            if not s.durable:
                items.append(pending.Settle(it.queue, it.pid, p.blob_id, None))
                continue
            if not p.receipts and not p.replicas:
                p.receipts, p.replicas = s.receipts, s.replicas
            refs.append(p)
            items.append(pending.Settle(it.queue, it.pid, p.blob_id,
                                        functools.partial(self.placement.verify, p)))
        res = await self._execute_proven(
            refs, lambda txn: pending.plan_settle(self.engine, txn, group, items),
            early=answer_when_durable)
        self._after_settle(group, res.pop("queues"))
        return res

    def _after_settle(self, group: str, queues: dict[str, int]) -> None:
        if not queues:
            return
        self._woke(group, queues)
        for q, n in queues.items():
            self._settled_n[(group, q)] = self._settled_n.get((group, q), 0) + n
        ev, self._settled = self._settled, asyncio.Event()
        ev.set()

    def _plan_settle(self, group: str, items: list[pending.Settle], txn: lmdb.Transaction
                     ) -> Plan:
        return pending.plan_settle(self.engine, txn, group, items)

    async def _pending_first(self, group: str, queue: str, want: int) -> None:
        """Before a lease that does not wait: while the queue has fewer tasks available
        than `want` and the tasks pending when the lease arrived are not all settled, wait
        for them (at most ``pending_lease_wait_s``): a put answered before its
        confirmation is still found by the lease that follows it."""
        key = (group, queue)
        q = self.index.queues.get(key)
        if q is None or not q.pending or q.available >= want:
            return
        until = time.monotonic() + self.settings.pending_lease_wait_s
        goal = self._settled_n.get(key, 0) + q.pending
        while (q.pending and q.available < want and self._settled_n.get(key, 0) < goal
               and not self.waiters.closed):
            left = until - time.monotonic()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._settled.wait(), left)

    async def lease(self, group: str, queue: str, req: LeaseRequest, addr: str, *,
                    answer_when_durable: bool = False) -> dict[str, Any]:
        """Lease now; with ``wait_secs``, wait for tasks (see waiters.py)."""
        early = answer_when_durable
        if not req.wait_secs or self.waiters.closed:
            await self._pending_first(group, queue, req.max_tasks)
            return await self._lease_now(group, queue, req, addr, early)
        return await self.waiters.wait((check_name("group", group), check_name("queue", queue)),
                                       req.wait_secs,
                                       lambda: self._lease_now(group, queue, req, addr, early))

    async def _lease_now(self, group: str, queue: str, req: LeaseRequest, addr: str,
                         early: bool = False) -> dict[str, Any]:
        # a bad request changes nothing, not even the sweep; expired leases are swept in
        # their own child txn, so a plan that then fails cannot abort it
        check_name("group", group)
        check_name("queue", queue)
        if req.max_pid is not None:
            check_pid(req.max_pid)
        res = await self._execute(
            lambda txn: self.engine.plan_lease(txn, group, queue, req, addr), sweep_first=True,
            early=early)
        self._leased(group, queue, res, "tasks")
        return res

    def _leased(self, group: str, queue: str, res: dict[str, Any], key: str) -> None:
        """Leased tasks (``res[key]``) as answered: payloads with live replicas, and one
        read token for all of them in ``res["read_token"]``."""
        tasks = res[key]
        if tasks:
            self.meters.get((group, queue)).recent_leases.extend(t["pid"] for t in tasks)
        res["read_token"] = self.placement.for_lease(tasks)

    async def delete_queue(self, group: str, queue: str) -> dict[str, Any]:
        res = await self._execute(lambda txn: admin.plan_delete(self.engine, group, queue))
        self.meters.forget((group, queue))
        return res

    async def reset_leases(self, group: str, queue: str) -> dict[str, Any]:
        res = await self._execute(lambda txn: admin.plan_reset(self.engine, group, queue))
        self._woke(group, (queue,))
        return res

    async def cancel(self, group: str, queue: str, pid: str) -> dict[str, Any]:
        return await self._execute(
            lambda txn: admin.plan_cancel(self.engine, txn, group, queue, pid))

    async def retry(self, group: str, queue: str, pid: str) -> dict[str, Any]:
        res = await self._execute(
            lambda txn: admin.plan_retry(self.engine, txn, group, queue, pid))
        self._woke(group, (str(res["queue"]).rpartition("#")[2],))
        return res

    async def redrive(self, group: str, queue: str, max_tasks: int) -> dict[str, Any]:
        res = await self._execute(
            lambda txn: admin.plan_redrive(self.engine, txn, group, queue, max_tasks))
        self._woke(group, (str(res.get("source", "")).rpartition("#")[2] or queue,))
        return res

    async def set_policy(self, group: str, queue: str, p: Policy | None) -> dict[str, Any]:
        return await self._execute(lambda txn: admin.plan_policy(self.engine, group, queue, p))

    async def pause(self, group: str, queue: str, key: str | None = None,
                    paused: bool = True) -> dict[str, Any]:
        """Pause (or resume, `paused` False) a queue, or one key in it: leases skip it,
        enqueues go on. Logged, so it survives restarts."""
        res = await self._execute(
            lambda txn: admin.plan_pause(self.engine, group, queue, key, paused))
        if not paused:
            self._woke(group, (queue,))
        return res

    def pause_state(self, group: str, queue: str) -> dict[str, Any]:
        return admin.describe_pause(self.index.pauses.get(
            (check_name("group", group), check_name("queue", queue))))

    async def set_schedule(self, group: str, name: str, s: Schedule | None) -> dict[str, Any]:
        try:
            return await self._execute(
                lambda txn: admin.plan_schedule(self.engine, group, name, s))
        finally:
            self.placement.flush()  # the holders its payload's receipts proved

    async def log_config(self, kind: str, changes: dict[str, dict[str, Any] | None]) -> None:
        """Log config records of `kind` (name -> value, None: forget it), so every member
        of a master set has them: SQS access keys ("A", master/sqskeys.py) and credential
        revocations ("V", master/security.py)."""
        await self._execute(lambda txn: Plan([("C", kind, "", name, rec)
                                              for name, rec in changes.items()]))

    # -- data nodes: decommission (master/cluster/drain.py) ------------------------------------
    async def _mark_node(self, node_id: str, mark: dict[str, Any] | None) -> None:
        await self._execute(lambda txn: Plan([("C", "N", "", node_id, mark)]))

    async def decommission(self, node_id: str) -> dict[str, Any]:
        """Mark a data node draining (idempotent); its blobs move to other nodes."""
        drain.check_known(self.cluster, node_id)
        if node_id not in self.cluster.draining:
            drain.check_room(self.cluster, node_id)
            since = self.clock.now()
            await self._mark_node(node_id, {"mark": drain.DRAINING, "since": since})
            drain.start(self.cluster, node_id, since)
        return drain.describe(self.cluster, node_id)

    async def recommission(self, node_id: str) -> dict[str, Any]:
        """Cancel a decommission (idempotent): the node takes new blobs again."""
        drain.check_known(self.cluster, node_id)
        if node_id in self.cluster.draining:
            await self._mark_node(node_id, None)
            drain.cancel(self.cluster, node_id)
        return drain.describe(self.cluster, node_id)

    async def forget_node(self, node_id: str) -> dict[str, Any]:
        """Remove a dead or decommissioned node from the table (409 otherwise)."""
        drain.check_forget(self.cluster, node_id)
        if node_id in self.cluster.draining:
            await self._mark_node(node_id, None)
        drain.forget(self.cluster, node_id)
        return {"forgotten": node_id}

    # -- reads ---------------------------------------------------------------------------
    # -- batches (master/tasks/batches.py) ------------------------------------------------
    async def create_batch(self, group: str, req: BatchRequest, *,
                           answer_when_durable: bool = False) -> dict[str, Any]:
        items = [*req.tasks, req.callback, *([req.error_callback] if req.error_callback else [])]
        refs = [t.payload for t in items if t.payload is not None]
        res = await self._execute_proven(
            refs, lambda txn: batches.plan_create(View(self.engine, txn, group), req),
            early=answer_when_durable)
        self._woke(group, {t.queue for t in req.tasks})
        return res

    async def delete_batch(self, group: str, bid: str) -> dict[str, Any]:
        return await self._execute(
            lambda txn: batches.plan_delete(View(self.engine, txn, group), bid))

    def batch_info(self, group: str, bid: str) -> dict[str, Any]:
        return batches.read_info(self.index, group, bid)

    def list_batches(self, group: str, after: str | None, limit: int) -> dict[str, Any]:
        return batches.list_batches(self.index, group, after, limit)

    def batch_results(self, group: str, bid: str, after: str | None, limit: int
                      ) -> dict[str, Any]:
        return batches.read_results(self.index, group, bid, after, limit)

    def task_info(self, group: str, queue: str, pid: str) -> dict[str, Any]:
        with self.index.env.begin() as txn:
            t = self.engine.task_info(txn, group, queue, pid)
        t["payload"] = self.placement.for_reader(t["payload"], self.clock.now())
        return t

    def list_tasks(self, group: str, queue: str, after: str | None, limit: int
                   ) -> dict[str, Any]:
        with self.index.env.begin() as txn:
            res = admin.list_tasks(self.engine, txn, group, queue, after, limit)
        now = self.clock.now()
        for t in res["tasks"]:
            t["payload"] = self.placement.for_reader(t["payload"], now)
        return res

    def referenced(self, blob_ids: list[str]) -> list[bool]:
        with self.index.env.begin() as txn:
            return [self.index.blob_referenced(txn, b) for b in blob_ids]

    def queue(self, group: str, queue: str) -> QueueRec | None:
        return self.index.queues.get((check_name("group", group), check_name("queue", queue)))

    def queue_details(self, q: QueueRec) -> dict[str, Any]:
        """Soft-state statistics of a queue: rates, mean lease time, ages, leased sample."""
        now = self.clock.now()
        m = self.meters.get((q.group, q.name))
        sample: list[dict[str, Any]] = []
        seen: set[str] = set()
        with self.index.env.begin() as txn:
            oldest = self.index.oldest_available_ms(txn, q)
            for pid in reversed(m.recent_leases):
                if pid in seen or len(sample) >= 10:
                    continue
                seen.add(pid)
                t = self.index.get_task(txn, q, pid.encode())
                if t is not None and t.state == LEASED and t.expiry_ms > now * 1000:
                    sample.append({"pid": t.pid, "worker": t.worker,
                                   "worker_addr": t.worker_addr,
                                   "lease_age_secs": round(now - t.leased_ms / 1000, 3),
                                   "expires_at": t.expiry_ms / 1000})
        self.index.hints.clear()
        return {"rates": m.snapshot(now), "mean_lease_secs": m.mean_lease_secs,
                "oldest_available_age_secs":
                    round(max(0.0, now - oldest / 1000), 3) if oldest is not None else None,
                "leased_sample": sample}

    def flow_details(self, q: QueueRec) -> dict[str, Any]:
        """A queue's flow-control state: tasks held by a pause or by a limit, pauses, keys."""
        flow = self.engine.flow
        paused, blocked = flow.held_back(q)
        qf = flow.queues.get(q.qid)
        pause = self.pause_state(q.group, q.name)
        return {"paused": paused, "blocked": blocked, "queue_paused": pause["paused"],
                "paused_keys": pause["paused_keys"],
                "keys": len(qf.keys) if qf is not None and qf.gen == q.gen else 0}

    def flow_totals(self) -> tuple[int, int]:
        """(paused, blocked) over every queue with flow state (O(their keys))."""
        paused = blocked = 0
        for qid in list(self.engine.flow.queues):
            q = self.index.by_qid.get(qid)
            if q is not None and q.available:
                p, b = self.engine.flow.held_back(q)
                paused, blocked = paused + p, blocked + b
        for g, n in self.index.pauses:  # paused queues without keys
            q = self.index.queues.get((g, n))
            if q is not None and q.qid not in self.engine.flow.queues:
                paused += self.engine.flow.held_back(q)[0]
        return paused, blocked

    def close(self) -> None:
        self.commit.close()  # after any flush still on its thread, which needs the WAL
        with contextlib.suppress(Exception):  # a failed WAL has nothing more to flush
            self.wal.flush()
        self.wal.close()
        self.index.sync()
        self.index.close()
        self.spans.close()
