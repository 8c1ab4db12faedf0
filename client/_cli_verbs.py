"""The ``squall`` user verbs: put, lease, queues, stats, task, delete, reset-leases,
dead-letters, redrive (``nodes`` is in ``_cli_nodes.py``). Every verb takes ``--master``
(or ``SQUALL_MASTER``)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Group, RenderableType
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from squall.client._cli_common import (
    JsonOpt,
    MasterOpt,
    ago,
    connect,
    err,
    fail,
    out,
    preview,
    print_json,
    table,
)
from squall.client._sync import Client
from squall.client._tasks import NewTask, Payload
from squall.common.models import ClusterStats, EnqueueResult, QueueStats
from squall.common.names import split_queue

QueueArg = Annotated[str, typer.Argument(help="queue, written group#name (group: default)")]


def _check_queue(queue: str) -> str:
    try:
        split_queue(queue)
    except Exception as e:
        fail(str(e), 2)
    return queue


def _lines(source: str) -> Iterator[bytes]:
    f = sys.stdin.buffer if source == "-" else open(source, "rb")  # noqa: SIM115
    try:
        for line in f:
            yield line.rstrip(b"\r\n")
    finally:
        if f is not sys.stdin.buffer:
            f.close()


def _items(payloads: list[str], files: list[Path], lines: str | None, count: int | None
           ) -> tuple[Iterator[Payload], int | None]:
    """The payloads to enqueue and their count (None: not known up front)."""
    if count is not None:
        if payloads or files or lines:
            fail("--count enqueues tasks without payload; give no payloads with it", 2)
        return iter([None] * count), count
    if lines is None and not payloads and not files and not sys.stdin.isatty():
        lines = "-"
    if lines is not None:
        return _lines(lines), None
    if payloads or files:
        items: list[Payload] = [p.encode() for p in payloads]
        return iter(items + list(files)), len(items) + len(files)
    return iter([None]), 1


def put(queue: QueueArg,
        payloads: Annotated[list[str] | None, typer.Argument(
            help="payloads, one task each (none given: stdin lines if piped, else one task "
                 "without payload)")] = None,
        file: Annotated[list[Path] | None, typer.Option(
            "--file", "-f", exists=True, dir_okay=False, help="a file as one task's payload "
            "(repeatable)")] = None,
        lines: Annotated[str | None, typer.Option(
            "--lines", "-l", help="a file (or - for stdin) whose every line is a task")] = None,
        pid: Annotated[str | None, typer.Option(help="priority-ID (one task only; default: "
                                                     "FIFO)")] = None,
        delay: Annotated[float | None, typer.Option(help="seconds before it may be leased")
                         ] = None,
        count: Annotated[int | None, typer.Option(
            "--count", "-n", min=1, help="enqueue N tasks without payload")] = None,
        batch: Annotated[int, typer.Option(min=1, max=1000, help="tasks per request")] = 100,
        master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Enqueue tasks: payloads from arguments, files or lines (a progress bar for many)."""
    _check_queue(queue)
    items, count = _items(payloads or [], file or [], lines, count)
    with connect(master) as c:
        if count == 1:
            only = next(items)
            r = c.put(queue, only, pid=pid, delay=delay)
            out.print(f"{r.queue} {r.pid}" + (" (already queued: collapsed)" if r.collapsed
                                                  else ""))
            return
        if pid is not None:
            fail("--pid names one task; give exactly one payload", 2)
        tasks = (NewTask(p, delay=delay) for p in items)
        added, seen = _put_with_progress(c, queue, tasks, count, batch)
        out.print(f"enqueued {added} task(s) into {queue}"
                  + (f" ({seen - added} collapsed)" if seen > added else ""))


def _put_with_progress(c: Client, queue: str, tasks: Iterator[NewTask], count: int | None,
                       batch: int) -> tuple[int, int]:
    seen = 0
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True,
                  disable=not err.is_terminal) as bar:
        tid = bar.add_task(f"put {queue}", total=count)

        def progress(res: list[EnqueueResult]) -> None:
            nonlocal seen
            seen += len(res)
            bar.advance(tid, len(res))

        added = c.put_many(queue, tasks, batch_size=batch, progress=progress)
    return added, seen


