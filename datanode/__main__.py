"""`python -m squall.datanode --data-dir D --port P ...`: the same as `squall datanode`."""

import sys

import typer

from squall.datanode.cli import register

app = typer.Typer(add_completion=False)


@app.callback()
def _root() -> None:
    """A group with a callback, so `datanode` stays a subcommand (a lone command would not)."""


register(app)
app(["datanode", *sys.argv[1:]])
