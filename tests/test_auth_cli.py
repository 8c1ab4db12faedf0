"""`squall auth` (mint, list, revoke, keygen), `squall dev`'s keys, and the servers'
refusal to listen beyond loopback without keys."""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from squall.client.cli import app as cli_app
from squall.common.security import auth
from squall.common.security.tokens import PUBLISHED_KEYS
from squall.master.http.app import create_master_app
from squall.master.service import MasterSettings
from tests.helpers import TEST_AUTH_KEY, running_app

runner = CliRunner()


def test_keygen_rotate_and_offline_mint(tmp_path: Path) -> None:
    key = tmp_path / "auth.key"
    assert runner.invoke(cli_app, ["auth", "keygen", str(key)]).exit_code == 0
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    first = auth.parse_keys(key.read_bytes())
    assert runner.invoke(cli_app, ["auth", "keygen", str(key)]).exit_code == 2  # no clobber
    assert runner.invoke(cli_app, ["auth", "keygen", "--rotate", str(key)]).exit_code == 0
    keys = auth.parse_keys(key.read_bytes())
    assert len(keys.public) == 2 and first.signer_id in keys.public
    assert keys.signer_id != first.signer_id  # the new key signs, the old one verifies
    r = runner.invoke(cli_app, ["auth", "mint", "--role", "producer", "--group", "g",
                                "--ttl", "2h", "--key-file", str(key)])
    assert r.exit_code == 0, r.output
    c = auth.verify(keys.verifier(), r.stdout.strip(), time.time())
    assert c.roles == {"producer"} and c.groups == {"g"}
    assert 7100 < c.expires_at - c.issued_at <= 7200
    r = runner.invoke(cli_app, ["auth", "mint", "--role", "root", "--key-file", str(key)])
    assert r.exit_code == 2


def test_mint_list_revoke_through_the_master(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # `squall --token` sets SQUALL_TOKEN for the command: restore it afterwards
    monkeypatch.setenv("SQUALL_TOKEN", os.environ["SQUALL_TOKEN"])
    app = create_master_app(MasterSettings(data_dir=str(tmp_path / "m"),
                                           require_receipts=False))
    with running_app(app, lifespan="on") as url:
        r = runner.invoke(cli_app, ["auth", "mint", "-r", "consumer", "--note", "[b]x[/b]",
                                    "--master", url])
        assert r.exit_code == 0, r.output
        cred = r.stdout.strip()
        cid = auth.credential_id(cred)
        r = runner.invoke(cli_app, ["auth", "list", "--master", url])
        assert r.exit_code == 0 and cid in r.stdout and "[b]x[/b]" in r.stdout
        assert "valid" in r.stdout
        r = runner.invoke(cli_app, ["auth", "revoke", cred, "--master", url])
        assert r.exit_code == 0 and cid in r.stdout
        r = runner.invoke(cli_app, ["auth", "list", "--master", url])
        assert "revoked" in r.stdout
        # the revoked credential is refused; a wrong one explains what to do
        r = runner.invoke(cli_app, ["--token", cred, "auth", "list", "--master", url])
        assert r.exit_code == 1 and "revoked" in r.output and "SQUALL_TOKEN" in r.output


def test_squall_dev_makes_its_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from squall.client.cli.dev import DevCluster

    for v in ("SQUALL_AUTH_KEY", "SQUALL_AUTH_KEY_FILE", "SQUALL_CLUSTER_KEY",
              "SQUALL_CLUSTER_KEY_FILE"):
        monkeypatch.delenv(v, raising=False)
    c = DevCluster(tmp_path / "dev", 7070, 0)
    keys = tmp_path / "dev" / "keys"
    for f in ("auth.key", "cluster.key", "admin.credential"):
        assert stat.S_IMODE(os.stat(keys / f).st_mode) == 0o600, f
    assert c.env["SQUALL_AUTH_KEY_FILE"] == str(keys / "auth.key")
    assert c.env["SQUALL_CLUSTER_KEY_FILE"] == str(keys / "cluster.key")
    assert (keys / "cluster.key").read_bytes().strip() not in PUBLISHED_KEYS
    # the data nodes get the public half only: it verifies the admin credential
    assert c.env["SQUALL_AUTH_PUBLIC_KEY_FILE"] == str(keys / "auth.pub")
    pub = auth.load_public_keys(str(keys / "auth.pub"))
    assert pub is not None and not pub.can_sign
    cred = auth.verify(pub, c.admin, time.time())
    assert cred.roles == {"admin"}
    again = DevCluster(tmp_path / "dev", 7070, 0)  # a restart keeps the keys
    assert again.admin == c.admin


def test_servers_refuse_open_binds_without_keys(monkeypatch: pytest.MonkeyPatch,
                                                caplog: pytest.LogCaptureFixture) -> None:
    auth.check_bind("127.0.0.1", False, False, False, "master")  # loopback: fine
    auth.check_bind("::1", False, False, False, "master")
    auth.check_bind("0.0.0.0", True, True, False, "master")  # keys configured: fine
    for cluster_key, auth_key in ((False, False), (True, False), (False, True)):
        with pytest.raises(SystemExit, match="refusing"):
            auth.check_bind("0.0.0.0", cluster_key, auth_key, False, "datanode")
    with caplog.at_level(logging.WARNING):
        auth.check_bind("10.1.2.3", False, False, True, "master")
    assert "INSECURE" in caplog.text
    monkeypatch.delenv("SQUALL_CLUSTER_KEY", raising=False)
    assert not auth.cluster_key_configured(None)
    for published in PUBLISHED_KEYS:
        assert not auth.cluster_key_configured(None, {"SQUALL_CLUSTER_KEY": published.decode()})
    assert auth.cluster_key_configured("/some/file")
    # the command itself stops before serving
    # the commands themselves stop before serving: a data node without the cluster key (on
    # any address), a master or data node given published key material
    from squall.datanode.cli import register as register_datanode
    from squall.master.cli import register

    app = typer.Typer()
    app.callback()(lambda: None)
    register(app)
    register_datanode(app)
    monkeypatch.setenv("SQUALL_AUTH_KEY", TEST_AUTH_KEY.decode())
    monkeypatch.delenv("SQUALL_CLUSTER_KEY_FILE", raising=False)
    mask = os.umask(0o022)
    try:
        r = runner.invoke(app, ["datanode", "--data-dir", "/nonexistent/x"])
        out = str(r.exception or r.output)
        assert r.exit_code != 0 and "refusing to start" in out and "cluster key" in out, out
        monkeypatch.setenv("SQUALL_CLUSTER_KEY", sorted(PUBLISHED_KEYS)[0].decode())
        for role in ("master", "datanode"):
            r = runner.invoke(app, [role, "--data-dir", "/nonexistent/x"])
            out = str(r.exception or r.output)
            assert r.exit_code != 0 and "published" in out, (role, out)
    finally:
        os.umask(mask)
