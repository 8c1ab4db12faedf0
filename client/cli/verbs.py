"""The ``squall`` task verbs: put, lease, ack, release, cancel, task, tasks. Every verb takes
``--master`` (or ``SQUALL_MASTER``). Queue-level verbs are in ``admin.py``.

What a verb prints comes from the server: it goes through :mod:`._cli_common`'s cleaning
printers. ``lease --done`` prints the tasks *before* dequeueing them, so nothing about
printing can lose a task: a failure before the dequeue leaves the lease to expire."""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from squall.client._sync import Client
from squall.client._tasks import NewTask, Payload
from squall.client.cli.common import (
    JsonOpt,
    MasterOpt,
    ago,
    check_queue,
    clean,
    connect,
    dump_json,
    err,
    fail,
    out,
    preview,
    print_json,
    say,
    show,
    table,
)
from squall.common.errors import NotFound
from squall.common.wire.models import EnqueueResult

QueueArg = Annotated[str, typer.Argument(help="queue, written group#name (group: default)")]
PidArg = Annotated[str, typer.Argument(help="the task's pid")]
# the lease token; `--token` after the verb is kept as an alias (`squall --token CRED`,
# before the verb, is the credential; a lease token looks like `123.<32 hex digits>`)
TokenOpt = Annotated[str, typer.Option("--lease-token", "--token", "-t",
                                       help="the lease token (from `squall lease`)")]


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
        it = _lines(lines)
        first = next(it, None)
        if first is None:
            where = "stdin" if lines == "-" else lines
            fail(f"{where} holds no lines: nothing to enqueue (give payloads as arguments, "
                 "--count N for tasks without payload, or pipe one line per task)", 2)
        return itertools.chain([first], it), None
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
        key: Annotated[str | None, typer.Option(
            "--key", "-k", help="flow-control key of the tasks (a tenant, a domain)")] = None,
        unique: Annotated[str | None, typer.Option(
            help="with --key: queued | active (collapse into the key's queued, or queued or "
                 "running, task)")] = None,
        debounce: Annotated[float | None, typer.Option(
            help="with --key: seconds; replaces the key's queued debounced task")] = None,
        debounce_max: Annotated[float | None, typer.Option(
            help="latest run of a debounced series, seconds after its first")] = None,
        in_batch: Annotated[str | None, typer.Option(
            help="join this open batch (its id in the queue's group)")] = None,
        traceparent: Annotated[str | None, typer.Option(
            help="W3C traceparent to store with the tasks")] = None,
        master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Enqueue tasks: payloads from arguments, files or lines (a progress bar for many)."""
    check_queue(queue)
    extra: dict[str, Any] = {"unique": unique, "debounce": debounce, "debounce_max": debounce_max,
             "batch": in_batch, "traceparent": traceparent}
    items, count = _items(payloads or [], file or [], lines, count)
    with connect(master) as c:
        if count == 1:
            only = next(items)
            r = c.put(queue, only, pid=pid, delay=delay, key=key, **extra)
            say(f"{r.queue} {r.pid}" + (" (already queued: collapsed)" if r.collapsed else ""))
            return
        if pid is not None:
            fail("--pid names one task; give exactly one payload", 2)
        tasks = (NewTask(p, delay=delay, key=key, **extra) for p in items)
        added, seen = _put_with_progress(c, queue, tasks, count, batch)
        say(f"enqueued {added} task(s) into {queue}"
            + (f" ({seen - added} collapsed)" if seen > added else ""))


def _put_with_progress(c: Client, queue: str, tasks: Iterator[NewTask], count: int | None,
                       batch: int) -> tuple[int, int]:
    seen = 0
    with Progress(TextColumn("{task.description}", markup=False), BarColumn(),
                  MofNCompleteColumn(), TimeElapsedColumn(), console=err, transient=True,
                  disable=not err.is_terminal) as bar:
        tid = bar.add_task(clean(f"put {queue}"), total=count)

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
          done: Annotated[bool, typer.Option("--done", help="dequeue them right away, after "
                                                            "printing them")] = False,
          with_payload: Annotated[bool, typer.Option(
              "--payload", help="show payload previews")] = False,
          as_json: JsonOpt = False, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Lease tasks (and with --done, dequeue them: a pop)."""
    check_queue(queue)
    with connect(master) as c:
        tasks = c.lease(queue, n, lease_secs, max_pid=max_pid)
        datas = [t.payload() if with_payload else b"" for t in tasks]
        if as_json:
            objs = [{"queue": t.queue, "pid": t.pid, "token": t.token, "attempts": t.attempts,
                     "expires_at": t.expires_at, "size": t.size,
                     **({"payload": d.decode("utf-8", "replace")} if with_payload else {})}
                    for t, d in zip(tasks, datas, strict=True)]
            sys.stdout.write(dump_json(objs) + "\n")
        elif not tasks:
            say(f"no task available in {queue}")
        else:
            now = time.time()
            cols = ["pid", "token", "attempts", "expires", "bytes"] + (
                ["payload"] if with_payload else [])
            rows = [[t.pid, t.token, t.attempts, ago(t.expires_at, now), t.size]
                    + ([preview(d)] if with_payload else [])
                    for t, d in zip(tasks, datas, strict=True)]
            show(f"leased from {queue}", cols, rows)
        sys.stdout.flush()
        if done and tasks:  # printed first: a failed print leaves the leases to expire
            c.done(tasks)
            if not as_json:
                say(f"dequeued {len(tasks)} task(s)")


