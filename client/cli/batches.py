"""``squall batch``: create a batch (members and a callback), show its progress, read its
members' results, list and delete batches. A batch is named ``group#id``."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from squall.client._tasks import NewTask
from squall.client.cli.common import (
    JsonOpt,
    MasterOpt,
    check_queue,
    connect,
    dump_json,
    fail,
    print_json,
    say,
    show,
)

app = typer.Typer(help="Batches: members and a callback run once every member is done.",
                  no_args_is_help=True)
BatchArg = Annotated[str, typer.Argument(help="the batch, written group#id")]


@app.command("create")
def create(queue: Annotated[str, typer.Argument(help="the members' queue, group#name")],
           payloads: Annotated[list[str] | None, typer.Argument(
               help="payloads, one member each")] = None,
           count: Annotated[int | None, typer.Option(
               "--count", "-n", min=0, max=1000, help="N members without payload")] = None,
           callback: Annotated[str, typer.Option(
               "--callback", help="queue of the callback (same group)")] = "",
           callback_pid: Annotated[str | None, typer.Option(help="the callback's pid")] = None,
           error_callback: Annotated[str | None, typer.Option(
               help="queue of the error callback (on_dead fail)")] = None,
           on_dead: Annotated[str, typer.Option(
               help="a dead-lettered member: fail the batch, or ignore it")] = "fail",
           batch_id: Annotated[str | None, typer.Option("--id", help="the batch's id")] = None,
           master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Enqueue a batch of members into QUEUE and a callback run when all are done."""
    check_queue(queue)
    if not callback:
        fail("--callback QUEUE is required: where the callback task goes", 2)
    if on_dead not in ("fail", "ignore"):
        fail("--on-dead is fail or ignore", 2)
    if payloads and count is not None:
        fail("give payloads or --count, not both", 2)
    members = ([NewTask(p.encode(), queue=queue) for p in payloads] if payloads
               else [NewTask(queue=queue) for _ in range(count or 0)])
    with connect(master) as c:
        r = c.batch(members, NewTask(pid=callback_pid, queue=callback),
                    error_callback=NewTask(queue=error_callback) if error_callback else None,
                    on_dead=on_dead, batch_id=batch_id)
    say(f"batch {r.batch}: {sum(1 for e in r.enqueued if not e.collapsed)} member(s)")


@app.command("show")
def show_batch(batch: BatchArg, as_json: JsonOpt = False,
               master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """A batch's progress (gone once its callback is done)."""
    with connect(master) as c:
        b = c.batch_info(batch)
    if as_json:
        print_json(b)
        return
    show(f"batch {batch}", ["state", "total", "done", "failed", "pending", "callback",
                            "results"],
         [[b.state, b.total, b.done, b.failed, b.pending, b.callback_queue, b.results]])


@app.command("list")
def list_batches(group: Annotated[str, typer.Argument(help="the group")] = "default",
                 as_json: JsonOpt = False,
                 master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """The group's batches (open, done with their callback pending, failed)."""
    with connect(master) as c:
        bs = c.list_batches(group)
    if as_json:
        print_json(bs)
        return
    if not bs:
        say(f"no batches in group {group}")
        return
    show(f"batches of {group}", ["batch", "state", "done", "failed", "total"],
         [[b.batch, b.state, b.done, b.failed, b.total] for b in bs])


@app.command("results")
def results(batch: BatchArg, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """The results the batch's members returned, as JSON."""
    with connect(master) as c:
        rs = c.batch_results(batch)
    rows = [{"queue": q, "pid": p, "result": v} for (q, p), v in sorted(rs.items())]
    sys.stdout.write(dump_json(rows, indent=True) + "\n")


@app.command("delete")
def delete(batch: BatchArg, master: MasterOpt = "http://127.0.0.1:7070") -> None:
    """Forget a batch and its results (its members stay queued)."""
    with connect(master) as c:
        c.delete_batch(batch)
    say(f"deleted batch {batch}")
