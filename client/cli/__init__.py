"""The `squall` command line.

Task verbs (``put``, ``lease``, ``ack``, ``release``, ``cancel``, ``task``, ``tasks``) live in
``verbs.py``, queue verbs (``queues``, ``stats``, ``delete``, ``reset-leases``,
``dead-letters``, ``redrive``, ``policy …``, ``schedule …``) in ``admin.py``, ``nodes``
(list, decommission, forget) in ``nodes.py``, the local cluster (``squall dev``) in
``dev.py``. Server commands (``squall master``, ``squall datanode``) are plugins found
through the ``squall.cli`` entry-point group, so this package never imports the server
packages; they are loaded only for their own commands and the command list. In a
client-only install (``pip install squall``, without the ``server`` extra) or when a
plugin cannot load, its command stays listed but only says what to install, instead of
breaking the user verbs or printing a traceback.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Annotated

import typer
from rich.markup import escape

from squall.client.cli import admin, auth, batches, dev, nodes, verbs
from squall.client.cli.common import SERVER_EXTRA_HINT, fail, missing_server_deps

app = typer.Typer(help="squall: a distributed, durable, priority task queue.",
                  no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)


def _version(value: bool) -> None:
    if value:
        try:
            v = version("squall")
        except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
            v = "unknown (not installed)"
        typer.echo(f"squall {v}")
        raise typer.Exit()


@app.callback()
def _root(_v: Annotated[bool, typer.Option(
        "--version", callback=_version, is_eager=True, help="print the version and exit")
        ] = False,
          token: Annotated[str, typer.Option(
        "--token", envvar="SQUALL_TOKEN", show_default=False,
        help="bearer credential for the master (default: $SQUALL_TOKEN)")] = "") -> None:
    """squall: a distributed, durable, priority task queue."""
    if token:
        os.environ["SQUALL_TOKEN"] = token  # every client this command makes sends it


verbs.register(app)
admin.register(app)
app.add_typer(nodes.app, name="nodes")
app.add_typer(batches.app, name="batch")
dev.register(app)
auth.register(app)
_plugins_loaded = False


def _unavailable(name: str, why: str) -> None:
    """`squall NAME [anything, --help included]` says what to install, exit status 1."""
    @app.command(name, help=f"Unavailable in this install: {escape(SERVER_EXTRA_HINT)}",
                 add_help_option=False,
                 context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def _stub() -> None:
        fail(f"`squall {name}` needs the server dependencies ({why}): {SERVER_EXTRA_HINT}")


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    missing = missing_server_deps()
    for ep in entry_points(group="squall.cli"):
        if missing and ep.dist is not None and ep.dist.name == "squall":
            _unavailable(ep.name, f"missing: {', '.join(missing)}")
            continue
        try:
            ep.load()(app)
        except ImportError as e:
            if os.environ.get("SQUALL_DEBUG"):
                raise
            _unavailable(ep.name, str(e))


def _needs_plugins(args: list[str]) -> bool:
    """Whether the command line reaches a server command, or prints the list of commands.
    Loading the plugins imports the servers (FastAPI, LMDB: about 0.3 s of CPU), which a user
    verb such as ``squall queues`` never needs."""
    it = iter(args)
    for a in it:
        if a in ("--help", "-h"):
            return True
        if a == "--version":
            return False
        if a == "--token":
            next(it, None)
        elif not a.startswith("-"):
            return a in {ep.name for ep in entry_points(group="squall.cli")}
    return True  # no command: the help lists every command


def main() -> None:
    if _needs_plugins(sys.argv[1:]):
        _load_plugins()
    app()
