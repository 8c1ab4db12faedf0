"""`python -m squall.master --data-dir D --port P`: the same as `squall master`."""

import typer

from squall.master.cli import register

app = typer.Typer(add_completion=False)
register(app)
app(["master", *__import__("sys").argv[1:]])
