"""The `squall` command line.

Server commands (`squall master`, later `squall datanode`) are plugins found through the
``squall.cli`` entry-point group, so this package never imports the server packages.
"""

from __future__ import annotations

from importlib.metadata import entry_points

import typer

app = typer.Typer(help="squall: a distributed, durable, priority task queue.",
                  no_args_is_help=True, add_completion=False)


@app.callback()
def _root() -> None:
    """squall: a distributed, durable, priority task queue."""


def _load_plugins() -> None:
    for ep in entry_points(group="squall.cli"):
        ep.load()(app)


def main() -> None:
    _load_plugins()
    app()
