"""Shared pieces of the ``squall`` user verbs: the ``--master`` option, the client, and the
one translation of squall errors into one-line messages (no tracebacks for user errors)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

from squall.client._effects import ConnectError
from squall.client._protocol import DEFAULT_MASTER
from squall.client._sync import Client
from squall.common.errors import (
    BadRequest,
    NotFound,
    SquallError,
    StatusError,
    TransportError,
    Unauthorized,
)

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

MasterOpt = Annotated[str, typer.Option(
    "--master", "-m", envvar="SQUALL_MASTER", show_default=True,
    help="base URL of the squall master")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[bold red]error:[/] {message}", markup=True, highlight=False)
    raise typer.Exit(code)


def explain(e: SquallError, master: str) -> str:
    """One line telling the user what went wrong and what to do."""
    if isinstance(e, ConnectError):
        return (f"cannot reach a squall master at {master} ({_short(e)}). Is it running? "
                "Start a local cluster with `squall dev`, or point --master / SQUALL_MASTER "
                "at yours.")
    if isinstance(e, TransportError):
        return f"the squall master at {master} did not answer properly: {e}"
    if isinstance(e, StatusError) and "does not look like a squall server" in e.message:
        return f"{master} does not look like a squall master: {e.message}"
    if isinstance(e, BadRequest):
        return str(e)
    if isinstance(e, NotFound):
        return f"not found: {e}"
    if isinstance(e, Unauthorized):
        return (f"unauthorized: {e} (give a credential with --token or SQUALL_TOKEN; "
                "`squall dev` prints one)")
    if isinstance(e, StatusError):
        return f"{e.code}: {e}"
    return str(e)


def _short(e: SquallError) -> str:
    text = str(e)
    return text.rsplit(": ", 1)[-1] if ": " in text else text


@contextlib.contextmanager
def connect(master: str | None) -> Iterator[Client]:
    """A client for one command; squall errors become a one-line message and exit code 1
    (2 for bad input)."""
    url = (master or DEFAULT_MASTER).rstrip("/")
    try:
        with Client(url, retries=1, timeout=15.0) as c:
            yield c
    except SquallError as e:
        fail(explain(e, url), 2 if isinstance(e, BadRequest) else 1)


def table(title: str | None, columns: list[str], rows: list[list[Any]]) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right", overflow="fold")
    for r in rows:
        t.add_row(*("" if v is None else str(v) for v in r))
    return t


def print_json(obj: Any) -> None:
    import orjson

    data = [o.model_dump() for o in obj] if isinstance(obj, list) else obj.model_dump()
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


def preview(data: bytes, limit: int = 80) -> str:
    text = data[:limit].decode("utf-8", "replace")
    text = text.replace("\n", "\\n")
    return text + ("…" if len(data) > limit else "")


def ago(ts: float | None, now: float) -> str:
    if ts is None:
        return ""
    d = ts - now
    return f"in {d:.1f}s" if d >= 0 else f"{-d:.1f}s ago"
