"""The read side of the ``squall`` data source: a queue's tasks as rows, without leasing.

Planning (on the driver) walks the master's task listing once, metadata only, and keeps
every ``partition_size``-th pid: partition *i* holds the pids in ``(bounds[i-1],
bounds[i]]``. Each partition then lists its own pid range again (fresh read tokens) and,
with ``payload=true``, fetches the payloads from the data nodes on the executor, several at
a time, each checked against its CRC32C. The queue is live: a task enqueued or dequeued
while the job runs may or may not appear (it is a view, not a snapshot).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from typing import Any

import httpx

from squall.client import Client, LeasedTask, NotFound, SquallError
from squall.client.spark._fetch import fetch_many
from squall.common.models import LeasedTask as WireTask
from squall.common.models import TaskInfo
from squall.common.names import split_queue

PARTITION_SIZE = 10_000
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
    partition_size: int = PARTITION_SIZE
    read_threads: int = READ_THREADS

    def __post_init__(self) -> None:
        split_queue(self.queue)
        if self.partition_size < 1 or self.read_threads < 1:
            raise ValueError("partition_size and read_threads must be positive")


def plan_bounds(client: Client, opts: ReadOptions) -> list[tuple[str | None, str | None]]:
    """Pid ranges ``(after, upto]`` of about ``partition_size`` tasks each (one empty range
    for an empty or absent queue)."""
    cuts: list[str] = []
    try:
        for n, t in enumerate(client.iter_tasks(opts.queue), 1):
            if n % opts.partition_size == 0:
                cuts.append(t.pid)
    except NotFound:
        cuts = []
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


def _fetch(client: Client, t: TaskInfo, group: str) -> bytes:
    """A listed task's payload (its read token came with the listing); no lease taken."""
    wire = WireTask(queue=t.queue, pid=t.pid, token=0, expires_at=0.0, attempts=t.attempts,
                    enqueued_at=t.enqueued_at, payload=t.payload)
    return LeasedTask(client, wire, group).payload()


def _in_range(client: Client, queue: str, after: str | None, upto: str | None
              ) -> Iterator[TaskInfo]:
    try:
        for t in client.iter_tasks(queue, after=after):
            if upto is not None and t.pid > upto:
                return
            yield t
    except NotFound:
        return


def read_range(opts: ReadOptions, after: str | None, upto: str | None
               ) -> Iterator[tuple[Any, ...]]:
    """The rows of one partition."""
    group = split_queue(opts.queue)[0]
    with Client(opts.master) as client:
        tasks = _in_range(client, opts.queue, after, upto)
        if not opts.payload:
            for t in tasks:
                yield task_row(t, opts.queue)
            return
        with ThreadPoolExecutor(opts.read_threads, thread_name_prefix="squall-read") as pool, \
                httpx.Client(timeout=120.0) as http:
            while chunk := list(islice(tasks, FETCH_CHUNK)):
                datas = fetch_many(http, [t.payload for t in chunk],
                                   lambda i: _fetch(client, chunk[i], group), pool)
                for t, data in zip(chunk, datas, strict=True):
                    if isinstance(data, SquallError):
                        raise data  # a payload no replica can deliver fails the read loudly
                    yield (*task_row(t, opts.queue), data)
