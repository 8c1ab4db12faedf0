"""``save``: ``df.write.format("squall")...save()`` that returns what it wrote.

``DataFrameWriter.save()`` returns nothing, and the writer's ``commit(messages)`` (where the
partitions' counts meet) runs on the driver's machine in a Python worker, not in the
caller's process. ``save`` hands the writer a file path in a temporary folder (the
``summary_path`` option): ``commit`` writes the job's summed counts there as JSON and
``save`` returns them. It needs the classic driver (not Spark Connect, where ``commit``
runs on the Connect server); there, the counts are logged at INFO by ``commit``.
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING

from squall.client.spark._source import register
from squall.client.spark._write import WriteStats, read_summary

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def save(df: DataFrame, queue: str, *, master: str | None = None, pid: str | None = None,
         payload: str | None = None, delay: str | None = None, not_before: str | None = None,
         key: str | None = None, **options: str | int) -> WriteStats:
    """Write ``df`` into ``queue`` (``mode("append")`` is implied) and return the job's
    counts: ``rows``, ``added`` (new tasks), ``collapsed`` (pids already queued),
    ``payload_bytes``, ``batches``, ``partitions``. Column options as for
    ``format("squall")``: ``pid``, ``payload``, ``delay``, ``not_before``, ``key`` (a
    string column: each task's flow-control key); any other write
    option by keyword (``batch_rows=100``)."""
    register(df.sparkSession)
    with tempfile.TemporaryDirectory(prefix="squall-save-") as d:
        path = os.path.join(d, "summary.json")
        w = df.write.format("squall").mode("append").option("queue", queue) \
            .option("summary_path", path)
        named = {"master": master, "pid": pid, "payload": payload, "delay": delay,
                 "not_before": not_before, "key": key}
        for k, v in {**named, **options}.items():
            if v is not None:
                w = w.option(k, str(v))
        w.save()
        if not os.path.exists(path):  # pragma: no cover - Spark Connect
            raise RuntimeError("the write finished but its summary did not reach this "
                               "process (Spark Connect?); see the INFO log of the writer")
        return read_summary(path)
