"""The write side of the ``squall`` data source: one partition's rows become tasks.

A partition writer turns Arrow batches into ``(pid, payload)`` rows, cuts them into batches
(at most ``batch_rows`` rows and about ``batch_bytes`` of payload) and hands each batch to
``Client.put_many``: the payloads go straight from this executor to the data nodes (one
``:batch-put`` per replica set), then one enqueue per batch commits their metadata on the
master. Up to ``inflight`` batches are in flight at once (threads), so the partition holds
at most one Arrow batch plus ``inflight`` task batches in memory.

Each row's pid is checked (non-empty, at most 1 KiB of UTF-8, no NUL) before its batch's
payloads are uploaded, so a bad pid fails the partition before it costs data-node writes.
Optional ``delay`` (seconds) and ``not_before`` (a timestamp, or epoch seconds) columns
hold a row back until then.

Pids: from the ``pid`` column when given; otherwise ``<prefix>/<partition>/<row>`` where the
prefix is made once per job on the driver (a time-ordered id, or the ``pid_prefix`` option).
Every attempt of a Spark task (retries, speculative copies) computes the same pids for the
same rows, and a pid already queued collapses: a partition written twice enqueues once.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from squall.client import Client, NewTask
from squall.client.spark._conn import Conn
from squall.common.errors import BadRequest, SquallError
from squall.common.wire.models import MAX_BATCH
from squall.common.wire.names import check_name, check_pid

log = logging.getLogger("squall.spark")

BATCH_ROWS = 200
BATCH_BYTES = 8 << 20
INFLIGHT = 3


@dataclass(frozen=True)
class WriteOptions:
    """The write options, checked on the driver (``SquallDataSource.writer``)."""

    master: str | None
    queue: str
    pid_column: str | None
    payload_column: str | None
    pid_prefix: str
    delay_column: str | None = None
    not_before_column: str | None = None
    key_column: str | None = None  # each task's flow-control key (null: none)
    batch_rows: int = BATCH_ROWS
    batch_bytes: int = BATCH_BYTES
    inflight: int = INFLIGHT
    conn: Conn = field(default_factory=Conn)  # credential, TLS material (``_conn.py``)

    def __post_init__(self) -> None:
        if not 1 <= self.batch_rows <= MAX_BATCH:
            raise ValueError(f"batch_rows must be 1..{MAX_BATCH}, not {self.batch_rows}")
        if self.batch_bytes < 1 or self.inflight < 1:
            raise ValueError("batch_bytes and inflight must be positive")


@dataclass
class WriteStats:
    """What one partition wrote (the commit message sums them on the driver)."""

    partition: int = 0
    attempt: int = 0
    rows: int = 0
    added: int = 0  # new tasks
    collapsed: int = 0  # pids already queued (an earlier attempt, a re-run, a duplicate)
    payload_bytes: int = 0
    batches: int = 0
    first_pid: str | None = None
    last_pid: str | None = None
    partitions: int = 1

    def add(self, other: WriteStats) -> None:
        for k in ("rows", "added", "collapsed", "payload_bytes", "batches"):
            setattr(self, k, getattr(self, k) + getattr(other, k))


def write_summary(path: str, stats: WriteStats) -> None:
    """The job's summed counts as JSON (written by the writer's ``commit`` on the driver)."""
    import json

    with open(path, "w") as f:
        json.dump(asdict(stats), f)


def read_summary(path: str) -> WriteStats:
    import json

    with open(path) as f:
        return WriteStats(**json.load(f))


def derived_pid(prefix: str, partition: int, row: int) -> str:
    """The pid of a row without a pid column: sorts by job, then partition, then row."""
    return f"{prefix}/{partition:05d}/{row:010d}"


def _pid(value: Any, opts: WriteOptions, partition: int, row: int) -> str:
    if opts.pid_column is None:
        return derived_pid(opts.pid_prefix, partition, row)
    if value is None:
        raise ValueError(f"row {row} of partition {partition} has a null pid (column "
                         f"{opts.pid_column!r}): every task needs one")
    pid = str(value)
    try:
        check_pid(pid)
    except SquallError as e:  # BadRequest / PayloadTooLarge: say which row
        raise ValueError(f"row {row} of partition {partition}: bad pid in column "
                         f"{opts.pid_column!r}: {e}") from None
    return pid


def _epoch(v: Any) -> float | None:
    if v is None or isinstance(v, int | float):
        return v
    if isinstance(v, dt.datetime):
        return (v if v.tzinfo else v.replace(tzinfo=dt.UTC)).timestamp()
    raise ValueError(f"not_before must be a timestamp or epoch seconds, not {v!r}")


def _task(opts: WriteOptions, partition: int, row: int, get: Any) -> NewTask:
    delay = get(opts.delay_column) if opts.delay_column else None
    return NewTask(get(opts.payload_column) if opts.payload_column else None,
                   _pid(get(opts.pid_column) if opts.pid_column else None, opts, partition,
                        row),
                   not_before=_epoch(get(opts.not_before_column))
                   if opts.not_before_column else None,
                   delay=float(delay) if delay is not None else None,
                   key=_key(get(opts.key_column), partition, row) if opts.key_column else None)


def _key(value: Any, partition: int, row: int) -> str | None:
    if value is None:
        return None
    try:
        return check_name("key", str(value))
    except BadRequest as e:
        raise ValueError(f"row {row} of partition {partition}: bad key: {e}") from None


def partition_rows(items: Iterable[Any], opts: WriteOptions, partition: int
                   ) -> Iterator[NewTask]:
    """The task of every row of a partition, in order, from Arrow record batches
    (``DataSourceArrowWriter``) or from Spark ``Row`` objects (``DataSourceWriter``)."""
    import pyarrow as pa

    row = 0
    for item in items:
        if not isinstance(item, pa.RecordBatch):  # a pyspark Row
            d = item.asDict()
            yield _task(opts, partition, row, d.get)
            row += 1
            continue
        names = item.schema.names
        cols = {c: item.column(names.index(c)) for c in (
            opts.pid_column, opts.payload_column, opts.delay_column, opts.not_before_column,
            opts.key_column)
            if c is not None}
        for j in range(item.num_rows):
            yield _task(opts, partition, row, lambda c, j=j, cols=cols: cols[c][j].as_py())
            row += 1


def _size(payload: object) -> int:
    return len(payload) if isinstance(payload, bytes | bytearray | memoryview | str) else 0


def _chunks(rows: Iterable[NewTask], max_rows: int, max_bytes: int
            ) -> Iterator[list[NewTask]]:
    chunk: list[NewTask] = []
    size = 0
    for r in rows:
        n = _size(r.payload)
        if chunk and (len(chunk) >= max_rows or size + n > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(r)
        size += n
    if chunk:
        yield chunk


@dataclass
class PartitionWriter:
    """Writes one partition's rows into the queue (no Spark needed: tests drive it too)."""

    client: Client
    opts: WriteOptions
    stats: WriteStats = field(default_factory=WriteStats)

    def _put(self, chunk: list[NewTask]) -> WriteStats:
        added = self.client.put_many(self.opts.queue, chunk, batch_size=len(chunk))
        return WriteStats(rows=len(chunk), added=added, collapsed=len(chunk) - added,
                          payload_bytes=sum(_size(t.payload) for t in chunk),
                          batches=1)

    def write(self, rows: Iterable[NewTask]) -> WriteStats:
        """Write every row; raises on the first batch that fails (the Spark task then fails
        and its retry collapses the batches already written)."""
        o = self.opts
        pending: deque[Future[WriteStats]] = deque()
        with ThreadPoolExecutor(o.inflight, thread_name_prefix="squall-put") as pool:
            try:
                for chunk in _chunks(rows, o.batch_rows, o.batch_bytes):
                    if self.stats.first_pid is None:
                        self.stats.first_pid = chunk[0].pid
                    self.stats.last_pid = chunk[-1].pid
                    if len(pending) >= o.inflight:
                        self.stats.add(pending.popleft().result())
                    pending.append(pool.submit(self._put, chunk))
                while pending:
                    self.stats.add(pending.popleft().result())
            finally:
                for f in pending:
                    f.cancel()
        return self.stats


def write_partition(batches: Iterable[Any], opts: WriteOptions, partition: int,
                    attempt: int, worker: str) -> WriteStats:
    """A Spark task's whole write: its own client, its rows, its stats."""
    with opts.conn.client(opts.master, worker=worker,
                          max_connections=4 * opts.inflight) as client:
        w = PartitionWriter(client, opts, WriteStats(partition=partition, attempt=attempt))
        stats = w.write(partition_rows(batches, opts, partition))
    log.info("partition %d (attempt %d) wrote %d rows into %s: %d new, %d collapsed",
             partition, attempt, stats.rows, opts.queue, stats.added, stats.collapsed)
    return stats
