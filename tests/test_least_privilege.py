"""Least privilege, as an attacker on the same host would try it, against real processes: a
master started without keys makes its own (a heartbeat signed with published key material
is refused), data folders and files are their owner's alone (and a shared data folder is
refused), a data node's key material cannot mint a credential the master accepts, the
monitor role reads metrics and nothing else, the OpenAPI document names the bearer scheme,
and a batch-get without a token is refused before its body is read."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from squall.common.security import auth, tokens
from tests.dn_kit import ENV as CLUSTER_ENV
from tests.dn_kit import KEY as CLUSTER_KEY
from tests.dn_kit import tok
from tests.helpers import (
    ADMIN,
    TEST_PUBLIC_KEY,
    DataNodeProcess,
    MasterProcess,
    free_port,
    mint,
    start_all,
    wait_for,
)

BEAT = {"node_id": "evil", "address": "http://127.0.0.1:9", "started_at": 1.0, "seq": 0,
        "capacity_bytes": 909 << 40, "used_bytes": 0, "free_bytes": 909 << 40,
        "blob_count": 0, "full": True}


def _no_key_env() -> dict[str, str]:
    """The environment of a master started as the docs show: no key at all."""
    return {k: v for k, v in os.environ.items()
            if k not in ("SQUALL_CLUSTER_KEY", "SQUALL_CLUSTER_KEY_FILE", "SQUALL_AUTH_KEY",
                         "SQUALL_AUTH_KEY_FILE")}


class _Master(MasterProcess):
    def launch(self) -> None:  # without the tests' cluster key in its environment
        if not self.fixed_port:
            self.port = free_port()
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT,
                                     env=_no_key_env())
        log.close()

    @property
    def admin(self) -> dict[str, str]:
        """The admin credential it made next to its own auth key."""
        cred = (Path(self.data_dir) / "admin.credential").read_text().strip()
        return {"Authorization": f"Bearer {cred}"}


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[MasterProcess, DataNodeProcess]]:
    base = tmp_path_factory.mktemp("lp")
    m = _Master(str(base / "master"))
    d = DataNodeProcess(str(base / "node"), env=CLUSTER_ENV)
    start_all([m, d])
    try:
        yield m, d
    finally:
        for p in (d, m):
            p.stop()


def test_a_master_without_a_key_makes_its_own_and_refuses_published_ones(
        servers: tuple[MasterProcess, DataNodeProcess]) -> None:
    m, _ = servers
    key_file = Path(m.data_dir) / "cluster.key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    made = key_file.read_bytes().strip()
    assert made not in tokens.PUBLISHED_KEYS and len(made) >= 32
    exp = time.time() + 60
    for published in tokens.PUBLISHED_KEYS:
        forged = tokens.sign(published, "heartbeat", ["evil"], exp)
        r = httpx.post(m.url + "/v1/nodes/heartbeat", json=BEAT,
                       headers={"Authorization": f"Bearer {forged}"}, timeout=10)
        assert r.status_code == 401, r.text
    nodes = httpx.get(m.url + "/v1/cluster", headers=m.admin, timeout=10).json()
    assert "evil" not in str(nodes)
    # the key it made does sign (what a data node given a copy of it does)
    good = tokens.sign(made, "heartbeat", ["evil"], exp)
    r = httpx.post(m.url + "/v1/nodes/heartbeat", json=BEAT,
                   headers={"Authorization": f"Bearer {good}"}, timeout=10)
    assert r.status_code == 200, r.text


def _modes(root: str) -> dict[str, int]:
    out = {}
    for d, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            p = os.path.join(d, name)
            out[os.path.relpath(p, root)] = stat.S_IMODE(os.lstat(p).st_mode)
    out["."] = stat.S_IMODE(os.stat(root).st_mode)
    return out


def test_data_folders_and_files_are_private(
        servers: tuple[MasterProcess, DataNodeProcess]) -> None:
    """What `nobody` could read before: the master's index and WAL, a data node's blobs."""
    m, d = servers
    r = httpx.post(m.url + "/v1/groups/g/queues/q/tasks", json={"tasks": [{"pid": "p1"}]},
                   headers=m.admin, timeout=10)
    assert r.status_code == 200, r.text
    r = httpx.put(f"{d.url}/v1/blobs/secret-1", content=b"a secret payload",
                  headers={"Authorization": f"Bearer {tok('write', 'secret-1')}"}, timeout=10)
    assert r.status_code == 200, r.text
    for root, must in ((m.data_dir, ("index/data.mdb", "wal", "cluster.key", "auth.key",
                                     "admin.credential", "lease.key", "auth.pub")),
                       (d.data_dir, ("node_id",))):
        modes = _modes(root)
        for name in must:
            assert any(k == name or k.startswith(name + "/") for k in modes), (name, modes)
        assert any(k.endswith(".mdb") for k in modes), modes
        shared = {k: oct(v) for k, v in modes.items() if v & 0o077}
        assert not shared, f"readable by others in {root}: {shared}"
        for k, v in modes.items():
            if os.path.isdir(os.path.join(root, k)):
                assert v == 0o700, (k, oct(v))
            else:
                assert v == 0o600, (k, oct(v))
    assert any(k.startswith("wal/") for k in _modes(m.data_dir))


def _exits(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    p = subprocess.run(argv, capture_output=True, timeout=60, env=env)
    return p.returncode, (p.stdout + p.stderr).decode(errors="replace")


@pytest.mark.parametrize("role", ["master", "datanode"])
def test_a_shared_data_folder_is_refused(tmp_path: Path, role: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o755)  # the old default: other users can enter and read
    env = {**os.environ, **CLUSTER_ENV}
    argv = [sys.executable, "-m", f"squall.{role}", "--data-dir", str(data), "--port",
            str(free_port())]
    code, out = _exits(argv, env)
    assert code != 0 and "refusing to start" in out and "0755" in out, out
    assert "--allow-shared-data-dir" in out
    assert not os.listdir(data)  # nothing was written there


def test_the_flag_allows_a_shared_data_folder(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    os.chmod(data, 0o750)
    p = DataNodeProcess(str(data), extra=["--allow-shared-data-dir"], env=CLUSTER_ENV)
    p.start()
    try:
        assert stat.S_IMODE((data / "node_id").stat().st_mode) == 0o600  # files still private
    finally:
        p.stop()


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def test_a_data_nodes_keys_cannot_mint_a_credential_the_master_accepts(
        servers: tuple[MasterProcess, DataNodeProcess]) -> None:
    """Everything a data node holds: the cluster key and the public auth key."""
    m, _ = servers
    pub = (Path(m.data_dir) / "auth.pub").read_bytes()
    public = auth.parse_keys(pub)
    assert not public.can_sign
    with pytest.raises(ValueError, match="only verify"):
        auth.mint(public, ["admin"], 60, time.time())
    with pytest.raises(ValueError, match="private"):  # a data node refuses a private key
        auth.load_public_keys(None, {auth.PUBLIC_KEY_ENV: auth.new_private_key().decode()})
    now = time.time()
    kid = next(iter(public.public))
    claims = orjson.dumps({"id": "A" * 22, "r": ["admin"], "iat": now, "exp": now + 600,
                           "k": kid})
    forged = []
    for key in (CLUSTER_KEY, public.public_raw[kid], pub.strip()):
        for domain in (b"squall-credential-v2\n", b"squall-credential-v1\n"):
            mac = hmac.new(key, domain + claims, hashlib.sha256).digest()
            forged += [f"sq2.{_b64(claims)}.{_b64(mac)}", f"sq1.{_b64(claims)}.{_b64(mac)}",
                       f"sq2.{_b64(claims)}.{_b64(mac + mac)}"]  # 64 bytes, as a signature
    forged.append(tokens.sign(CLUSTER_KEY, "heartbeat", ["x"], now + 60))  # a node token
    for cred in forged:
        r = httpx.post(m.url + "/v1/auth/credentials", json={"roles": ["admin"]},
                       headers={"Authorization": f"Bearer {cred}"}, timeout=10)
        assert r.status_code == 401, (cred[:40], r.text)
    r = httpx.post(m.url + "/v1/auth/credentials", json={"roles": ["monitor"]},
                   headers=m.admin, timeout=10)
    assert r.status_code == 200, r.text  # the master itself mints
    assert auth.verify(public, r.json()["credential"], time.time()).roles == {"monitor"}


def test_monitor_reads_metrics_and_changes_nothing(
        servers: tuple[MasterProcess, DataNodeProcess]) -> None:
    m, d = servers
    r = httpx.post(m.url + "/v1/auth/credentials", json={"roles": ["monitor"]},
                   headers=m.admin, timeout=10)
    mon = {"Authorization": f"Bearer {r.json()['credential']}"}
    node_mon = {"Authorization": f"Bearer {mint('monitor')}"}  # the node's test keys
    r = httpx.post(m.url + "/v1/groups/g/queues/q/tasks", json={"tasks": [{"pid": "m1"}]},
                   headers=m.admin, timeout=10)
    assert r.status_code == 200, r.text
    for url, h in ((m.url, mon), (d.url, node_mon)):
        r = httpx.get(url + "/metrics", headers=h, timeout=10)
        assert r.status_code == 200 and "# TYPE" in r.text, (url, r.text[:200])
    for path in ("/v1/overview", "/v1/cluster/stats", "/v1/queues",
                 "/v1/groups/g/queues/q"):
        assert httpx.get(m.url + path, headers=mon, timeout=10).status_code == 200, path
    for method, path, body in (
            ("POST", "/v1/auth/credentials", {"roles": ["admin"]}),
            ("DELETE", "/v1/groups/g/queues/q", None),
            ("POST", "/v1/groups/g/queues/q/tasks", {"tasks": [{"pid": "x"}]}),
            ("POST", "/v1/groups/g/queues/q/lease", {}),
            ("GET", "/v1/groups/g/queues/q/tasks", None),  # hands out read tokens
            ("POST", "/v1/nodes/dn-1/decommission", {})):
        r = httpx.request(method, m.url + path, json=body, headers=mon, timeout=10)
        assert r.status_code == 403, (method, path, r.text)
    stats = httpx.get(m.url + "/v1/groups/g/queues/q", headers=m.admin, timeout=10).json()
    assert stats  # the queue is still there


def test_openapi_declares_the_bearer_scheme(
        servers: tuple[MasterProcess, DataNodeProcess]) -> None:
    for url in (s.url for s in servers):
        doc = httpx.get(url + "/openapi.json", timeout=10).json()
        assert doc["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
        assert doc["security"] == [{"bearer": []}]
        assert doc["paths"]["/healthz"]["get"]["security"] == []  # public routes say so
        assert "security" not in doc["paths"]["/metrics"]["get"]


def test_batch_get_without_a_token_is_refused_before_its_body(
        servers: tuple[MasterProcess, DataNodeProcess]) -> None:
    """The head announces a 1 MB body that never comes: the answer is 401 at once (a node
    that read the body first would wait for it, then answer 408)."""
    _, d = servers
    port = int(d.url.rsplit(":", 1)[1])
    for authz in (b"", b"Authorization: Bearer sqt1.forged.token\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /v1/blobs:batch-get HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 1000000\r\n"
                      + authz + b"\r\n" + b'{"blob_ids": ["a"')
            t0 = time.monotonic()
            got = b""
            while b"\r\n\r\n" not in got and time.monotonic() - t0 < 10:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
            assert got.startswith(b"HTTP/1.1 401"), got[:200]
    # with a token in the header, the body's tokens are checked as before
    r = httpx.post(d.url + "/v1/blobs:batch-get", json={"blob_ids": ["a"]},
                   headers={"Authorization": f"Bearer {tok('read', 'a')}"}, timeout=10)
    assert r.status_code == 200, r.text


def test_a_node_credential_reports_its_expiry(tmp_path: Path) -> None:
    cred = mint("node", node="dn-exp", ttl_s=3 * 86400.0)
    f = tmp_path / "node.credential"
    f.write_text(cred + "\n")
    p = DataNodeProcess(str(tmp_path / "n"), extra=["--node-credential-file", str(f)],
                        env={**CLUSTER_ENV, "SQUALL_AUTH_PUBLIC_KEY": TEST_PUBLIC_KEY.decode()})
    p.start()
    try:
        text = httpx.get(p.url + "/metrics", headers=ADMIN, timeout=10).text
        line = next(x for x in text.splitlines()
                    if x.startswith("squall_datanode_credential_expiry_seconds "))
        left = float(line.split()[1])
        assert 2 * 86400 < left <= 3 * 86400, line
        log = wait_for(lambda: Path(p.log_path).read_text(), 10, what="the node's log")
        assert "expires in" in log
    finally:
        p.stop()
