"""Shared pieces of the ``squall`` user verbs: the ``--master`` option, the client, the
one translation of squall errors into one-line messages (no tracebacks for user errors),
and printing server data as data.

Queue names, pids, payloads, worker names and error texts come from whoever can reach the
master. They are never interpreted: both consoles have Rich markup and emoji codes off
(``[/]`` or ``[INST]`` print as themselves), and :func:`clean` escapes control characters
(C0, DEL, C1, and the invisible or direction-changing format characters) the way ``repr``
does, so ``\x1b[2J`` shows as text instead of clearing the terminal. Every line the verbs
print goes through :func:`say`, :func:`table` or :func:`fail`, which clean what they print.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, distribution, requires
from typing import Annotated, Any, NoReturn

import typer
from rich.box import SIMPLE_HEAD
from rich.console import Console, ConsoleDimensions
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

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
from squall.common.wire.names import split_queue

UNBOUNDED = 10_000  # the width of output that is not a terminal: lines are never wrapped


class _Console(Console):
    """A console as wide as the terminal; when the output is not a terminal (a pipe, a file,
    a CI log) as wide as ``COLUMNS`` if that is set, else unbounded: a table's rows stay
    one line each for grep and cut, instead of wrapping at an assumed 80 columns."""

    def _size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)  # type: ignore[attr-defined]
        if (self._width is None and not self.is_terminal
                and not (self._environ.get("COLUMNS") or "").isdigit()):
            return ConsoleDimensions(UNBOUNDED, size.height)
        return size  # type: ignore[no-any-return]

    size = property(_size, Console.size.fset)  # type: ignore[attr-defined,assignment]


out = _Console(highlight=False, soft_wrap=True, markup=False, emoji=False)
err = _Console(stderr=True, highlight=False, soft_wrap=True, markup=False, emoji=False)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_UNSAFE_IN_JSON = re.compile("[\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def clean(value: object) -> str:
    """`value` as a string with every control or invisible format character escaped."""
    return _UNSAFE.sub(_escape, str(value))


def say(line: object, style: str | None = None) -> None:
    """Print one line of text (no markup; control characters escaped)."""
    out.print(Text(clean(line), style=style or ""))

MasterOpt = Annotated[str, typer.Option(
    "--master", "-m", envvar="SQUALL_MASTER", show_default=True,
    help="base URL of the squall master")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


SERVER_EXTRA_HINT = "pip install 'squall[server]'"
_EXTRA_SERVER = re.compile(r"""extra\s*==\s*["']server["']""")


def missing_server_deps() -> list[str]:
    """The distributions of the ``server`` extra (FastAPI, uvicorn, LMDB, …) this environment
    lacks: a client-only install (``pip install squall``) lacks them all. Read from the
    installed metadata, so the list lives in pyproject.toml only; [] when squall is not
    installed (a bare checkout) or everything is there."""
    try:
        reqs = requires("squall") or []
    except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return []
    missing = []
    for req in reqs:
        name = re.match(r"[A-Za-z0-9._-]+", req)
        if name is None or not _EXTRA_SERVER.search(req):
            continue
        try:
            distribution(name.group(0))
        except PackageNotFoundError:
            missing.append(name.group(0))
    return missing


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(Text.assemble(("error:", "bold red"), " ", clean(message)))
    raise typer.Exit(code)


def invalid(what: str, e: ValueError, options: dict[str, str] | None = None) -> str:
    """One line for a model's validation error: each field (as the command-line option
    `options` names it) with what is wrong, without pydantic's multi-line layout."""
    errors = getattr(e, "errors", None)
    if not callable(errors):
        return f"invalid {what}: {e}"
    parts = []
    for x in errors():
        loc = ".".join(str(p) for p in x.get("loc", ()))
        msg = str(x.get("msg", "")).removeprefix("Value error, ")
        name = (options or {}).get(loc, loc)
        parts.append(f"{name}: {msg}" if name else msg)
    return f"invalid {what}: " + "; ".join(parts)


def check_queue(queue: str) -> str:
    try:
        split_queue(queue)
    except Exception as e:
        fail(str(e), 2)
    return queue


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
        return (f"unauthorized: {e} (give a credential with `squall --token CRED ...` or "
                "SQUALL_TOKEN; `squall dev` prints one)")
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
    if "://" not in url:
        fail(f"--master {url!r} has no scheme: write http://{url} (or https://{url})", 2)
    # the verbs say themselves what went wrong, in one line: the client's "retrying"
    # warning (for programs that would otherwise wait silently) is not needed here
    quiet = logging.getLogger("squall.client")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        client = Client(url, retries=1, timeout=15.0)
    except ValueError as e:  # not an http(s) URL, or too many addresses
        fail(f"--master: {clean(str(e))}", 2)
    try:
        with client as c:
            yield c
    except SquallError as e:  # a data node's URL: a 404, or a 405 from its SQS routes
        hint = None if isinstance(e, BadRequest) else _data_node_hint(url)
        fail(hint or explain(e, url), 2 if isinstance(e, BadRequest) and not hint else 1)
    finally:
        quiet.setLevel(level)


def _data_node_hint(url: str) -> str | None:
    """A message if `url` is a squall data node (it answers /readyz with its node id)."""
    try:
        with Client(url, retries=0, timeout=3.0) as c:
            ready = c.ready()
    except SquallError:
        return None
    if isinstance(ready, dict) and "node_id" in ready:
        return (f"{url} is a squall data node (node {ready['node_id']}), not a master: point "
                "--master / SQUALL_MASTER at the master (`squall nodes --master MASTER` lists "
                "the data nodes)")
    return None


def table(title: str | None, columns: list[str], rows: list[list[Any]]) -> Table:
    """A table of cleaned cells (for two-column key/value tables and wide terminals)."""
    t = Table(title=None if title is None else Text(clean(title)), title_justify="left",
              header_style="bold", box=SIMPLE_HEAD)
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right", no_wrap=i == 0,
                     overflow="fold")
    for r in rows:
        t.add_row(*(Text("" if v is None else clean(v)) for v in r))
    return t