def ack(queue: QueueArg, pid: PidArg, token: TokenOpt,
        master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Dequeue (acknowledge) a task you hold: its pid and lease token."""
    check_queue(queue)
    with connect(master) as c:
        c.held(queue, pid, token).done()
    say(f"dequeued {queue} {pid}")


def release(queue: QueueArg, pid: PidArg, token: TokenOpt,
            delay: Annotated[float | None, typer.Option(help="seconds before it may be "
                                                            "leased again")] = None,
            error: Annotated[str | None, typer.Option(
                help="the attempt failed: counts toward max_attempts and applies the retry "
                     "backoff")] = None,
            master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Give back a task you hold (its pid and lease token) so it can be leased again."""
    check_queue(queue)
    with connect(master) as c:
        c.held(queue, pid, token).release(delay=delay, error=error)
    say(f"released {queue} {pid}")


def cancel(queue: QueueArg,
           pids: Annotated[list[str], typer.Argument(help="pids of queued tasks")],
           master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Remove queued (available or delayed) tasks by pid without leasing them."""
    check_queue(queue)
    with connect(master) as c:
        for pid in pids:
            c.cancel(queue, pid)
            say(f"cancelled {queue} {pid}")


def task(queue: QueueArg, pid: PidArg, as_json: JsonOpt = False,
         master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Look up one task: state, attempts, lease holder, last error, payload."""
    check_queue(queue)
    with connect(master) as c:
        try:
            t = c.task(queue, pid)
        except NotFound:
            fail(f"task {pid!r} is not in {queue}: done (dequeued), or never enqueued")
    if as_json:
        print_json(t)
        return
    now = time.time()
    rows: list[list[Any]] = [["state", t.state], ["key", t.key], ["attempts", t.attempts],
            ["enqueued", ago(t.enqueued_at, now)], ["lease expires", ago(t.expires_at, now)],
            ["not before", ago(t.not_before, now)], ["worker", t.worker],
            ["worker address", t.worker_addr], ["origin", t.origin], ["last error", t.error]]
    if t.payload is not None:
        rows += [["payload", f"{t.payload.blob_id} ({t.payload.size} bytes, crc32c "
                             f"{t.payload.crc32c})"], ["replicas", ", ".join(t.payload.replicas)]]
    out.print(table(f"{queue} {pid}", ["", "value"], [r for r in rows if r[1] not in (None, "")]))


def tasks(queue: QueueArg,
          after: Annotated[str | None, typer.Option(help="start after this pid")] = None,
          limit: Annotated[int, typer.Option(min=1, max=100_000)] = 100,
          as_json: JsonOpt = False, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """List a queue's tasks in pid order: state, attempts, lease holder, last error."""
    check_queue(queue)
    with connect(master) as c:
        ts = c.tasks(queue, after=after, limit=limit)
    if as_json:
        print_json(ts)
        return
    if not ts:
        say(f"no tasks in {queue}" + (f" after {after}" if after else ""))
        return
    now = time.time()
    show(f"tasks of {queue}", ["pid", "state", "key", "attempts", "enqueued", "worker",
                               "last error"],
         [[t.pid, t.state, t.key or "", t.attempts, ago(t.enqueued_at, now), t.worker or "",
           (t.error or "").splitlines()[0][:80] if t.error else ""] for t in ts])
    if len(ts) == limit:
        say(f"(first {limit}; more with --after {ts[-1].pid})", style="dim")


def register(app: typer.Typer) -> None:
    for fn in (put, lease, ack, release, cancel, task, tasks):
        app.command(fn.__name__.replace("_", "-"))(fn)
