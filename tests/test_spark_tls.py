"""Spark against a cluster served over mutual TLS with a private CA, authentication on, from
a Spark application whose driver, JVM and executors have no ``SQUALL_*`` environment: the
master's URL, the credential and the TLS material come from Spark conf and data source
options (``client/spark/_conn.py``). Writes, reads and ``run_stage`` go through the
client's batch reads (counted on the data nodes: no read falls back to one request per
task), and no credential shows in a plan, the UI's environment or the logs.

The application runs in its own process (``tests/spark_tls_job.py``): a JVM started by
this process would inherit its environment (``tests/helpers.py`` sets ``SQUALL_TOKEN``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from squall.client import Client
from squall.client.spark._conn import Conn, resolve
from tests.helpers import mint, start_all, wait_for
from tests.test_tls import Certs, TLSMaster, TLSNode, _alive

KEY = "tls-spark-cluster-key-0123456789abcdef"
START_S = 120.0
N = 600


def _tls_args(pem: str, ca: Path) -> list[str]:
    return ["--tls-cert", pem, "--tls-key", pem, "--tls-ca", str(ca),
            "--tls-require-client-cert"]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The cluster, and the job's result, its output and the credentials it was given."""
    tmp = tmp_path_factory.mktemp("spark-tls")
    certs = Certs(tmp)
    leaf = certs.ca.issue_cert("127.0.0.1", "localhost", common_name="spark-client")
    cert_file, key_file = tmp / "client-cert.pem", tmp / "client-key.pem"
    cert_file.write_bytes(b"".join(p.bytes() for p in leaf.cert_chain_pems))
    key_file.write_bytes(leaf.private_key_pem.bytes())
    client_pem = certs.issue("client")
    env = {"SQUALL_CLUSTER_KEY": KEY}
    beat = ["--heartbeat-interval-s", "0.3"]
    m = TLSMaster(str(tmp / "master"), env=env, extra=[
        *beat, "--replication-factor", "2", *_tls_args(certs.issue("master"), certs.ca_file)])
    m.ctx = certs.context(client_pem)
    m.start(START_S)
    nodes: list[TLSNode] = []
    try:
        for i in range(2):
            node = TLSNode(str(tmp / f"dn{i}"), env=env, extra=[
                "--master", m.url, *beat, *_tls_args(certs.issue(f"node{i}"), certs.ca_file)])
            node.ctx = certs.context(client_pem)
            nodes.append(node)
        start_all(nodes, START_S)
        wait_for(lambda: _alive(m) == 2, START_S, what="both nodes alive over TLS")
        tokens = {"conf_token": mint("admin"), "option_token": mint("admin")}
        args = {"master": m.url, "nodes": [n.url for n in nodes], "ca": str(certs.ca_file),
                "cert": str(cert_file), "key_file": str(key_file), "n": N,
                "scratch": str(tmp / "spark-local"), **tokens}
        (tmp / "args.json").write_text(json.dumps(args))
        clean = {k: v for k, v in os.environ.items() if not k.startswith("SQUALL_")}
        root = Path(__file__).resolve().parent.parent
        p = subprocess.run([sys.executable, "-m", "tests.spark_tls_job",
                            str(tmp / "args.json")], cwd=root, env=clean,
                           capture_output=True, text=True, timeout=900)
        lines = [ln for ln in p.stdout.splitlines() if ln.startswith("SQUALL-JOB-RESULT ")]
        assert p.returncode == 0 and lines, (p.returncode, p.stdout[-3000:], p.stderr[-6000:])
        result = json.loads(lines[-1].partition(" ")[2])
        yield {"result": result, "output": p.stdout + p.stderr, "key": key_file.read_text(),
               **tokens}
    finally:
        for proc in [*nodes, m]:
            proc.stop()


def test_executors_work_from_conf_and_options_alone(job: dict[str, Any]) -> None:
    r = job["result"]
    assert r["driver_env"] == [] and r["executor_env"] == [[], []]
    assert r["written"] == N
    assert (r["read_rows"], r["read_bad"], r["sink_rows"], r["sink_bad"]) == (N, [], N, [])
    assert r["stage"] == {"done": N, "failed": 0, "lost": 0}
    # an option beats the conf: the same read with a wrong token there is refused
    assert "Unauthorized" in r["bogus_token"], r["bogus_token"]


