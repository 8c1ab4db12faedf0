"""What a newcomer meets first: clean one-line messages for a bad schedule or policy, an
empty credential list that says so, a client that says what it waits for when the master
is down, and a clear error for a payload of the wrong type."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from squall.client import Client
from squall.client.cli import app as cli_app
from squall.common.errors import BadRequest, TransportError
from squall.master.http.app import create_master_app
from squall.master.service import MasterSettings
from tests.helpers import free_port, running_app

runner = CliRunner()


def test_a_bad_schedule_or_policy_is_one_clean_line() -> None:
    nobody = f"http://127.0.0.1:{free_port()}"  # refused before any request
    r = runner.invoke(cli_app, ["schedule", "set", "g#s", "--queue", "q", "--every", "-1",
                                "--master", nobody])
    assert r.exit_code == 2, r.output
    assert "invalid schedule: --every: Input should be greater than or equal to 1" in r.output
    assert "\\n" not in r.output and "pydantic" not in r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    r = runner.invoke(cli_app, ["policy", "set", "g#q", "--backoff-base", "-1",
                                "--master", nobody])
    assert r.exit_code == 2 and "invalid policy: --backoff-base:" in r.output, r.output
    assert "\\n" not in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_an_empty_credential_list_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                          ) -> None:
    monkeypatch.setenv("SQUALL_TOKEN", os.environ["SQUALL_TOKEN"])
    app = create_master_app(MasterSettings(data_dir=str(tmp_path / "m"),
                                           require_receipts=False))
    with running_app(app, lifespan="on") as url:
        r = runner.invoke(cli_app, ["auth", "list", "--master", url])
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("no credentials minted through this master"), r.stdout


def test_a_client_says_once_what_it_waits_for(caplog: pytest.LogCaptureFixture) -> None:
    """The master is not running: the client retries (it rides out a restart), and says so
    once on the squall.client logger instead of waiting silently."""
    nobody = f"http://127.0.0.1:{free_port()}"
    with caplog.at_level(logging.WARNING, logger="squall.client"), \
            Client(nobody, retries=3, retry_budget_s=5) as c, pytest.raises(TransportError):
        c.stats()
    said = [r.getMessage() for r in caplog.records if r.name == "squall.client"]
    assert len(said) == 1, said
    assert nobody.removeprefix("http://") in said[0] and "retrying: at most 3 times" in said[0]


def test_a_payload_of_the_wrong_type_is_a_clear_error() -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    with Client(nobody, retries=0) as c:
        with pytest.raises(BadRequest, match=r"not dict: encode it first, e\.g\. json\.dumps"):
            c.put("g#q", {"a": 1})  # type: ignore[arg-type]
        with pytest.raises(BadRequest, match="an iterable yields bytes, not int"):
            c.put("g#q", [b"a", 2])  # type: ignore[list-item]


def test_the_documented_client_signature_is_the_code() -> None:
    """docs/client.md's `Client(...)` line lists every argument with its real default."""
    import inspect
    import re

    from squall.client import AsyncClient

    doc = (Path(__file__).resolve().parent.parent / "docs" / "client.md").read_text()
    block = re.search(r"^Client\((.*?)\)\n", doc, re.S | re.M)
    assert block, "no Client(...) signature in docs/client.md"
    documented = {}
    for part in (p.strip() for p in block.group(1).replace("\n", " ").split(",")):
        if part and part != "*":
            name, _, default = part.partition("=")
            documented[name.strip()] = default.strip()
    for cls in (Client, AsyncClient):
        params = inspect.signature(cls.__init__).parameters
        actual = {n: repr(p.default) for n, p in params.items() if n != "self"}
        assert list(documented) == list(actual), (cls.__name__, list(documented))
        assert documented == actual, cls.__name__


def test_the_dashboard_escapes_what_the_cli_escapes() -> None:
    """dashboard.js's UNSAFE class is the CLI's (client/cli/common.py): one set of
    characters shown escaped, everywhere (the browser test checks the page applies it)."""
    import codecs
    import re

    from squall.client.cli import common

    js = (Path(__file__).resolve().parent.parent / "master" / "static" / "dashboard.js"
          ).read_text()
    m = re.search(r"^const UNSAFE = /(\[.*?\])/g;$", js, re.M)
    assert m, "no UNSAFE class in dashboard.js"
    assert codecs.decode(m.group(1), "unicode_escape") == common._UNSAFE.pattern
    assert common.clean("a\u202eb\x1bc\n") == "a\\u202eb\\x1bc\\n"
