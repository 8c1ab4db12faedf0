"""The ``squall`` PySpark data source (``pyspark.sql.datasource``).

    df.write.format("squall").option("master", url).option("queue", "g#q") \\
        .option("pid", "path").option("payload", "bytes").mode("append").save()
    spark.read.format("squall").option("master", url).option("queue", "g#q").load()

Connection options, in every direction: ``master``, ``token``, ``tls_ca``, ``tls_cert``,
``tls_key_secret`` (each defaults to the session's ``spark.squall.<option>`` conf, then to
the environment: ``_conn.py``).

Write options: ``queue`` (required), ``pid`` (a string column; default: derived pids, see
``_write.py``), ``payload`` (a binary or string column; default the column named
``payload`` if there is one, else tasks without payload), ``pid_prefix``, ``batch_rows``,
``batch_bytes``, ``inflight``. Only ``append`` is supported: a queue is not a table to
overwrite.

Read options: ``queue``, ``with_payload`` (``true`` adds the payload bytes;
``payload=true`` is its deprecated old name), ``partitions`` or ``partition_size`` (default:
from the queue's size and the session's parallelism), ``read_threads``.

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

from squall.client import SquallError, fifo_pid
from squall.client.spark._conn import Conn, resolve, session_conf
from squall.client.spark._read import (
    READ_THREADS,
    ReadOptions,
    plan_bounds,
    read_range,
    schema_ddl,
)
from squall.client.spark._stream import (
    LEASE_SECS,
    TASKS_PER_BATCH,
    TASKS_PER_PARTITION,
    SquallStreamReader,
    StreamOptions,
)
from squall.client.spark._stream import (
    READ_THREADS as STREAM_READ_THREADS,
)
from squall.client.spark._write import (
    BATCH_BYTES,
    BATCH_ROWS,
    INFLIGHT,
    WriteOptions,
    WriteStats,
    write_partition,
    write_summary,
)
from squall.common.wire.names import split_queue

try:  # Arrow batches straight from Spark (pyspark >= 4.1); Rows before that
    from pyspark.sql.datasource import DataSourceArrowWriter as _WriterBase
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - older pyspark
    from pyspark.sql.datasource import (  # type: ignore[assignment]
        DataSourceStreamWriter as _StreamWriterBase,
    )
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


def write_options(options: Mapping[str, str], schema: StructType,
                  conf: Mapping[str, str] | None = None) -> WriteOptions:
    """Check the write options against the DataFrame's schema (`conf`: the session's
    ``spark.squall.*`` settings)."""
    from pyspark.sql.types import (
        BinaryType,
        NumericType,
        StringType,
        TimestampNTZType,
        TimestampType,
    )

    types = {f.name: f.dataType for f in schema.fields}
    pid_col = _opt(options, "pid")
    if pid_col is not None and not isinstance(types.get(pid_col), StringType):
        raise ValueError(f"option pid={pid_col!r} must name a string column "
                         f"(columns: {', '.join(types)})")
    pay_col = _opt(options, "payload", "payload" if "payload" in types else None)
    if pay_col is not None and not isinstance(types.get(pay_col), BinaryType | StringType):
        raise ValueError(f"option payload={pay_col!r} must name a binary or string column "
                         f"(columns: {', '.join(types)})")
    delay_col, nb_col = _opt(options, "delay"), _opt(options, "not_before")
    if delay_col is not None and not isinstance(types.get(delay_col), NumericType):
        raise ValueError(f"option delay={delay_col!r} must name a numeric column (seconds; "
                         f"columns: {', '.join(types)})")
    if nb_col is not None and not isinstance(types.get(nb_col), TimestampType
                                             | TimestampNTZType | NumericType):
        raise ValueError(f"option not_before={nb_col!r} must name a timestamp column or a "
                         f"numeric one (epoch seconds; columns: {', '.join(types)})")
    key_col = _opt(options, "key")
    if key_col is not None and not isinstance(types.get(key_col), StringType):
        raise ValueError(f"option key={key_col!r} must name a string column (the tasks' "
                         f"flow-control keys; columns: {', '.join(types)})")
    master, conn = resolve(options, conf)
    return WriteOptions(
        master=master, conn=conn, queue=_queue(options), pid_column=pid_col,
        payload_column=pay_col, pid_prefix=_opt(options, "pid_prefix") or fifo_pid(),
        delay_column=delay_col, not_before_column=nb_col, key_column=key_col,
        batch_rows=_int(options, "batch_rows", BATCH_ROWS),
        batch_bytes=_int(options, "batch_bytes", BATCH_BYTES),
        inflight=_int(options, "inflight", INFLIGHT))


def _with_payload(options: Mapping[str, str]) -> bool:
    """``with_payload`` (``payload`` = true/false is its deprecated old name on reads)."""
    if _opt(options, "with_payload") is not None:
        return _bool(options, "with_payload")
    return _opt(options, "payload") is not None and _bool(options, "payload")


def _opt_int(options: Mapping[str, str], key: str) -> int | None:
    return _int(options, key, 0) if _opt(options, key) is not None else None


def check_master(master: str | None, conn: Conn | None = None) -> None:
    """Fail on the driver, with the URL, when the master does not answer."""
    try:
        with (conn or Conn()).client(master, timeout=10.0, retries=1) as c:
            c.cluster()
    except SquallError as e:
        raise ValueError(f"the squall master at {master or '$SQUALL_MASTER'} does not "
                         f"answer ({e}); nothing was written") from None


def read_options(options: Mapping[str, str], parallelism: int = 2,
                 conf: Mapping[str, str] | None = None) -> ReadOptions:
    master, conn = resolve(options, conf)
    return ReadOptions(master=master, conn=conn, queue=_queue(options),
                       payload=_with_payload(options),
                       partition_size=_opt_int(options, "partition_size"),
                       partitions=_opt_int(options, "partitions"), parallelism=parallelism,
                       read_threads=_int(options, "read_threads", READ_THREADS))


@dataclass
class SquallCommitMessage(WriterCommitMessage):
    stats: WriteStats


class SquallWriter(_WriterBase):
    """Made on the driver, pickled to every task: each ``write`` is one partition."""

    def __init__(self, opts: WriteOptions, summary_path: str | None = None) -> None:
        self.opts, self.summary_path = opts, summary_path

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
        total.partitions = sum(isinstance(m, SquallCommitMessage) for m in messages)
        log.info("wrote %d rows into %s: %d new tasks, %d collapsed, %d payload bytes",
                 total.rows, self.opts.queue, total.added, total.collapsed,
                 total.payload_bytes)
        if self.summary_path:
            write_summary(self.summary_path, total)

    def abort(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        done = [m.stats for m in messages if isinstance(m, SquallCommitMessage)]
        log.warning("write into %s failed; %d partition(s) had finished (%d rows). Their "
                    "tasks stay queued (enqueues are not rolled back); a re-run with the "
                    "same pids collapses into them", self.opts.queue, len(done),
                    sum(s.rows for s in done))


class SquallStreamWriter(_StreamWriterBase):
    """``writeStream.format("squall")``: each micro-batch's rows become tasks keyed by pid
    (a ``pid`` column is required: a replayed micro-batch then collapses into what its first
    run enqueued, which makes the sink exactly-once)."""

    def __init__(self, opts: WriteOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> SquallCommitMessage:
        return SquallWriter.write(self, iterator)  # type: ignore[arg-type]

    def commit(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        n = [m.stats for m in messages if isinstance(m, SquallCommitMessage)]
        log.info("micro-batch %d into %s: %d new tasks, %d collapsed", batchId,
                 self.opts.queue, sum(s.added for s in n), sum(s.collapsed for s in n))

    def abort(self, messages: Sequence[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("micro-batch %d into %s failed; a retry collapses into what was "
                    "enqueued", batchId, self.opts.queue)


class RangePartition(InputPartition):
    def __init__(self, after: str | None, upto: str | None) -> None:
        super().__init__((after, upto))
        self.after, self.upto = after, upto


class SquallReader(DataSourceReader):
    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        with self.opts.client() as c:
            return [RangePartition(a, b) for a, b in plan_bounds(c, self.opts)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, RangePartition)
        return read_range(self.opts, partition.after, partition.upto)


class SquallDataSource(DataSource):
    """``format("squall")``: write a DataFrame into a queue, or read a queue's tasks."""

    @classmethod
    def name(cls) -> str:
        return NAME

    #: the session's default parallelism, recorded by :func:`register` (the reader plans
    #: in a Python worker that has no SparkContext to ask)
    parallelism: int = 2
    #: the session's ``spark.squall.*`` conf, recorded by :func:`register` likewise
    conf: Mapping[str, str] = {}

    def schema(self) -> str:  # for reads (on writes the DataFrame's schema is used)
        return schema_ddl(_with_payload(self.options))  # readStream's too

    def writer(self, schema: StructType, overwrite: bool) -> SquallWriter:
        if overwrite:
            raise ValueError("the squall data source only appends (mode('append')): "
                             "enqueued tasks are not replaced; delete the queue first to "
                             "start over")
        opts = write_options(self.options, schema, self.conf)
        check_master(opts.master, opts.conn)  # before any executor uploads a payload
        return SquallWriter(opts, _opt(self.options, "summary_path"))

    def reader(self, schema: StructType) -> SquallReader:
        return SquallReader(read_options(self.options, self.parallelism, self.conf))

    def streamReader(self, schema: StructType) -> SquallStreamReader:
        o = self.options
        master, conn = resolve(o, self.conf)
        return SquallStreamReader(StreamOptions(
            master=master, conn=conn, queue=_queue(o), with_payload=_with_payload(o),
            lease_secs=float(_opt(o, "lease_secs") or LEASE_SECS),
            max_tasks_per_batch=_int(o, "max_tasks_per_batch", TASKS_PER_BATCH),
            tasks_per_partition=_int(o, "tasks_per_partition", TASKS_PER_PARTITION),
            read_threads=_int(o, "read_threads", STREAM_READ_THREADS)))

    def streamWriter(self, schema: StructType, overwrite: bool) -> SquallStreamWriter:
        opts = write_options(self.options, schema, self.conf)
        if opts.pid_column is None:
            raise ValueError("writeStream.format('squall') needs a pid column (option 'pid'): "
                             "a replayed micro-batch must collapse into its first run")
        check_master(opts.master, opts.conn)
        return SquallStreamWriter(opts)


