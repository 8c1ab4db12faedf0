"""The `squall` command line.

User verbs (``put``, ``lease``, ``queues``, ``stats``, ``task``, ``delete``, ``reset-leases``,
``dead-letters``, ``redrive``, ``nodes``) live in ``_cli_verbs.py``, the local cluster
(``squall dev``) in ``_cli_dev.py``. Server commands (``squall master``, ``squall datanode``)
are plugins found through the ``squall.cli`` entry-point group, so this package never
imports the server packages; a plugin that cannot load (e.g. a client-only install) is
skipped with a note instead of breaking the user verbs.
"""

from __future__ import annotations

import os
from importlib.metadata import entry_points

import typer

from squall.client import _cli_auth, _cli_dev, _cli_verbs

app = typer.Typer(help="squall: a distributed, durable, priority task queue.",
                  no_args_is_help=True, add_completion=False,
                  pretty_exceptions_enable=False)


@app.callback()
def _root(token: str = typer.Option(
        "", "--token", envvar="SQUALL_TOKEN", show_default=False,
        help="bearer credential for the master (default: $SQUALL_TOKEN)")) -> None:
    """squall: a distributed, durable, priority task queue."""
    if token:
        os.environ["SQUALL_TOKEN"] = token  # every client this command makes sends it


_cli_verbs.register(app)
_cli_dev.register(app)
_cli_auth.register(app)
_plugins_loaded = False


def _load_plugins() -> None:
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in entry_points(group="squall.cli"):
        try:
            ep.load()(app)
        except ImportError as e:
            if os.environ.get("SQUALL_DEBUG"):
                raise
            typer.echo(f"note: `squall {ep.name}` is unavailable ({e})", err=True)


def main() -> None:
    _load_plugins()
    app()
