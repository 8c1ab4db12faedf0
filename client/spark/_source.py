"""The ``squall`` PySpark data source (``pyspark.sql.datasource``).

    df.write.format("squall").option("master", url).option("queue", "g#q") \\
        .option("pid", "path").option("payload", "bytes").mode("append").save()
    spark.read.format("squall").option("master", url).option("queue", "g#q").load()

Write options: ``master`` (default ``$SQUALL_MASTER``), ``queue`` (required), ``pid`` (a
string column; default: derived pids, see ``_write.py``), ``payload`` (a binary or string
column; default the column named ``payload`` if there is one, else tasks without payload),
``pid_prefix``, ``batch_rows``, ``batch_bytes``, ``inflight``. Only ``append`` is
supported: a queue is not a table to overwrite.

Read options: ``master``, ``queue``, ``payload`` (``true`` adds the payload bytes),
``partition_size`` (tasks per Spark partition), ``read_threads``.

``writer()`` / ``reader()`` run on the driver, in a Python worker that plans the job: they
check the options and the schema there (errors surface at ``save()``/``load()``), and the
writer object they return is pickled once and shipped to every task attempt.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceWriter,
    InputPartition,
    WriterCommitMessage,
)

from squall.client import Client, fifo_pid
from squall.client.spark._read import (
    PARTITION_SIZE,
    READ_THREADS,
    ReadOptions,
    plan_bounds,
    read_range,
    schema_ddl,
)
from squall.client.spark._write import (
    BATCH_BYTES,
    BATCH_ROWS,
    INFLIGHT,
    WriteOptions,
    WriteStats,
    write_partition,
)
from squall.common.names import split_queue

try:  # Arrow batches straight from Spark (pyspark >= 4.1); Rows before that
    from pyspark.sql.datasource import DataSourceArrowWriter as _WriterBase
except ImportError:  # pragma: no cover - older pyspark
    _WriterBase = DataSourceWriter  # type: ignore[misc,assignment]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

log = logging.getLogger("squall.spark")
NAME = "squall"


def _opt(options: Mapping[str, str], key: str, default: str | None = None) -> str | None:
    v = options.get(key)
    return v if v not in (None, "") else default


def _int(options: Mapping[str, str], key: str, default: int) -> int:
    v = _opt(options, key)
    try:
        return int(v) if v is not None else default
    except ValueError:
        raise ValueError(f"option {key!r} must be an integer, not {v!r}") from None


def _bool(options: Mapping[str, str], key: str) -> bool:
    v = (_opt(options, key) or "false").lower()
    if v not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"option {key!r} must be true or false, not {v!r}")
    return v in ("true", "1", "yes")


def _queue(options: Mapping[str, str]) -> str:
    q = _opt(options, "queue")
    if q is None:
        raise ValueError('the squall data source needs option("queue", "group#name")')
    split_queue(q)
    return q


def write_options(options: Mapping[str, str], schema: StructType) -> WriteOptions:
    """Check the write options against the DataFrame's schema."""
    from pyspark.sql.types import BinaryType, StringType

    types = {f.name: f.dataType for f in schema.fields}
    pid_col = _opt(options, "pid")
    if pid_col is not None and not isinstance(types.get(pid_col), StringType):
        raise ValueError(f"option pid={pid_col!r} must name a string column "
                         f"(columns: {', '.join(types)})")
    pay_col = _opt(options, "payload", "payload" if "payload" in types else None)
    if pay_col is not None and not isinstance(types.get(pay_col), BinaryType | StringType):
        raise ValueError(f"option payload={pay_col!r} must name a binary or string column "
                         f"(columns: {', '.join(types)})")
    return WriteOptions(
        master=_opt(options, "master"), queue=_queue(options), pid_column=pid_col,
        payload_column=pay_col, pid_prefix=_opt(options, "pid_prefix") or fifo_pid(),
        batch_rows=_int(options, "batch_rows", BATCH_ROWS),
        batch_bytes=_int(options, "batch_bytes", BATCH_BYTES),
        inflight=_int(options, "inflight", INFLIGHT))


def read_options(options: Mapping[str, str]) -> ReadOptions:
    return ReadOptions(master=_opt(options, "master"), queue=_queue(options),
                       payload=_bool(options, "payload"),
                       partition_size=_int(options, "partition_size", PARTITION_SIZE),
                       read_threads=_int(options, "read_threads", READ_THREADS))


@dataclass
class SquallCommitMessage(WriterCommitMessage):
    stats: WriteStats


class SquallWriter(_WriterBase):
    """Made on the driver, pickled to every task: each ``write`` is one partition."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> SquallCommitMessage:
        from pyspark import TaskContext

        tc = TaskContext.get()
        part, attempt = (tc.partitionId(), tc.attemptNumber()) if tc else (0, 0)
        worker = f"spark-write:{socket.gethostname()}:{os.getpid()}:p{part}a{attempt}"
        return SquallCommitMessage(write_partition(iterator, self.opts, part, attempt, worker))

    def commit(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        total = WriteStats()
        for m in messages:
            if isinstance(m, SquallCommitMessage):
                total.add(m.stats)
        log.info("wrote %d rows into %s: %d new tasks, %d collapsed, %d payload bytes",
                 total.rows, self.opts.queue, total.added, total.collapsed,
                 total.payload_bytes)

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        done = [m.stats for m in messages if isinstance(m, SquallCommitMessage)]
        log.warning("write into %s failed; %d partition(s) had finished (%d rows). Their "
                    "tasks stay queued (enqueues are not rolled back); a re-run with the "
                    "same pids collapses into them", self.opts.queue, len(done),
                    sum(s.rows for s in done))


class RangePartition(InputPartition):
    def __init__(self, after: str | None, upto: str | None) -> None:
        super().__init__((after, upto))
        self.after, self.upto = after, upto


class SquallReader(DataSourceReader):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        with Client(self.opts.master) as c:
            return [RangePartition(a, b) for a, b in plan_bounds(c, self.opts)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, RangePartition)
        return read_range(self.opts, partition.after, partition.upto)


class SquallDataSource(DataSource):
    """``format("squall")``: write a DataFrame into a queue, or read a queue's tasks."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:  # for reads; on writes "payload" names a column instead
        return schema_ddl((_opt(self.options, "payload") or "").lower() in ("true", "1", "yes"))

    def writer(self, schema: StructType, overwrite: bool) -> SquallWriter:
        if overwrite:
            raise ValueError("the squall data source only appends (mode('append')): "
                             "enqueued tasks are not replaced; delete the queue first to "
                             "start over")
        return SquallWriter(write_options(self.options, schema))

    def reader(self, schema: StructType) -> SquallReader:
        return SquallReader(read_options(self.options))


def register(spark: SparkSession) -> None:
    """Make ``format("squall")`` available in this session, for jobs started from the
    calling thread: call it again in any other thread that starts squall reads or writes.

    Spark looks a Python data source up in the JVM thread's *active* session, and the JVM
    thread py4j pairs with a new Python thread has none: the lookup then fails with
    DATA_SOURCE_NOT_FOUND although the session has the source."""
    if not getattr(spark, "_squall_registered", False):
        spark.dataSource.register(SquallDataSource)
        spark._squall_registered = True  # type: ignore[attr-defined]
    jvm, jsession = getattr(spark, "_jvm", None), getattr(spark, "_jsparkSession", None)
    if jvm is not None and jsession is not None:  # a classic (not Spark Connect) session
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)
