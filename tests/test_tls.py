"""TLS on every hop: a master and data nodes serving HTTPS with mutual TLS (node to master,
node to node, client to both), certificates made by trustme. The end-to-end path (put with
a replicated payload, lease, read the payload (the client's and the stdlib fast reader's),
done) works; a data node whose certificate
comes from another CA is refused by the master."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from squall.client import Client
from squall.common.errors import TransportError
from squall.common.transport.adapters import SyncTransport
from tests import blobhttp
from tests.helpers import ADMIN, DataNodeProcess, MasterProcess, start_all, wait_for

KEY = "tls-test-cluster-key-0123456789abcdef"


class Certs:
    def __init__(self, tmp: Path) -> None:
        self.ca = trustme.CA()
        self.ca_file = tmp / "ca.pem"
        self.ca.cert_pem.write_to_path(str(self.ca_file))
        self.tmp = tmp

    def issue(self, name: str, ca: trustme.CA | None = None) -> str:
        """A PEM file with the key and certificate chain, valid for 127.0.0.1."""
        cert = (ca or self.ca).issue_cert("127.0.0.1", "localhost", common_name=name)
        path = self.tmp / f"{name}.pem"
        cert.private_key_and_cert_chain_pem.write_to_path(str(path))
        return str(path)

    def context(self, pem: str) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        ctx.load_cert_chain(pem)
        return ctx


def _tls_args(pem: str, ca: Path) -> list[str]:
    return ["--tls-cert", pem, "--tls-key", pem, "--tls-ca", str(ca),
            "--tls-require-client-cert"]


class TLSServer:
    ctx: ssl.SSLContext

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"  # type: ignore[attr-defined]

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:  # type: ignore[attr-defined]
            raise TimeoutError("exited")
        return httpx.get(self.url + "/readyz", timeout=2.0, verify=self.ctx).status_code == 200


class TLSMaster(TLSServer, MasterProcess):
    pass


class TLSNode(TLSServer, DataNodeProcess):
    pass


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    return Certs(tmp_path)


@pytest.fixture
def cluster(tmp_path: Path, certs: Certs) -> Iterator[tuple[TLSMaster, list[TLSNode], str]]:
    client_pem = certs.issue("client")
    env = {"SQUALL_CLUSTER_KEY": KEY}
    m = TLSMaster(str(tmp_path / "master"), env=env, extra=[
        "--heartbeat-interval-s", "0.3", "--replication-factor", "2",
        *_tls_args(certs.issue("master"), certs.ca_file)])
    m.ctx = certs.context(client_pem)
    m.start(timeout=90)
    nodes = []
    for i in range(2):
        pem = certs.issue(f"node{i}")
        n = TLSNode(str(tmp_path / f"dn{i}"), env=env, extra=[
            "--master", m.url, "--heartbeat-interval-s", "0.3",
            *_tls_args(pem, certs.ca_file)])
        n.ctx = certs.context(client_pem)
        nodes.append(n)
    try:
        start_all(nodes, timeout=90)
        yield m, nodes, client_pem
    finally:
        for p in [*nodes, m]:
            p.stop()


def _alive(m: TLSMaster) -> int:
    info = httpx.get(m.url + "/v1/cluster", headers=ADMIN, verify=m.ctx, timeout=5).json()
    return sum(1 for n in info["nodes"] if n["state"] == "alive")


def test_put_lease_done_over_mutual_tls(cluster: tuple[TLSMaster, list[TLSNode], str],
                                        certs: Certs, monkeypatch: pytest.MonkeyPatch) -> None:
    m, _nodes, client_pem = cluster
    wait_for(lambda: _alive(m) == 2, timeout=30, what="both nodes alive over TLS")
    monkeypatch.setenv("SQUALL_TLS_CA", str(certs.ca_file))
    monkeypatch.setenv("SQUALL_TLS_CERT", client_pem)
    monkeypatch.setenv("SQUALL_TLS_KEY", client_pem)
    payload = b"over TLS " * 1000
    with Client(m.url) as c:
        c.put("tls#q", payload, pid="a")
        [t] = c.lease("tls#q", max_tasks=1)
        assert t.payload_ref is not None and len(t.payload_ref.replicas) == 2
        assert all(u.startswith("https://") for u in t.payload_ref.replicas)
        assert t.payload() == payload
        ref = t.payload_ref
        # the engine speaks TLS to the data nodes too, with the client certificate
        def engine(ctx: ssl.SSLContext) -> httpx.Client:
            return httpx.Client(transport=SyncTransport(ctx), timeout=10)

        with engine(certs.context(client_pem)) as d:
            for node in ref.replicas:
                assert blobhttp.get_blob(d, node, ref.blob_id, ref.token) == payload
        with engine(ssl.create_default_context(cafile=str(certs.ca_file))
                    ) as d, pytest.raises(TransportError):
            blobhttp.get_blob(d, ref.replicas[0], ref.blob_id, ref.token)  # no client cert
        with engine(ssl.create_default_context()) as d, pytest.raises(TransportError):
            blobhttp.get_blob(d, ref.replicas[0], ref.blob_id, ref.token)  # unknown CA
        t.done()
        assert c.stats("tls#q").completed == 1
    # without a client certificate the master refuses the connection
    with pytest.raises(httpx.HTTPError):
        httpx.get(m.url + "/healthz", timeout=5,
                  verify=ssl.create_default_context(cafile=str(certs.ca_file)))


def test_a_node_with_a_wrong_certificate_is_refused(
        cluster: tuple[TLSMaster, list[TLSNode], str], certs: Certs, tmp_path: Path) -> None:
    m, _, _client_pem = cluster
    wait_for(lambda: _alive(m) == 2, timeout=30, what="both nodes alive over TLS")
    rogue_ca = trustme.CA()
    rogue_ca_file = tmp_path / "rogue-ca.pem"
    rogue_ca.cert_pem.write_to_path(str(rogue_ca_file))
    pem = certs.issue("rogue", ca=rogue_ca)
    # trusts the real CA (to verify the master) but presents a certificate of another CA
    n = TLSNode(str(tmp_path / "rogue"), env={"SQUALL_CLUSTER_KEY": KEY}, extra=[
        "--master", m.url, "--heartbeat-interval-s", "0.3", "--tls-cert", pem, "--tls-key", pem,
        "--tls-ca", str(certs.ca_file)])
    n.ctx = ssl.create_default_context(cafile=str(rogue_ca_file))  # no client certificate
    n.start(timeout=90)
    try:
        def failures() -> float:
            text = httpx.get(n.url + "/metrics", headers=ADMIN, verify=n.ctx, timeout=5).text
            for line in text.splitlines():
                if line.startswith("squall_datanode_heartbeat_failures_total"):
                    return float(line.split()[-1])
            return 0.0

        wait_for(lambda: failures() >= 3, timeout=30, what="the rogue node's beats to fail")
        assert _alive(m) == 2
        info = httpx.get(m.url + "/v1/cluster", headers=ADMIN, verify=m.ctx, timeout=5).json()
        assert len(info["nodes"]) == 2
    finally:
        n.stop()
