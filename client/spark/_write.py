"""The write side of the ``squall`` data source: one partition's rows become tasks.

A partition writer turns Arrow batches into ``(pid, payload)`` rows, cuts them into batches
(at most ``batch_rows`` rows and about ``batch_bytes`` of payload) and hands each batch to
``Client.put_many``: the payloads go straight from this executor to the data nodes (one
``:batch-put`` per replica set), then one enqueue per batch commits their metadata on the
master. Up to ``inflight`` batches are in flight at once (threads), so the partition holds
at most one Arrow batch plus ``inflight`` task batches in memory.

Pids: from the ``pid`` column when given; otherwise ``<prefix>/<partition>/<row>`` where the
prefix is made once per job on the driver (a time-ordered id, or the ``pid_prefix`` option).
Every attempt of a Spark task (retries, speculative copies) computes the same pids for the
same rows, and a pid already queued collapses: a partition written twice enqueues once.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from squall.client import Client, NewTask
from squall.common.models import MAX_BATCH

log = logging.getLogger("squall.spark")

BATCH_ROWS = 200
BATCH_BYTES = 8 << 20
INFLIGHT = 3

Row = tuple[str, bytes | str | None]


@dataclass(frozen=True)
class WriteOptions:
    """The write options, checked on the driver (``SquallDataSource.writer``)."""

    master: str | None
    queue: str
    pid_column: str | None
    payload_column: str | None
    pid_prefix: str
    batch_rows: int = BATCH_ROWS
    batch_bytes: int = BATCH_BYTES
    inflight: int = INFLIGHT

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

    def add(self, other: WriteStats) -> None:
        for k in ("rows", "added", "collapsed", "payload_bytes", "batches"):
            setattr(self, k, getattr(self, k) + getattr(other, k))


def derived_pid(prefix: str, partition: int, row: int) -> str:
    """The pid of a row without a pid column: sorts by job, then partition, then row."""
    return f"{prefix}/{partition:05d}/{row:010d}"


def _pid(value: Any, opts: WriteOptions, partition: int, row: int) -> str:
    if opts.pid_column is None:
        return derived_pid(opts.pid_prefix, partition, row)
    if value is None:
        raise ValueError(f"row {row} of partition {partition} has a null pid (column "
                         f"{opts.pid_column!r}): every task needs one")
    return str(value)


def partition_rows(items: Iterable[Any], opts: WriteOptions, partition: int) -> Iterator[Row]:
    """(pid, payload) of every row of a partition, in order, from Arrow record batches
    (``DataSourceArrowWriter``) or from Spark ``Row`` objects (``DataSourceWriter``)."""
    import pyarrow as pa

    row = 0
    for item in items:
        if not isinstance(item, pa.RecordBatch):  # a pyspark Row
            d = item.asDict()
            yield (_pid(d.get(opts.pid_column or ""), opts, partition, row),
                   d.get(opts.payload_column) if opts.payload_column else None)
            row += 1
            continue
        b = item
        names = b.schema.names
        pids = b.column(names.index(opts.pid_column)) if opts.pid_column else None
        pays = b.column(names.index(opts.payload_column)) if opts.payload_column else None
        for j in range(b.num_rows):
            yield (_pid(pids[j].as_py() if pids is not None else None, opts, partition, row),
                   pays[j].as_py() if pays is not None else None)
            row += 1


def _size(payload: bytes | str | None) -> int:
    return len(payload) if payload is not None else 0


def _chunks(rows: Iterable[Row], max_rows: int, max_bytes: int) -> Iterator[list[Row]]:
    chunk: list[Row] = []
    size = 0
    for r in rows:
        n = _size(r[1])
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

    def _put(self, chunk: list[Row]) -> WriteStats:
        added = self.client.put_many(self.opts.queue, [NewTask(p, pid) for pid, p in chunk],
                                     batch_size=len(chunk))
        return WriteStats(rows=len(chunk), added=added, collapsed=len(chunk) - added,
                          payload_bytes=sum(_size(p) for _, p in chunk), batches=1)

    def write(self, rows: Iterable[Row]) -> WriteStats:
        """Write every row; raises on the first batch that fails (the Spark task then fails
        and its retry collapses the batches already written)."""
        o = self.opts
        pending: deque[Future[WriteStats]] = deque()
        with ThreadPoolExecutor(o.inflight, thread_name_prefix="squall-put") as pool:
            try:
                for chunk in _chunks(rows, o.batch_rows, o.batch_bytes):
                    if self.stats.first_pid is None:
                        self.stats.first_pid = chunk[0][0]
                    self.stats.last_pid = chunk[-1][0]
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
    with Client(opts.master, worker=worker, max_connections=4 * opts.inflight) as client:
        w = PartitionWriter(client, opts, WriteStats(partition=partition, attempt=attempt))
        stats = w.write(partition_rows(batches, opts, partition))
    log.info("partition %d (attempt %d) wrote %d rows into %s: %d new, %d collapsed",
             partition, attempt, stats.rows, opts.queue, stats.added, stats.collapsed)
    return stats
