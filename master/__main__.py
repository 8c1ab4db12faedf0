"""`python -m squall.master --data-dir D --port P`: the same as `squall master`."""

import sys

import typer

from squall.master.cli import register

app = typer.Typer(add_completion=False)


@app.callback()
def _root() -> None:
    """A group with a callback, so `master` stays a subcommand (a lone command would not)."""


register(app)
app(["master", *sys.argv[1:]])
