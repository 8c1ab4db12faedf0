"""Structured Streaming over a queue: ``spark.readStream.format("squall")`` leases tasks
micro-batch by micro-batch and dequeues them only when the micro-batch commits;
``writeStream.format("squall")`` enqueues rows keyed by pid.

**Offsets are leases.** ``latestOffset(start)`` (on the driver) first *settles* ``start``
(see below), then leases up to ``max_tasks_per_batch`` tasks of the queue for
``lease_secs`` and returns them as the micro-batch's end offset:
``{"batch": n, "tasks": [[pid, lease token], ...]}``. Spark writes that offset to the
checkpoint *before* the micro-batch runs. The executors look the tasks up by pid (the same
columns as ``spark.read``) and, with ``with_payload=true``, read their payloads from the data
nodes (no lease is needed to read). While a micro-batch is under way its leases are renewed
every ``lease_secs / 3`` by a thread of the reader.

**Settling = dequeueing a micro-batch's tasks with their tokens**, once the sink has
committed it. Spark calls ``commit(end)`` for a micro-batch only when it constructs the
*next* one (after writing the next offset), so with no new data the last micro-batch's
tasks would stay leased (renewed) for ever. But Spark calls ``latestOffset(start)`` only
with ``start`` = the end offset of a micro-batch already in the commit log (a micro-batch
logged in the offset log but not committed is re-run *without* asking for a new offset), so
``latestOffset`` settles ``start`` itself, on every trigger, before it leases anything new;
``commit`` settles again (a no-op by then). Settling twice is harmless: a task already
dequeued is skipped.

**Restart.** A query killed mid-batch restarts from its checkpoint: Spark re-runs the last
logged micro-batch with the same offset, i.e. the same tasks and tokens, before it asks for
a new offset. The dead query's tokens still renew and dequeue those tasks even after their
leases expired, because nobody leased them since: this query leases only after it settled
every logged micro-batch. Leases taken for an offset that never reached the checkpoint
simply expire and the tasks come back in a later micro-batch. So every task leaves the
source exactly once, after a micro-batch holding it committed, and reaches the sink at
least once; a **pid-keyed sink** (squall's own, where an enqueue of a queued pid collapses)
makes it exactly once end to end, as long as the replayed outputs are still queued there.
Assumption: this query is the only consumer of the source queue (another consumer could
lease a task whose lease expired while the query was down: its token would then be stale
and the task would reach the sink twice, once from each).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from squall.client import Client, LeasedTask, NotFound, SquallError, StatusError
from squall.client.spark._conn import Conn
from squall.client.spark._fetch import fetch_many
from squall.client.spark._read import listed_task, task_row
from squall.common.wire.models import MAX_BATCH
from squall.common.wire.models import LeasedTask as WireTask
from squall.common.wire.names import split_queue

log = logging.getLogger("squall.spark")
LEASE_SECS = 60.0
TASKS_PER_BATCH = 1000
TASKS_PER_PARTITION = 250
READ_THREADS = 4

Held = list[list[Any]]  # [[pid, token], ...]: JSON-friendly, as offsets must be


@dataclass(frozen=True)
class StreamOptions:
    master: str | None
    queue: str
    with_payload: bool = False
    lease_secs: float = LEASE_SECS
    max_tasks_per_batch: int = TASKS_PER_BATCH
    tasks_per_partition: int = TASKS_PER_PARTITION
    read_threads: int = READ_THREADS
    conn: Conn = field(default_factory=Conn)  # credential, TLS material (``_conn.py``)

    def __post_init__(self) -> None:
        split_queue(self.queue)
        if not 1 <= self.max_tasks_per_batch <= MAX_BATCH:
            raise ValueError(f"max_tasks_per_batch must be 1..{MAX_BATCH}")
        if self.lease_secs <= 0 or min(self.tasks_per_partition, self.read_threads) < 1:
            raise ValueError("lease_secs, tasks_per_partition and read_threads must be "
                             "positive")


def _task(client: Client, queue: str, pid: str, token: str) -> LeasedTask:
    """A task object for the verbs (dequeue, renew) from a pid and its lease token."""
    group, name = split_queue(queue)
    wire = WireTask(queue=name, pid=pid, token=str(token), expires_at=0.0, attempts=0,
                    enqueued_at=0.0, payload=None)
    return LeasedTask(client, wire, group)


class LeaseKeeper:
    """The leases of the micro-batches not committed yet, renewed by a daemon thread."""

    def __init__(self, opts: StreamOptions) -> None:
        self.opts = opts
        self.client = opts.conn.client(opts.master, worker="spark-stream")
        self.held: dict[str, Any] = {}
        self.settled = 0  # the highest micro-batch number settled by this process
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="squall-stream-renew",
                                        daemon=True)
        self._thread.start()

    def hold(self, tasks: Held) -> None:
        with self._lock:
            self.held.update({p: t for p, t in tasks})

    def drop(self, pids: Sequence[str]) -> None:
        with self._lock:
            for p in pids:
                self.held.pop(p, None)

    def _loop(self) -> None:
        while not self._stop.wait(self.opts.lease_secs / 3):
            with self._lock:
                items = list(self.held.items())
            for i in range(0, len(items), MAX_BATCH):
                tasks = [_task(self.client, self.opts.queue, p, t)
                         for p, t in items[i:i + MAX_BATCH]]
                try:
                    self.client.renew(tasks, self.opts.lease_secs)
                except SquallError as e:  # one lost lease refuses all: go one by one
                    log.info("renewing %d stream leases failed (%s); one by one",
                             len(tasks), e)
                    for t in tasks:
                        # dequeued meanwhile or taken over: commit will tell
                        with contextlib.suppress(SquallError):
                            self.client.renew(t, self.opts.lease_secs)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.client.close()


def lease_batch(keeper: LeaseKeeper, start: dict[str, Any], limit: int) -> dict[str, Any]:
    """The end offset of the next micro-batch: up to `limit` new leases (`start` itself
    when nothing is available)."""
    o = keeper.opts
    try:
        got = keeper.client.lease(o.queue, min(limit, o.max_tasks_per_batch), o.lease_secs)
    except NotFound:
        got = []
    if not got:
        return start
    tasks: Held = [[t.pid, t.token] for t in got]
    keeper.hold(tasks)
    return {"batch": int(start.get("batch", 0)) + 1, "tasks": tasks}


def settle(keeper: LeaseKeeper, end: dict[str, Any]) -> int:
    """Dequeue a committed micro-batch's tasks with their lease tokens, unless this process
    settled it already; returns how many were dequeued now. A task already gone (settled by
    an earlier run of the query) is skipped; one whose token is stale (another consumer
    leased it) is logged. Any other failure (the master unreachable) raises: nothing new may
    be leased before a committed micro-batch is settled."""
    n = int(end.get("batch", 0))
    if n <= keeper.settled:
        return 0
    held: Held = end.get("tasks", [])
    c, q = keeper.client, keeper.opts.queue
    done = 0
    for i in range(0, len(held), MAX_BATCH):
        part = held[i:i + MAX_BATCH]
        try:
            c.done([_task(c, q, p, t) for p, t in part])
            done += len(part)
        except StatusError:  # all or nothing: one gone or stale refuses all
            for p, t in part:
                try:
                    c.done(_task(c, q, p, t))
                    done += 1
                except NotFound:
                    log.debug("stream settle: task %s %r already dequeued", q, p)
                except StatusError as e:
                    log.warning("stream settle: task %s %r was not dequeued: %s", q, p, e)
    keeper.drop([p for p, _ in held])
    keeper.settled = n
    return done


def read_tasks(opts: StreamOptions, tasks: Held) -> Iterator[tuple[Any, ...]]:
    """The rows of one partition of a micro-batch: each listed task's payload (a task no
    longer queued is skipped: it was committed by an earlier run of this micro-batch)."""
    with opts.conn.client(opts.master) as c, \
            ThreadPoolExecutor(opts.read_threads, thread_name_prefix="squall-stream") as pool:
        def info(pid: str) -> Any:
            try:
                return c.task(opts.queue, pid)
            except NotFound:
                return None

        infos = [i for i in pool.map(info, [p for p, _ in tasks]) if i is not None]
        group = split_queue(opts.queue)[0]
        if not opts.with_payload:
            for t in infos:
                yield task_row(t, opts.queue)
            return
        datas = fetch_many(c, [listed_task(c, t, group) for t in infos], pool)
        for t, d in zip(infos, datas, strict=True):
            if isinstance(d, SquallError):
                raise d  # no replica delivers it: fail the Spark task (it is retried)
            yield (*task_row(t, opts.queue), d if d is not None else b"")


# -- the PySpark classes -----------------------------------------------------------------
from pyspark.sql.datasource import (  # noqa: E402 - the pure parts above need no Spark
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows  # noqa: E402


class TasksPartition(InputPartition):
    def __init__(self, tasks: Held) -> None:
        super().__init__(tasks)
        self.tasks = tasks


class SquallStreamReader(DataSourceStreamReader):
    """Lives on the driver for the whole query (offsets, partitions, commit); its ``read``
    runs on the executors."""

    def __init__(self, opts: StreamOptions) -> None:
        self.opts = opts
        self._keeper: LeaseKeeper | None = None

    @property
    def keeper(self) -> LeaseKeeper:
        if self._keeper is None:  # made on first use: read() on executors never needs it
            self._keeper = LeaseKeeper(self.opts)
        return self._keeper

    def __getstate__(self) -> dict[str, Any]:  # what executors get: options only
        return {"opts": self.opts, "_keeper": None}

    def initialOffset(self) -> dict[str, Any]:
        return {"batch": 0, "tasks": []}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_tasks_per_batch)

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: ReadLimit | None = None) -> dict[str, Any]:
        start = start if start is not None else self.initialOffset()
        settle(self.keeper, start)  # `start` is committed (see the module's docstring)
        n = self.opts.max_tasks_per_batch
        if isinstance(limit, ReadMaxRows):
            n = max(1, min(n, limit.max_rows))
        elif limit is not None and not isinstance(limit, ReadAllAvailable):
            log.info("squall stream: read limit %r not supported; using %d tasks", limit, n)
        return lease_batch(self.keeper, start, n)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        if end == start:
            return []
        tasks: Held = end.get("tasks", [])
        self.keeper.hold(tasks)  # a replayed micro-batch (after a restart): keep its leases
        k = self.opts.tasks_per_partition
        return [TasksPartition(tasks[i:i + k]) for i in range(0, len(tasks), k)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, TasksPartition)
        return read_tasks(self.opts, partition.tasks)

    def commit(self, end: dict[str, Any]) -> None:
        settle(self.keeper, end)

    def stop(self) -> None:
        if self._keeper is not None:
            self._keeper.close()
            self._keeper = None
