"""``squall nodes``: list data nodes; ``squall nodes decommission NODE [--wait]`` and
``squall nodes forget NODE`` take one out of service (see docs/operations.md)."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from squall.client._sync import Client
from squall.client.cli.common import (
    JsonOpt,
    MasterOpt,
    clean,
    connect,
    err,
    fail,
    print_json,
    say,
    show,
)
from squall.common.errors import Conflict, NotFound, StatusError, TransportError
from squall.common.wire.models import NodeStatus

app = typer.Typer(help="Data nodes: list them, decommission one, forget one.",
                  no_args_is_help=False)
NodeArg = Annotated[str, typer.Argument(help="the data node's id (`squall nodes` lists them)")]
DEFAULT = "http://127.0.0.1:7070"


@app.callback(invoke_without_command=True)
def nodes(ctx: typer.Context, as_json: JsonOpt = False, master: MasterOpt = DEFAULT) -> None:
    """Data nodes: health, usage, decommission progress, and under-replicated blobs."""
    if ctx.invoked_subcommand is not None:
        return
    with connect(master) as c:
        info = c.cluster()
    if as_json:
        print_json(info)
        return
    rows = [[n.node_id, n.address, n.state, _ago(n.last_beat_secs_ago), _size(n.used_bytes),
             _size(n.free_bytes), n.blob_count, _remaining(n)] for n in info.nodes]
    show("data nodes", ["node", "address", "state", "last beat", "used", "free", "blobs",
                        "to move"], rows)
    say(f"replication factor {info.replication_factor}, write quorum "
        f"{info.write_quorum}, {info.blobs} blob(s), {info.under_replicated} "
        f"under-replicated, {info.lost} lost, {info.copies_in_flight} copies in flight")


@app.command()
def decommission(
    node: NodeArg,
    wait: Annotated[bool, typer.Option("--wait", help="wait until it is decommissioned, "
                                       "with a progress bar")] = False,
    timeout: Annotated[float, typer.Option(min=0, help="--wait gives up after this many "
                                           "seconds (exit code 1); 0: no limit")] = 0,
    interval: Annotated[float, typer.Option(min=0.05, help="seconds between polls")] = 1.0,
    cancel: Annotated[bool, typer.Option("--cancel", help="cancel a decommission: the node "
                                         "takes new blobs again (a node the master does not "
                                         "know: nothing to do, exit code 0)")] = False,
    as_json: JsonOpt = False,
    master: MasterOpt = DEFAULT,
) -> None:
    """Take a data node out of service without dropping any blob below its replication
    factor: it gets no new blobs and its blobs are copied to other nodes."""
    with connect(master) as c:
        if cancel:
            try:
                n = c.decommission(node, cancel=True)
            except NotFound:  # a node the master never heard of has nothing to cancel
                say(f"{node}: not known to the master, nothing to cancel")
                return
            say(f"{node}: not decommissioning, now {n.state}")
            return
        n = c.decommission(node)
        if wait and n.state != "decommissioned":
            n = _wait(c, node, n, timeout, interval)
    if as_json:
        print_json(n)
    elif n.state == "decommissioned":
        say(f"{node} is decommissioned: every blob it held has its replication factor "
                  f"on other nodes. Stop it, then `squall nodes forget {node}`.")
    else:
        say(f"{node} is {n.state}: {_remaining(n) or 'counting'} blob(s) to move"
            f"{_uncommitted(n)}. Follow with `squall nodes decommission {node} --wait`.")


def _wait(c: Client, node: str, n: NodeStatus, timeout: float, interval: float) -> NodeStatus:
    """Poll until decommissioned (transient master errors are retried until `timeout`)."""
    deadline = time.monotonic() + timeout if timeout else float("inf")
    total = 0
    last_line = 0.0
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("blobs moved"), TimeElapsedColumn(), console=err,
                  transient=True, disable=not err.is_terminal) as bar:
        tid = bar.add_task(f"decommission {node}", total=None)
        while True:
            left = n.decommission.blobs_remaining if n.decommission else None
            if left is not None:
                total = max(total, left)
                bar.update(tid, total=total, completed=total - left)
            if n.state == "decommissioned":
                return n
            if n.state == "dead" or n.decommission is None:
                fail(f"{node} is {n.state} and no longer draining: "
                     + ("its blobs are being re-replicated as for any dead node"
                        if n.state == "dead" else "someone cancelled the decommission"))
            now = time.monotonic()
            if now >= deadline:
                fail(f"{node} is still {n.state} after {timeout:g}s "
                     f"({'?' if left is None else left} blob(s) to move{_uncommitted(n)})")
            waiting = _uncommitted(n)
            bar.update(tid, description=f"decommission {node}{waiting}")
            if not err.is_terminal and now - last_line >= 10:
                last_line = now
                err.print(clean(f"{node}: {n.state}, {'?' if left is None else left} "
                                f"blob(s) to move{waiting}"), markup=False)
            time.sleep(min(interval, max(0.0, deadline - now)))
            try:
                n = c.node(node)
            except (TransportError, StatusError) as e:
                if isinstance(e, StatusError) and e.status < 500:
                    raise
                continue  # a restarting master: keep waiting until the deadline


@app.command()
def forget(node: NodeArg, master: MasterOpt = DEFAULT) -> None:
    """Remove a dead or decommissioned data node from the master's node table."""
    with connect(master) as c:
        try:
            c.forget(node)
        except Conflict as e:
            fail(str(e))
    say(f"forgot {node}")


def _remaining(n: NodeStatus) -> str:
    if n.decommission is None:
        return ""
    left = n.decommission.blobs_remaining
    return "?" if left is None else str(left)


def _uncommitted(n: NodeStatus) -> str:
    """"; N uploads not yet committed, waiting up to Xs" when the drain waits for them."""
    d = n.decommission
    if d is None or not d.uploads_uncommitted:
        return ""
    secs = d.uncommitted_wait_secs
    wait = "" if secs is None else f", waiting up to {secs:.0f}s"
    return f"; {d.uploads_uncommitted} upload(s) not yet committed{wait}"


def _ago(secs: float | None) -> str:
    return "" if secs is None else f"{secs:.1f}s"


def _size(n: int) -> str:
    f = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if f < 1024 or unit == "TiB":
            return f"{f:.0f} {unit}" if unit == "B" else f"{f:.1f} {unit}"
        f /= 1024
    return str(n)  # pragma: no cover
