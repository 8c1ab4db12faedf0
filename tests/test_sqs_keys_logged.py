"""SQS access keys are logged (config records), so a master that restarts from its WAL
and index still answers a data node's lookup of a minted and of an imported key; a key
minted by an older master into ``sqs-keys.json`` is still honoured."""

from __future__ import annotations

import os

import orjson

from squall.common.clock import ManualClock
from squall.common.security import tokens
from squall.master.service import MasterSettings
from squall.master.sqskeys import KEYS_FILE, signing_key
from tests.helpers import asgi_master

KEY = b"sqs-keys-logged-test-key-0123456789"


async def test_keys_survive_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = MasterSettings(data_dir=str(tmp_path / "m"), cluster_key=KEY)
    clock = ManualClock()
    async with asgi_master(settings, clock) as (c, m):
        r = await c.post("/v1/auth/sqs-keys", json={"roles": ["producer"]})
        assert r.status_code == 200, r.text
        minted = r.json()
        r = await c.post("/v1/auth/sqs-keys", json={
            "roles": ["admin"], "access_key_id": "FOOBARKEY",
            "secret_access_key": "FOOBARSECRET"})
        assert r.status_code == 200, r.text
        imported = r.json()
        assert ("", minted["id"]) in m.index.sqs_keys
        again = await c.post("/v1/auth/sqs-keys", json={
            "roles": ["admin"], "access_key_id": "FOOBARKEY", "secret_access_key": "x" * 8})
        assert again.status_code == 400, again.text
    assert not os.path.exists(os.path.join(settings.data_dir, KEYS_FILE))
    node = tokens.sign(KEY, "heartbeat", ["dn"], clock.now() + 600)
    async with asgi_master(settings, clock) as (c, m):
        for k in (minted, imported):
            r = await c.post("/v1/nodes/sqs-key", headers={"Authorization": f"Bearer {node}"},
                             json={"node_id": "dn", "access_key_id": k["access_key_id"],
                                   "date": "20260101", "region": "us-east-1"})
            assert r.status_code == 200, r.text
            assert r.json()["signing_key"] == signing_key(
                k["secret_access_key"], "20260101", "us-east-1").hex()
            assert r.json()["principal"]["id"] == k["id"]


async def test_keys_of_an_older_master_are_still_read(tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = MasterSettings(data_dir=str(tmp_path / "m"), cluster_key=KEY)
    os.makedirs(settings.data_dir)
    clock = ManualClock()
    old = {"old-id": {"id": "old-id", "roles": ["admin"], "groups": None,
                      "issued_at": 1.0, "expires_at": clock.now() + 3600, "note": "",
                      "akid": "OLDKEY01", "secret": "OLDSECRET"}}
    with open(os.path.join(settings.data_dir, KEYS_FILE), "wb") as f:
        f.write(orjson.dumps(old))
    node = tokens.sign(KEY, "heartbeat", ["dn"], clock.now() + 600)
    async with asgi_master(settings, clock) as (c, _):
        r = await c.post("/v1/nodes/sqs-key", headers={"Authorization": f"Bearer {node}"},
                         json={"node_id": "dn", "access_key_id": "OLDKEY01",
                               "date": "20260101", "region": "us-east-1"})
        assert r.status_code == 200, r.text
        assert r.json()["signing_key"] == signing_key("OLDSECRET", "20260101",
                                                      "us-east-1").hex()
