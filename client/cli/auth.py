"""``squall auth``: mint, list and revoke credentials, and make keys.

``mint`` asks the master (with an admin credential from ``--token`` / ``SQUALL_TOKEN``), or,
with ``--key-file``, signs locally with that private auth key (to bootstrap the first admin
credential of a cluster, or for a machine without access to the master; it needs the
``cryptography`` package of the server extra). Output is plain
text (a credential on stdout, nothing else, so ``$(squall auth mint ...)`` works)."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import Annotated

import orjson
import typer

from squall.client.cli.common import MasterOpt, connect, fail
from squall.common.security import auth

app = typer.Typer(help="Credentials: mint, list, revoke; make auth keys.",
                  no_args_is_help=True)
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "y": 365 * 86400}


def parse_ttl(text: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdy]?)", text.strip())
    if not m:
        raise typer.BadParameter(f"{text!r}: use e.g. 3600, 90m, 12h, 30d, 1y")
    return float(m[1]) * _UNITS[m[2] or "s"]


@app.command("mint")
def mint(
    role: Annotated[list[str], typer.Option("--role", "-r", help="producer, consumer, admin, "
                                            "monitor or node (repeat for several)")],
    group: Annotated[list[str] | None, typer.Option("--group", "-g", help="limit to this "
                                                    "group (repeat; default: every group)")
                     ] = None,
    node: Annotated[str | None, typer.Option("--node", help="node id (role node)")] = None,
    ttl: Annotated[str, typer.Option("--ttl", help="lifetime: 3600, 90m, 12h, 30d, 1y")
                   ] = "30d",
    note: Annotated[str, typer.Option("--note", help="a note kept with its claims")] = "",
    key_file: Annotated[Path | None, typer.Option(
        "--key-file", help="sign locally with this private auth key file (the master's) "
        "instead of asking the master")] = None,
    sqs: Annotated[bool, typer.Option(
        "--sqs", help="an SQS access key instead: prints AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY lines for the SQS endpoint (docs/sqs.md)")] = False,
    import_key: Annotated[str | None, typer.Option(
        "--import-sqs-key", help="with --sqs: import this ID:SECRET as the access key "
        "instead of minting one (keys a test suite or an application already uses)")
    ] = None,
    master: MasterOpt = "",
) -> None:
    """Mint a credential and print it (once: the master keeps only its claims)."""
    ttl_s = parse_ttl(ttl)
    if sqs:
        if key_file is not None:
            fail("--sqs keys are minted by the master only (no --key-file)", 2)
        pair = None
        if import_key is not None:
            akid, sep, secret = import_key.partition(":")
            if not sep:
                fail("--import-sqs-key takes ID:SECRET", 2)
            pair = (akid, secret)
        with connect(master or None) as c:
            ans = c.mint_credential(*role, groups=group or None, node=node, ttl_secs=ttl_s,
                                    note=note, sqs=True, sqs_key=pair)
        sys.stdout.write(f"export AWS_ACCESS_KEY_ID={ans['access_key_id']}\n"
                         f"export AWS_SECRET_ACCESS_KEY={ans['secret_access_key']}\n")
        until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ans["expires_at"]))
        sys.stderr.write(f"id {ans['id']} (squall auth revoke {ans['id']}), expires {until}\n")
        return
    if key_file is not None:
        try:
            keys = auth.parse_keys(key_file.read_bytes())
            cred = auth.mint(keys, role, ttl_s, time.time(), groups=group or None, node=node)
        except (OSError, ValueError, RuntimeError) as e:
            fail(str(e), 2)
        sys.stdout.write(cred + "\n")
        return
    with connect(master or None) as c:
        ans = c.mint_credential(*role, groups=group or None, node=node, ttl_secs=ttl_s,
                                note=note)
    sys.stdout.write(ans["credential"] + "\n")
    until = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(ans["expires_at"]))
    sys.stderr.write(f"id {ans['id']}, expires {until}\n")


@app.command("list")
def list_(master: MasterOpt = "",
          as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """Credentials minted through the master: id, roles, groups, expiry, revoked."""
    with connect(master or None) as c:
        creds = c.credentials()
    if as_json:
        sys.stdout.write(orjson.dumps(creds, option=orjson.OPT_INDENT_2).decode() + "\n")
        return
    if not creds:
        sys.stdout.write("no credentials minted through this master (credentials made from "
                         "the auth key directly are not listed)\n")
        return
    for x in creds:
        state = "revoked" if x["revoked"] else "expired" if x["expired"] else "valid"
        groups = ",".join(x["groups"]) if x["groups"] is not None else "*"
        exp = time.strftime("%Y-%m-%d", time.gmtime(x["expires_at"]))
        line = f"{x['id']}  {','.join(x['roles'])}  groups={groups}  until={exp}  {state}"
        if x.get("node"):
            line += f"  node={x['node']}"
        if x.get("note"):
            line += f"  note={x['note']!r}"
        sys.stdout.write(line.encode("ascii", "backslashreplace").decode() + "\n")


@app.command("revoke")
def revoke(what: Annotated[str, typer.Argument(help="credential id, or the credential")],
           master: MasterOpt = "") -> None:
    """Revoke a credential: the master refuses it at once, data nodes from their next
    heartbeat."""
    cid = auth.credential_id(what) if auth.is_credential(what) else what
    if not cid:
        fail("not a credential or credential id", 2)
    with connect(master or None) as c:
        c.revoke_credential(cid)
    sys.stdout.write(f"revoked {cid}\n")


@app.command("keygen")
def keygen(path: Annotated[Path, typer.Argument(help="key file to write")],
           rotate: Annotated[bool, typer.Option(
               "--rotate", help="put a new auth key first in an existing file, keeping the "
               "old ones (they still verify; drop them once re-minted)")] = False,
           cluster: Annotated[bool, typer.Option(
               "--cluster", help="a cluster key (random bytes shared by the master and the "
               "data nodes) instead of an auth key")] = False) -> None:
    """Write a new auth key (an Ed25519 private key: the master's, it mints credentials;
    give the data nodes its public half, `squall auth pubkey`), or with --cluster a random
    cluster key; readable by its owner only."""
    old = path.read_bytes() if rotate and path.exists() else b""
    if path.exists() and not rotate:
        fail(f"{path} exists; use --rotate to add a new key in front", 2)
    if cluster:
        if rotate:
            fail("a cluster key is a single key: rotate it by restarting the cluster", 2)
        auth.write_secret(str(path), auth.new_key() + b"\n")
    else:
        try:
            auth.write_secret(str(path), auth.new_private_key() + b"\n" + old)
            auth.parse_keys(path.read_bytes())
        except (ValueError, RuntimeError) as e:
            fail(str(e), 2)
    sys.stdout.write(f"wrote {path}\n")


@app.command("pubkey")
def pubkey(path: Annotated[Path, typer.Argument(help="the master's auth key file")]) -> None:
    """Print the public keys of an auth key file (for the data nodes'
    --auth-public-key-file): they verify credentials but cannot mint them."""
    try:
        keys = auth.parse_keys(path.read_bytes())
    except (OSError, ValueError, RuntimeError) as e:
        fail(str(e), 2)
    sys.stdout.write(keys.public_text().decode())


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="auth")
