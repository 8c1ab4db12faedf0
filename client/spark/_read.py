"""The read side of the ``squall`` data source: a queue's tasks as rows, without leasing.

Planning (on the driver) asks the master for the queue's size and picks the number of
partitions from it and the session's parallelism (or takes ``partitions`` /
``partition_size``). With more than one partition it walks the task listing once, metadata
only, and keeps every ``partition_size``-th pid as a cursor: partition *i* holds the tasks
after cursor ``i-1`` up to and including cursor ``i`` **in the master's order**, i.e. by
:func:`squall.common.wire.names.pid_key` (pids over 448 bytes sharing their first 448 bytes are
ordered by hash there, not by the string: comparing pid strings would skip or repeat rows).
Each partition then lists its own range again (fresh read tokens) and, with
``with_payload=true``, fetches the payloads from the data nodes on the executor, several
at a time, each checked against its CRC32C. The queue is live: a task enqueued or dequeued
while the job runs may or may not appear (it is a view, not a snapshot); every task present
throughout appears exactly once.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from squall.client import Client, LeasedTask, NotFound, SquallError
from squall.client.spark._conn import Conn
from squall.client.spark._fetch import fetch_many
from squall.common.wire.models import LeasedTask as WireTask
from squall.common.wire.models import TaskInfo
from squall.common.wire.names import pid_key, split_queue

MIN_PARTITION_TASKS = 250  # fewer per partition costs more in Spark tasks than it gains
MAX_PARTITION_TASKS = 20_000  # more per partition serialises the payload reads
READ_THREADS = 4
FETCH_CHUNK = 256

COLUMNS = [
    ("queue", "string"), ("pid", "string"), ("state", "string"), ("attempts", "int"),
    ("enqueued_at", "timestamp"), ("not_before", "timestamp"), ("expires_at", "timestamp"),
    ("worker", "string"), ("error", "string"), ("origin", "string"), ("size", "bigint"),
    ("crc32c", "bigint"), ("blob_id", "string"),
]


def schema_ddl(with_payload: bool) -> str:
    cols = [*COLUMNS, ("payload", "binary")] if with_payload else COLUMNS
    return ", ".join(f"{n} {t}" for n, t in cols)


@dataclass(frozen=True)
class ReadOptions:
    master: str | None
    queue: str
    payload: bool = False
    partition_size: int | None = None  # None: from the queue's size and the parallelism
    partitions: int | None = None
    parallelism: int = 2  # the session's default parallelism (``register`` records it)
    read_threads: int = READ_THREADS
    conn: Conn = field(default_factory=Conn)  # credential, TLS material (``_conn.py``)

    def client(self) -> Client:
        return self.conn.client(self.master)

    def __post_init__(self) -> None:
        split_queue(self.queue)
        if min(self.partition_size or 1, self.partitions or 1, self.read_threads,
               self.parallelism) < 1:
            raise ValueError("partition_size, partitions and read_threads must be positive")


def partition_size(total: int, opts: ReadOptions) -> int:
    """Tasks per partition: as asked, else about two partitions per core of the session
    (at least MIN_PARTITION_TASKS tasks each, at most MAX_PARTITION_TASKS)."""
    if opts.partition_size is not None:
        return opts.partition_size
    if opts.partitions is not None:
        parts = opts.partitions
    else:
        parts = max(2 * opts.parallelism, -(-total // MAX_PARTITION_TASKS))
        parts = min(parts, max(1, total // MIN_PARTITION_TASKS))
    return max(1, -(-total // parts))


def plan_bounds(client: Client, opts: ReadOptions) -> list[tuple[str | None, str | None]]:
    """Ranges ``(after, upto]`` of about ``partition_size`` tasks each, bounded by cursors
    the master listed (one range for an empty, absent or small queue: no listing walk)."""
    try:
        st = client.stats(opts.queue)
    except NotFound:
        return [(None, None)]
    total = getattr(st, "total", 0)
    size = partition_size(total, opts)
    cuts: list[str] = []
    if size < total:
        last_cut = (total - 1) // size * size  # the queue's size when planned: walk no further
        for n, t in enumerate(client.iter_tasks(opts.queue), 1):
            if n % size == 0:
                cuts.append(t.pid)
            if n >= last_cut:
                break
    lows: list[str | None] = [None, *cuts]
    highs: list[str | None] = [*cuts, None]
    return list(zip(lows, highs, strict=True))


def _ts(x: float | None) -> dt.datetime | None:
    return None if x is None else dt.datetime.fromtimestamp(x, tz=dt.UTC)


def task_row(t: TaskInfo, queue: str) -> tuple[Any, ...]:
    p = t.payload
    return (queue, t.pid, t.state, t.attempts, _ts(t.enqueued_at), _ts(t.not_before),
            _ts(t.expires_at), t.worker, t.error, t.origin, p.size if p else None,
            p.crc32c if p else None, p.blob_id if p else None)


def listed_task(client: Client, t: TaskInfo, group: str) -> LeasedTask:
    """A listed task as the client's task object, to read its payload with (the read token
    came with the listing); no lease taken."""
    wire = WireTask(queue=t.queue, pid=t.pid, token="", expires_at=0.0, attempts=t.attempts,
                    enqueued_at=t.enqueued_at, payload=t.payload)
    return LeasedTask(client, wire, group)


def _in_range(client: Client, queue: str, after: str | None, upto: str | None
              ) -> Iterator[TaskInfo]:
    """The tasks after cursor `after`, up to and including cursor `upto`, by the master's
    own order (pid keys), never by comparing pid strings."""
    stop = pid_key(upto) if upto is not None else None
    try:
        for t in client.iter_tasks(queue, after=after):
            if stop is not None and pid_key(t.pid) > stop:
                return
            yield t
    except NotFound:
        return


def read_range(opts: ReadOptions, after: str | None, upto: str | None
               ) -> Iterator[tuple[Any, ...]]:
    """The rows of one partition."""
    group = split_queue(opts.queue)[0]
    with opts.client() as client:
        tasks = _in_range(client, opts.queue, after, upto)
        if not opts.payload:
            for t in tasks:
                yield task_row(t, opts.queue)
            return
        with ThreadPoolExecutor(opts.read_threads, thread_name_prefix="squall-read") as pool:
            while chunk := list(islice(tasks, FETCH_CHUNK)):
                datas = fetch_many(client, [listed_task(client, t, group) for t in chunk], pool)
                for t, data in zip(chunk, datas, strict=True):
                    if isinstance(data, SquallError):
                        raise data  # a payload no replica can deliver fails the read loudly
                    yield (*task_row(t, opts.queue), data)
