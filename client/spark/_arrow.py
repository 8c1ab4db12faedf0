"""Arrow-batched handlers: ``run_stage(..., batch=True)`` hands the handler one
``pyarrow.RecordBatch`` per leased batch, for model-style work that wants many inputs at
once (a GPU batch, a vectorised parse).

The handler gets the columns ``pid`` (string), ``payload`` (binary: the task's payload,
``b""`` when it has none) and ``attempts`` (int32), in pid order, and returns the batch's
outputs: ``None``; a ``pyarrow.RecordBatch`` or ``pyarrow.Table`` (or a ``dict`` of
columns) with ``pid`` and ``payload`` columns and optionally ``queue`` (default: the sink;
queues of the source's group only); or a list of what a per-task handler may return.

**Atomic per batch.** The dequeues of the whole batch and all its outputs are one update:
all of them happen or none does. If the handler raises, every task of the batch is
released with the error (the queue's retry policy and dead-letter queue apply per task).
If the update is refused (a lease lost meanwhile), nothing of the batch is saved and every
task runs again: the batch is never split. A task whose payload no replica can deliver is
left out of the handler's batch and released with the error in the same update. Since one
update holds at most 1,000 items, a batch's tasks plus its outputs must stay within that:
more is the handler's failure, with a clear error.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from squall.client import BadRequest, LeasedTask, NewTask, PayloadTooLarge, StatusError
from squall.client import TransportError as _TransportError
from squall.client.spark._fetch import fetch_many
from squall.client.spark._stage import (
    Outcome,
    StageLoop,
    _Renewer,
    outputs,
    stage_update,
)
from squall.common.errors import SquallError
from squall.common.wire.models import MAX_BATCH


def record_batch(tasks: Sequence[LeasedTask], datas: Sequence[bytes | None]) -> Any:
    """The handler's input: one row per task."""
    import pyarrow as pa

    return pa.record_batch({
        "pid": pa.array([t.pid for t in tasks], pa.string()),
        "payload": pa.array([d if d is not None else b"" for d in datas], pa.binary()),
        "attempts": pa.array([t.attempts for t in tasks], pa.int32())})


def batch_outputs(result: Any, sink: str | None, group: str) -> list[NewTask]:
    """A batch handler's result as tasks to enqueue (see the module docstring)."""
    import pyarrow as pa

    if result is None:
        return []
    if isinstance(result, pa.RecordBatch | pa.Table | dict):
        cols = result if isinstance(result, dict) else result.to_pydict()
        if "pid" not in cols or "payload" not in cols:
            raise ValueError("a batch handler's result needs 'pid' and 'payload' columns, "
                             f"not {sorted(cols)}")
        queues = cols.get("queue") or [None] * len(cols["pid"])
        items: list[Any] = [NewTask(p, pid=pid, queue=q) for pid, p, q in
                            zip(cols["pid"], cols["payload"], queues, strict=True)]
    elif isinstance(result, list):
        items = result
    else:
        raise TypeError("a batch handler returns None, a pyarrow RecordBatch or Table, a "
                        f"dict of columns or a list, not {type(result).__name__}")
    for i, r in enumerate(items):
        pid = r.pid if isinstance(r, NewTask) else r[0] if isinstance(r, tuple) else None
        if pid is None:
            raise ValueError(f"output {i} of a batch handler has no pid (a batch's outputs "
                             "have no source task to take it from)")
    return outputs("", items, sink, group) if items else []


class ArrowStageLoop(StageLoop):
    """The stage loop with one handler call per leased batch, committed all or nothing."""

    def _run_batch(self, pool: ThreadPoolExecutor, tasks: list[LeasedTask]) -> list[Outcome]:
        renewer = _Renewer(self, tasks)
        with ThreadPoolExecutor(1, thread_name_prefix="squall-fetch") as fetcher:
            fetching = fetcher.submit(fetch_many, self.client, tasks, pool)
            renewer.wait({fetching})
            datas = fetching.result()
        ok = [i for i, d in enumerate(datas) if not isinstance(d, SquallError)]
        unread: list[Outcome] = [(tasks[i], d) for i, d in enumerate(datas)
                                 if isinstance(d, SquallError)]
        if not ok:
            return unread
        batch = record_batch([tasks[i] for i in ok], [datas[i] for i in ok])  # type: ignore[misc]
        running = pool.submit(self._call, batch)
        renewer.wait({running})
        err = running.exception()
        if err is not None:
            return [*unread, *((tasks[i], err) for i in ok)]
        outs = running.result()
        return [*unread, (tasks[ok[0]], outs), *((tasks[i], []) for i in ok[1:])]

    def _call(self, batch: Any) -> list[NewTask]:
        outs = batch_outputs(self.handler(batch), self.spec.sink, self.group)
        if batch.num_rows + len(outs) > MAX_BATCH:
            raise ValueError(f"a batch of {batch.num_rows} tasks with {len(outs)} outputs "
                             f"exceeds one update ({MAX_BATCH} items): lower batch_size")
        return outs

    def commit(self, outcomes: list[Outcome]) -> None:
        """One update for the whole batch, never split."""
        tx = stage_update(self.client, self.group, outcomes)
        try:
            self.client.commit(tx)
        except (BadRequest, PayloadTooLarge) as e:
            if not all(isinstance(out, BaseException) for _, out in outcomes):
                # the outputs were refused (a bad pid, too large): the handler's failure
                self.commit([(t, out if isinstance(out, BaseException) else e)
                             for t, out in outcomes])
                return
            for t, _ in outcomes:
                self._single_failed((t, e), e)
            return
        except (StatusError, _TransportError) as e:
            for t, _ in outcomes:
                self._single_failed((t, e), e)
            return
        self._count(outcomes)