def register(spark: SparkSession) -> None:
    """Make ``format("squall")`` available in this session, for jobs started from the
    calling thread: call it again in any other thread that starts squall reads or writes.

    Spark looks a Python data source up in the JVM thread's *active* session, and the JVM
    thread py4j pairs with a new Python thread has none: the lookup then fails with
    DATA_SOURCE_NOT_FOUND although the session has the source.

    The session's ``spark.squall.*`` conf (master, credential, TLS material: ``_conn.py``)
    is read here: after changing it with ``spark.conf.set``, call ``register`` again."""
    conf = session_conf(spark)
    if getattr(spark, "_squall_registered", None) != conf:
        try:
            par = int(spark.sparkContext.defaultParallelism)
        except Exception:  # Spark Connect has no SparkContext
            par = SquallDataSource.parallelism
        # a subclass made here carries the parallelism and the conf (pickled with it to
        # the planner, never displayed)
        source = type("SquallDataSource", (SquallDataSource,), {
            "parallelism": par, "conf": conf, "__module__": __name__,
            "__qualname__": "SquallDataSource.bound"})
        spark.dataSource.register(source)
        spark._squall_registered = conf  # type: ignore[attr-defined]
    jvm, jsession = getattr(spark, "_jvm", None), getattr(spark, "_jsparkSession", None)
    if jvm is not None and jsession is not None:  # a classic (not Spark Connect) session
        jvm.org.apache.spark.sql.SparkSession.setActiveSession(jsession)