def test_reads_over_tls_use_batch_reads(job: dict[str, Any]) -> None:
    """Every payload read of the read and of the stage came from a batch read: a batch
    that failed (TLS settings not passed, say) would show as single reads."""
    req = job["result"]["requests"]
    assert job["result"]["read_partitions"] >= 2
    assert req["read"]["batch_get"] >= 2 and req["read"]["get"] == 0, req
    assert req["stage"]["batch_get"] >= 2 and req["stage"]["get"] == 0, req


def test_credentials_stay_out_of_plans_ui_and_logs(job: dict[str, Any]) -> None:
    r = job["result"]
    key_body = job["key"].splitlines()[1]  # a line of the private key's base64
    assert "BatchScan" in r["explain"] and "AppendData" in r["sql_plans"]
    for secret in (job["conf_token"], job["option_token"], key_body):
        assert secret not in r["explain"]
        assert secret not in r["sql_plans"]
        assert secret not in r["ui_environment"]
        assert secret not in job["output"]
    env = json.loads(r["ui_environment"])
    props = dict(env["sparkProperties"])
    assert props["spark.squall.master"].startswith("https://")
    assert "redacted" in props["spark.squall.token"]
    assert "redacted" in props["spark.squall.tls_key_secret"]


def test_settings_come_from_options_then_conf_then_environment(tmp_path: Path) -> None:
    env = {"SQUALL_MASTER": "http://env:1", "SQUALL_TOKEN": "env-token",
           "SQUALL_TLS_CA": "/nowhere/ca.pem"}
    conf = {"spark.squall.master": "http://conf:1", "spark.squall.token": "conf-token"}
    assert resolve({}, {}, env) == ("http://env:1", Conn("env-token", "/nowhere/ca.pem"))
    assert resolve({}, conf, env) == ("http://conf:1", Conn("conf-token", "/nowhere/ca.pem"))
    opts = {"master": "http://opt:1", "token": "opt-token", "tls_ca": ""}
    assert resolve(opts, conf, env) == ("http://opt:1", Conn("opt-token", "/nowhere/ca.pem"))
    # a file the driver can read is shipped as its text; PEM text as is
    ca = trustme.CA()
    pem = ca.cert_pem.bytes().decode()
    f = tmp_path / "ca.pem"
    f.write_text(pem)
    assert resolve({"tls_ca": str(f)}, {}, {})[1].tls_ca == pem
    assert resolve({}, {"spark.squall.tls_ca": pem}, {})[1].tls_ca == pem
    # secrets never show in a repr (options objects end up in error messages and logs)
    leaf = ca.issue_cert("127.0.0.1")
    key = leaf.private_key_pem.bytes().decode()
    conn = resolve({"token": "opt-token", "tls_key_secret": key}, {}, {})[1]
    assert "opt-token" not in repr(conn) and "PRIVATE" not in repr(conn)
    # a private key under a name Spark does not redact is refused, with the right name
    with pytest.raises(ValueError, match="tls_key_secret"):
        resolve({"tls_key": key}, {}, {})
    with pytest.raises(ValueError, match=r"spark\.squall\.tls_key_secret"):
        resolve({}, {"spark.squall.tls_cert": leaf.private_key_and_cert_chain_pem.bytes()
                     .decode()}, {})


def test_a_client_made_with_tls_material_uses_it_not_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's TLS material reaches the client as its ``tls=`` argument: an environment
    naming a CA file that does not exist (which the client would fail to load) is not read,
    and is left as it was."""
    ca = trustme.CA()
    monkeypatch.setenv("SQUALL_TLS_CA", str(tmp_path / "missing-ca.pem"))
    monkeypatch.delenv("SQUALL_TLS_CERT", raising=False)
    with pytest.raises(FileNotFoundError):
        Client("https://127.0.0.1:1")  # the environment's CA, when no tls= is given
    conn = Conn(token="t", tls_ca=ca.cert_pem.bytes().decode())
    with conn.client("https://127.0.0.1:1") as c:
        assert c.token == "t"
        assert c.options["tls"].ca and Path(c.options["tls"].ca).read_bytes() == \
            ca.cert_pem.bytes()
    assert os.environ["SQUALL_TLS_CA"] == str(tmp_path / "missing-ca.pem")
    assert "SQUALL_TLS_CERT" not in os.environ