def show(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    """Print rows as a table when it fits the terminal, else one block per row (its first
    cell, then `column value` pairs), so ids and URLs are never broken inside a cell."""
    t = table(title, columns, rows)
    if Measurement.get(out, out.options.update_width(1 << 16), t).maximum <= out.width:
        out.print(t)
        return
    if title is not None:
        say(title, style="bold")
    for r in rows:
        head = Text(clean(r[0]), style="bold")
        rest = [Text.assemble((c + " ", "dim"), clean(v)) for c, v in zip(columns[1:], r[1:],
                                                                             strict=True)
                if v not in (None, "")]
        out.print(Text("  ").join([head, *rest]), soft_wrap=False)


def dump_json(data: Any, indent: bool = False) -> str:
    """JSON text safe for a terminal: orjson escapes C0 controls; the C1 controls and
    invisible format characters it leaves raw are written as \\u escapes too."""
    import orjson

    text = orjson.dumps(data, option=orjson.OPT_INDENT_2 if indent else 0).decode()
    return _UNSAFE_IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def print_json(obj: Any) -> None:
    data = ([o.model_dump() for o in obj] if isinstance(obj, list) else
            obj if isinstance(obj, dict) else obj.model_dump())
    sys.stdout.write(dump_json(data, indent=True) + "\n")


def preview(data: bytes, limit: int = 80) -> str:
    text = clean(data[:limit].decode("utf-8", "replace"))
    return text + ("…" if len(data) > limit else "")


def ago(ts: float | None, now: float) -> str:
    if ts is None:
        return ""
    d = ts - now
    return f"in {d:.1f}s" if d >= 0 else f"{-d:.1f}s ago"
