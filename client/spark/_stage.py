"""``run_stage``: a pipeline stage over a queue, run by Spark tasks.

Each of ``parallelism`` Spark tasks runs a worker loop on its executor:

1. lease up to ``batch_size`` tasks of the source queue for ``lease_secs``;
2. fetch the payloads (small ones with one batch read per data node, see ``_fetch.py``;
   every one CRC32C-checked) and run the handler on each, in ``threads`` threads,
   renewing the batch's leases every third of ``lease_secs`` while handlers run;
3. commit the whole batch as **one atomic update**: dequeue every task whose handler
   returned, enqueue their outputs into the sink, and release every task whose handler
   raised, with the error (the queue's policy then applies its retry backoff, and moves the
   task to the dead-letter queue on its last attempt). If the update is refused (a lease
   lost meanwhile), the batch is split until the culprit is alone and only it is dropped.
   The update is sent in the background while the next batch is leased and handled (one
   update in flight at most), so the master's fsync does not stall the loop.

The loop ends when the source is drained (no task available, leased or delayed: tasks
waiting out a retry backoff are waited for), when its share of ``max_tasks`` is spent, or at
``timeout_s``. A Spark task that dies loses nothing: its leases expire and the tasks are
leased again (by the loops still running, or by the next run).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any

from squall.client import (
    BadRequest,
    Client,
    LeasedTask,
    LeaseError,
    NewTask,
    NotFound,
    PayloadTooLarge,
    SquallError,
    StatusError,
    TransportError,
)
from squall.client.spark._conn import Conn, resolve, session_conf
from squall.client.spark._fetch import fetch_many
from squall.common.wire.models import MAX_BATCH, QueueStats
from squall.common.wire.names import split_queue

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger("squall.spark")
Handler = Callable[..., Any]
POLL_MAX_S = 0.5
LEASE_FAILURES_MAX = 8  # consecutive failed lease calls before the Spark task gives up
_OUT_TYPES = (bytes, bytearray, memoryview, str, NewTask, tuple)


@dataclass
class StageResult:
    """Counts of one stage run (summed over its Spark tasks).

    ``done``: tasks dequeued from the source with their outputs enqueued (one update each
    batch); ``failed``: handler failures released for another attempt; ``dead_lettered``:
    handler failures on a task's last attempt (moved to the dead-letter queue);
    ``lost``: results dropped because the lease was lost first (the task runs again).
    Once the source is drained, ``done + dead_lettered`` is the number of tasks consumed."""

    done: int = 0
    failed: int = 0
    dead_lettered: int = 0
    lost: int = 0
    outputs: int = 0
    leased: int = 0
    partitions: int = 0
    seconds: float = 0.0  # wall time of the whole stage (the Spark job)
    loop_seconds: float = 0.0  # the slowest Spark task's own loop (no job scheduling)

    def add(self, other: StageResult) -> None:
        for f in fields(self):
            if f.name not in ("seconds", "loop_seconds"):
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        self.loop_seconds = max(self.loop_seconds, other.loop_seconds)

    @property
    def tasks_per_s(self) -> float:
        return (self.done + self.dead_lettered) / self.seconds if self.seconds else 0.0


@dataclass(frozen=True)
class StageSpec:
    """What every Spark task of a stage needs (pickled to the executors)."""

    master: str | None
    source: str
    sink: str | None
    lease_secs: float
    batch_size: int
    threads: int
    with_pid: bool
    max_attempts: int | None
    deadline: float | None  # epoch seconds
    poll_max_s: float = POLL_MAX_S
    batch: bool = False  # one handler call per leased batch (a pyarrow.RecordBatch)
    conn: Conn = field(default_factory=Conn)  # credential, TLS material (``_conn.py``)


def outputs(src_pid: str, result: Any, sink: str | None, group: str) -> list[NewTask]:
    """A handler's result as tasks to enqueue: None; bytes / str (one task, the source's
    pid); a ``(pid, payload)`` tuple; a NewTask (queue default: the sink); or a list of
    those (pids default to ``<source pid>/<index>``)."""
    if result is None:
        return []
    if isinstance(result, _OUT_TYPES):
        items = [result]
    elif isinstance(result, Iterable) and not isinstance(result, Mapping):
        items = list(result)
    else:
        raise TypeError(f"a handler returns None, bytes, str, (pid, payload), NewTask or a "
                        f"list of those, not {type(result).__name__}")
    out: list[NewTask] = []
    for i, r in enumerate(items):
        if isinstance(r, tuple):
            r = NewTask(r[1], pid=r[0])
        elif isinstance(r, NewTask):
            r = replace(r)  # the caller's object stays as it was
        else:
            r = NewTask(r)
        if r.queue is None:
            if sink is None:
                raise ValueError("the handler returned outputs but the stage has no sink")
            r.queue = sink
        if "#" in r.queue and split_queue(r.queue)[0] != group:
            raise ValueError(f"output queue {r.queue} is not in group {group!r}: only queues "
                             "of the source's group change atomically with it")
        if r.pid is None:
            r.pid = src_pid if len(items) == 1 else f"{src_pid}/{i:06d}"
        out.append(r)
    return out


def stage_update(client: Any, group: str, outcomes: list[Outcome]) -> Any:
    """The atomic update of a batch: dequeue each success with its follow-up tasks, release
    each failure with its error."""
    tx = client.transaction(group)
    for task, out in outcomes:
        if isinstance(out, BaseException):
            tx.release(task, error=_describe(out))
            continue
        tx.dequeue(task)
        for o in out:
            tx.put(o.queue or "", o.payload, pid=o.pid, not_before=o.not_before, delay=o.delay)
    return tx


def _describe(e: BaseException, limit: int = 3000) -> str:
    text = "".join(traceback.format_exception(e))
    return f"{type(e).__name__}: {e}\n{text[-limit:]}"[:4000]


Outcome = tuple[LeasedTask, list[NewTask] | BaseException]


class _Renewer:
    """Renews every lease of a batch each ``lease_secs / 3`` (counted from the lease) while
    the caller waits for work on that batch."""

    def __init__(self, loop: StageLoop, tasks: list[LeasedTask]) -> None:
        self.loop, self.tasks = loop, tasks
        self.period = loop.spec.lease_secs / 3
        self.due = time.monotonic() + self.period

    def wait(self, pending: set[Future[Any]]) -> None:
        while pending:
            _, pending = wait(pending, timeout=max(0.0, self.due - time.monotonic()))
            if pending and time.monotonic() >= self.due:
                self.loop._renew(self.tasks)
                self.due = time.monotonic() + self.period


class StageLoop:
    """One Spark task's worker loop (no Spark needed: tests drive it directly)."""

    def __init__(self, client: Client, spec: StageSpec, handler: Handler) -> None:
        self.client, self.spec, self.handler = client, spec, handler
        self.group = split_queue(spec.source)[0]
        self.result = StageResult(partitions=1)
        self._failures = 0  # consecutive failed lease calls

    def _process(self, task: LeasedTask, data: bytes | SquallError | None) -> list[NewTask]:
        if isinstance(data, SquallError):
            raise data  # no replica could deliver it: fail loudly (released with the error)
        data = data if data is not None else b""
        out = self.handler(task.pid, data) if self.spec.with_pid else self.handler(data)
        return outputs(task.pid, out, self.spec.sink, self.group)

    def _run_batch(self, pool: ThreadPoolExecutor, tasks: list[LeasedTask]) -> list[Outcome]:
        """Fetch the batch's payloads and run its handlers, renewing the leases of the
        WHOLE batch (finished results included: they are committed only with the batch)
        every ``lease_secs / 3`` from the moment of the lease until the last handler ends."""
        renewer = _Renewer(self, tasks)
        with ThreadPoolExecutor(1, thread_name_prefix="squall-fetch") as fetcher:
            # its own thread: fetch_many uses `pool` for its reads (threads=1 must not wait
            # on itself)
            fetching = fetcher.submit(fetch_many, self.client, tasks, pool)
            renewer.wait({fetching})
            datas = fetching.result()
        futs: list[Future[list[NewTask]]] = [pool.submit(self._process, t, d)
                                              for t, d in zip(tasks, datas, strict=True)]
        renewer.wait(set(futs))
        return [(t, f.exception() or f.result()) for t, f in zip(tasks, futs, strict=True)]

    def _renew(self, tasks: list[LeasedTask]) -> None:
        try:
            self.client.renew(tasks, self.spec.lease_secs)
        except SquallError:
            for t in tasks:  # one lost lease refuses the whole update: renew one by one
                try:
                    self.client.renew(t, self.spec.lease_secs)
                except SquallError as e:
                    log.warning("renewing %s %r failed: %s", t.queue, t.pid, e)

    def _count(self, outcomes: list[Outcome]) -> None:
        r, m = self.result, self.spec.max_attempts
        for task, out in outcomes:
            if not isinstance(out, BaseException):
                r.done += 1
                r.outputs += len(out)
            elif m is not None and task.attempts >= m:
                r.dead_lettered += 1
            else:
                r.failed += 1

    def commit(self, outcomes: list[Outcome]) -> None:
        """One atomic update for the batch; split on refusal to isolate the culprit."""
        tx = stage_update(self.client, self.group, outcomes)
        try:
            self.client.commit(tx)
        except (StatusError, TransportError) as e:
            if len(outcomes) > 1:
                half = len(outcomes) // 2
                self.commit(outcomes[:half])
                self.commit(outcomes[half:])
                return
            self._single_failed(outcomes[0], e)
            return
        self._count(outcomes)

    def _single_failed(self, outcome: Outcome, e: SquallError) -> None:
        task, out = outcome
        if isinstance(e, LeaseError | NotFound):
            log.warning("task %s %r: lease lost before its result was saved (%s); it will "
                        "run again", task.queue, task.pid, e)
            self.result.lost += 1
        elif isinstance(e, BadRequest | PayloadTooLarge) and not isinstance(out, BaseException):
            # the outputs were refused (a bad pid, too large): that is the handler's failure
            self.commit([(task, e)])
        else:  # the master or the data nodes are unreachable: the lease will expire
            log.warning("task %s %r: saving its result failed (%s); it will run again",
                        task.queue, task.pid, e)
            self.result.lost += 1

    def _drained(self) -> bool:
        try:
            st = self.client.stats(self.spec.source)
        except NotFound:
            return True
        assert isinstance(st, QueueStats)
        return st.total == 0

    def _lease(self, n: int) -> list[LeasedTask] | None:
        """Up to `n` leases; None after a failed attempt (the caller tries again)."""
        s = self.spec
        try:
            tasks = self.client.lease(s.source, n, s.lease_secs)
        except (TransportError, StatusError) as e:
            self._failures += 1
            if self._failures >= LEASE_FAILURES_MAX or isinstance(e, BadRequest):
                raise
            log.warning("leasing from %s failed (%s); retrying", s.source, e)
            time.sleep(min(s.poll_max_s * 2, 0.05 * 2 ** self._failures))
            return None
        self._failures = 0
        return tasks

    def _in_time(self) -> bool:
        return self.spec.deadline is None or time.time() < self.spec.deadline

    def run(self, max_tasks: int | None) -> StageResult:
        """Lease, handle and commit batch after batch. The update of one batch is sent
        while the next batch is leased and handled (one update in flight at most)."""
        s, r = self.spec, self.result
        t0 = time.monotonic()
        idle, left = 0, max_tasks
        saving: Future[None] | None = None
        with ThreadPoolExecutor(s.threads, thread_name_prefix="squall-stage") as pool, \
                ThreadPoolExecutor(1, thread_name_prefix="squall-commit") as committer:
            while (left is None or left > 0) and self._in_time():
                tasks = self._lease(s.batch_size if left is None else min(s.batch_size, left))
                if tasks is None:
                    continue
                if not tasks:
                    if saving is not None:  # its tasks still count as leased until it lands
                        saving.result()
                        saving = None
                        continue
                    if self._drained():
                        break
                    idle += 1
                    time.sleep(min(s.poll_max_s, 0.005 * 2 ** min(idle, 10)))
                    continue
                idle = 0
                r.leased += len(tasks)
                if left is not None:
                    left -= len(tasks)
                outcomes = self._run_batch(pool, tasks)
                if saving is not None:
                    saving.result()
                saving = committer.submit(self.commit, outcomes)
            if saving is not None:
                saving.result()
        r.seconds = r.loop_seconds = time.monotonic() - t0
        return r