def lease(queue: QueueArg,
          n: Annotated[int, typer.Option("-n", "--max-tasks", min=1, max=1000)] = 1,
          lease_secs: Annotated[float | None, typer.Option(
              help="lease length (default: the queue's policy, or 60)")] = None,
          max_pid: Annotated[str | None, typer.Option(help="only pids <= this")] = None,
          done: Annotated[bool, typer.Option("--done", help="dequeue them right away")] = False,
          show: Annotated[bool, typer.Option("--payload", help="show payload previews")] = False,
          as_json: JsonOpt = False, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Lease tasks (and with --done, dequeue them: a pop)."""
    _check_queue(queue)
    with connect(master) as c:
        tasks = c.lease(queue, n, lease_secs, max_pid=max_pid)
        datas = [t.payload() if show else b"" for t in tasks]
        if done and tasks:
            c.done(tasks)
    if as_json:
        import orjson

        objs = [{"queue": t.queue, "pid": t.pid, "token": t.token, "attempts": t.attempts,
                 "expires_at": t.expires_at, "size": t.size,
                 **({"payload": d.decode("utf-8", "replace")} if show else {})}
                for t, d in zip(tasks, datas, strict=True)]
        sys.stdout.write(orjson.dumps(objs).decode() + "\n")
        return
    if not tasks:
        out.print(f"no task available in {queue}")
        return
    now = time.time()
    cols = ["pid", "token", "attempts", "expires", "bytes"] + (["payload"] if show else [])
    rows = [[t.pid, t.token, t.attempts, "dequeued" if done else ago(t.expires_at, now), t.size]
            + ([preview(d)] if show else []) for t, d in zip(tasks, datas, strict=True)]
    out.print(table(f"leased from {queue}", cols, rows))


def queues(regex: Annotated[str | None, typer.Argument(help="regex searched in group#name")
                            ] = None,
           group: Annotated[str | None, typer.Option(help="only this group")] = None,
           all_: Annotated[bool, typer.Option("--all", help="include empty queues")] = False,
           limit: Annotated[int, typer.Option(min=1)] = 1000,
           as_json: JsonOpt = False, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """List queues with their task counts."""
    with connect(master) as c:
        qs = c.queues(regex, group=group, min_tasks=0 if all_ else 1, limit=limit)
    if as_json:
        print_json(qs)
        return
    if not qs:
        out.print("no queues" + (" match" if regex or group else " hold tasks"))
        return
    out.print(table(None, ["queue", "available", "leased", "delayed", "total", "completed"],
                    [[f"{q.group}#{q.queue}", q.available, q.leased, q.delayed, q.total,
                      q.completed] for q in qs]))


def _stats_view(c: Client, queue: str | None) -> RenderableType:
    s = c.stats(queue)
    if isinstance(s, ClusterStats):
        top = sorted(c.queues(limit=1000), key=lambda q: -q.total)[:20]
        head = table("cluster", ["", "value"], [
            ["queues holding tasks", s.queues], ["available", s.available],
            ["leased", s.leased], ["delayed", s.delayed], ["completed", s.completed],
            ["enqueue/s (1m)", f"{s.rates.enqueue_1m:.1f}"],
            ["lease/s (1m)", f"{s.rates.lease_1m:.1f}"],
            ["dequeue/s (1m)", f"{s.rates.dequeue_1m:.1f}"], ["WAL ticket", s.wal_ticket]])
        return Group(head, table("busiest queues", ["queue", "available", "leased",
                                                    "delayed", "completed"],
                                 [[f"{q.group}#{q.queue}", q.available, q.leased, q.delayed,
                                   q.completed] for q in top]))
    assert isinstance(s, QueueStats)
    r = s.rates
    rows = [["available", s.available], ["leased", s.leased], ["delayed", s.delayed],
            ["total", s.total], ["completed", s.completed], ["enqueued (all time)",
                                                             s.enqueued_total],
            ["enqueue/s 1m / 5m", f"{r.enqueue_1m:.1f} / {r.enqueue_5m:.1f}"],
            ["lease/s 1m / 5m", f"{r.lease_1m:.1f} / {r.lease_5m:.1f}"],
            ["dequeue/s 1m / 5m", f"{r.dequeue_1m:.1f} / {r.dequeue_5m:.1f}"],
            ["mean lease (s)", f"{s.mean_lease_secs:.2f}" if s.mean_lease_secs else "-"],
            ["oldest available (s)", s.oldest_available_age_secs or "-"]]
    for x in s.leased_sample[:5]:
        rows.append([f"leased {x.pid}", f"{x.worker} {x.worker_addr} {x.lease_age_secs:.1f}s"])
    return table(f"{s.group}#{s.queue}", ["", "value"], rows)


def stats(queue: Annotated[str | None, typer.Argument(help="a queue (default: the cluster)")
                           ] = None,
          watch: Annotated[bool, typer.Option("--watch", "-w", help="refresh until Ctrl-C")
                           ] = False,
          interval: Annotated[float, typer.Option(min=0.1, help="seconds between refreshes")
                              ] = 2.0,
          times: Annotated[int, typer.Option(hidden=True, help="stop after N refreshes")] = 0,
          as_json: JsonOpt = False, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Queue statistics (counts, rates, lease times), or cluster totals."""
    if queue is not None:
        _check_queue(queue)
    with connect(master) as c:
        if as_json:
            print_json(c.stats(queue))
            return
        if not watch:
            out.print(_stats_view(c, queue))
            return
        n = 0
        try:
            with Live(_stats_view(c, queue), console=out, auto_refresh=False) as live:
                while not times or n < times:
                    time.sleep(interval)
                    live.update(_stats_view(c, queue), refresh=True)
                    n += 1
        except KeyboardInterrupt:
            pass


def task(queue: QueueArg, pid: Annotated[str, typer.Argument(help="the task's pid")],
         as_json: JsonOpt = False, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Look up one task: state, attempts, lease holder, last error, payload."""
    _check_queue(queue)
    from squall.common.errors import NotFound

    with connect(master) as c:
        try:
            t = c.task(queue, pid)
        except NotFound:
            fail(f"task {pid!r} is not in {queue}: done (dequeued), or never enqueued")
    if as_json:
        print_json(t)
        return
    now = time.time()
    rows = [["state", t.state], ["attempts", t.attempts],
            ["enqueued", ago(t.enqueued_at, now)], ["lease expires", ago(t.expires_at, now)],
            ["not before", ago(t.not_before, now)], ["worker", t.worker],
            ["worker address", t.worker_addr], ["origin", t.origin], ["last error", t.error]]
    if t.payload is not None:
        rows += [["payload", f"{t.payload.blob_id} ({t.payload.size} bytes, crc32c "
                             f"{t.payload.crc32c})"], ["replicas", ", ".join(t.payload.replicas)]]
    out.print(table(f"{queue} {pid}", ["", "value"], [r for r in rows if r[1] not in (None, "")]))


def delete(queue: QueueArg,
           yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask")] = False,
           master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Delete a queue and all its tasks."""
    _check_queue(queue)
    if not yes and not typer.confirm(f"delete {queue} and all its tasks?"):
        raise typer.Exit(1)
    with connect(master) as c:
        r = c.delete(queue)
    out.print(f"deleted {queue} ({r.deleted} task(s))")


def reset_leases(queue: QueueArg, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Make every leased task of a queue available again now."""
    _check_queue(queue)
    with connect(master) as c:
        r = c.reset_leases(queue)
    out.print(f"reset {r.reset} lease(s) in {queue}")


def dead_letters(queue: QueueArg, limit: Annotated[int, typer.Option(min=1)] = 100,
                 as_json: JsonOpt = False, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """List a queue's dead letters (tasks that failed max_attempts times)."""
    _check_queue(queue)
    with connect(master) as c:
        dlq = c.dead_letter_queue(queue)
        ts = c.dead_letters(queue, limit=limit)
    if as_json:
        print_json(ts)
        return
    if not ts:
        out.print(f"no dead letters in {dlq}")
        return
    out.print(table(f"dead letters of {queue} (in {dlq})", ["pid", "attempts", "error"],
                    [[t.pid, t.attempts, (t.error or "").splitlines()[0][:160] if t.error
                      else ""] for t in ts]))


def redrive(queue: QueueArg,
            max_tasks: Annotated[int, typer.Option("--max", min=1, max=1000)] = 1000,
            master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Move dead letters back into their queue (attempts reset)."""
    _check_queue(queue)
    with connect(master) as c:
        r = c.redrive(queue, max_tasks)
    out.print(f"moved {r.moved} task(s) from {r.source} back into {queue}")


def register(app: typer.Typer) -> None:
    for fn in (put, lease, queues, stats, task, delete, reset_leases, dead_letters, redrive):
        app.command(fn.__name__.replace("_", "-"))(fn)