def _shares(total: int | None, parts: int) -> list[int | None]:
    if total is None:
        return [None] * parts
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_partition(spec: StageSpec, handler: Handler, partition: int, max_tasks: int | None
                  ) -> dict[str, Any]:
    worker = f"spark-stage:{socket.gethostname()}:{os.getpid()}:p{partition}"
    with spec.conn.client(spec.master, worker=worker,
                          max_connections=2 * spec.threads + 4) as c:
        if spec.batch:
            from squall.client.spark._arrow import ArrowStageLoop

            return asdict(ArrowStageLoop(c, spec, handler).run(max_tasks))
        return asdict(StageLoop(c, spec, handler).run(max_tasks))


def run_stage(spark: SparkSession, source: str, handler: Handler, sink: str | None = None, *,
              parallelism: int | None = None, lease_secs: float = 60.0,
              max_tasks: int | None = None, timeout_s: float | None = None,
              batch_size: int = 200, threads: int = 4, with_pid: bool = False,
              batch: bool = False, master: str | None = None, token: str | None = None,
              tls_ca: str | None = None, tls_cert: str | None = None,
              tls_key: str | None = None) -> StageResult:
    """Run ``handler`` over the tasks of ``source`` on ``parallelism`` Spark tasks, moving
    each task to ``sink`` atomically with its outputs (see the module docstring).

    ``handler(payload: bytes)`` (or ``handler(pid, payload)`` with ``with_pid=True``)
    returns what :func:`outputs` accepts; with ``batch=True``, ``handler(batch)`` gets a
    ``pyarrow.RecordBatch`` of a whole leased batch and the batch moves atomically (see
    ``_arrow.py``). ``sink`` must be in the source's group (one
    update touches one group). ``max_tasks`` bounds the leases taken in all (split evenly
    over the Spark tasks); ``timeout_s`` bounds the wall time. Blocks until every Spark
    task has finished; returns the summed counts.

    ``master``, ``token`` and the TLS material (``tls_ca``, ``tls_cert``, ``tls_key``: a
    path or PEM text) default to the session's ``spark.squall.*`` conf, then to this
    process's ``SQUALL_*`` environment; the executors get them with the job (``_conn.py``)."""
    group = split_queue(source)[0]
    if sink is not None and split_queue(sink)[0] != group:
        raise ValueError(f"sink {sink} is not in group {group!r} of source {source}: a stage "
                         "moves tasks with one atomic update, which touches one group")
    if not 1 <= batch_size <= MAX_BATCH or threads < 1 or lease_secs <= 0:
        raise ValueError(f"batch_size must be 1..{MAX_BATCH}; threads and lease_secs > 0")
    master, conn = resolve({"master": master, "token": token, "tls_ca": tls_ca,
                            "tls_cert": tls_cert, "tls_key_secret": tls_key},
                           session_conf(spark), spark_options=False)
    with conn.client(master) as c:
        max_attempts = c.policy(source).max_attempts
        master = c.master
    parts = parallelism or spark.sparkContext.defaultParallelism
    spec = StageSpec(master, source, sink, lease_secs, batch_size, threads, with_pid,
                     max_attempts, time.time() + timeout_s if timeout_s else None,
                     batch=batch, conn=conn)
    shares = _shares(max_tasks, parts)
    t0 = time.monotonic()
    sc = spark.sparkContext
    sc.setJobDescription(f"squall stage {source} -> {sink or '(none)'}")
    try:
        rows = (sc.parallelize(range(parts), parts)
                .map(lambda i: run_partition(spec, handler, i, shares[i])).collect())
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]
    total = StageResult()
    for row in rows:
        total.add(StageResult(**row))
    total.seconds = time.monotonic() - t0
    return total
