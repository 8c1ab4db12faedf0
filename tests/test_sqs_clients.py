"""SQS clients other people wrote, unchanged, against squall's SQS endpoint.

The AWS CLI, the JavaScript SDK (which checks the body and attribute MD5s), a Celery
worker on kombu's SQS transport (retries, a visibility timeout shorter than a task, a
worker killed mid-task), and a dramatiq worker through dramatiq_sqs. Each runs as its own
process, configured only by an endpoint URL and a key pair, as a user would run it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import cluster_fixture, wait_for
from tests.sqs_compat.harness import Endpoint, endpoint_for, npm_package, python

JS_SDK_VERSION = "3.1175.0"  # @aws-sdk/client-sqs, from the npm registry at test time


def _run(args: list[str], env: dict[str, str], timeout: float = 60) -> str:
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args[:4]} exited {done.returncode}: {done.stderr[-2000:]}"
    return done.stdout


def _drained(ep: Endpoint, url: str) -> bool:
    attrs = ep.boto3_client().get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages",
                                      "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    return (attrs["ApproximateNumberOfMessages"] == "0"
            and attrs["ApproximateNumberOfMessagesNotVisible"] == "0")


# ---------------------------------------------------------------------------- AWS CLI


def test_aws_cli_sends_receives_and_deletes(sqs_endpoint: Endpoint) -> None:
    env = sqs_endpoint.env()

    def aws(*args: str) -> str:
        return _run([python(), "-m", "awscli", "--endpoint-url", sqs_endpoint.url,
                     "--output", "json", "sqs", *args], env)

    name = f"cli-{uuid.uuid4().hex[:8]}"
    url = json.loads(aws("create-queue", "--queue-name", name))["QueueUrl"]
    assert url.endswith("/" + name)
    sent = json.loads(aws("send-message", "--queue-url", url,
                          "--message-body", "hello from the cli"))
    assert sent["MD5OfMessageBody"] == hashlib.md5(b"hello from the cli").hexdigest()
    got = json.loads(aws("receive-message", "--queue-url", url, "--wait-time-seconds", "5",
                         "--attribute-names", "ApproximateReceiveCount"))
    [msg] = got["Messages"]
    assert msg["Body"] == "hello from the cli"
    assert msg["MessageId"] == sent["MessageId"]
    assert msg["Attributes"]["ApproximateReceiveCount"] == "1"
    aws("delete-message", "--queue-url", url, "--receipt-handle", msg["ReceiptHandle"])
    assert _drained(sqs_endpoint, url)
    aws("delete-queue", "--queue-url", url)
    listed = aws("list-queues", "--queue-name-prefix", name)
    assert name not in listed


# ------------------------------------------------------------------ JavaScript SDK v3

_JS = r"""
const crypto = require("crypto");
// MD5OfMessageAttributes as the Java and .NET SDKs check it: attributes sorted by name,
// each as length-prefixed name, length-prefixed type, a transport byte, length-prefixed value
function attrMd5(attrs) {
  const parts = [];
  const lp = (b) => { const n = Buffer.alloc(4); n.writeUInt32BE(b.length); parts.push(n, b); };
  for (const name of Object.keys(attrs).sort()) {
    const a = attrs[name];
    lp(Buffer.from(name, "utf8")); lp(Buffer.from(a.DataType, "utf8"));
    if (a.BinaryValue !== undefined) {
      parts.push(Buffer.from([2])); lp(Buffer.from(a.BinaryValue));
    } else { parts.push(Buffer.from([1])); lp(Buffer.from(a.StringValue, "utf8")); }
  }
  return crypto.createHash("md5").update(Buffer.concat(parts)).digest("hex");
}
const { SQSClient, CreateQueueCommand, SendMessageCommand, ReceiveMessageCommand,
        DeleteMessageCommand } = require("@aws-sdk/client-sqs");
(async () => {
  const sqs = new SQSClient({ endpoint: process.env.AWS_ENDPOINT_URL_SQS,
                              region: process.env.AWS_REGION });
  const { QueueUrl } = await sqs.send(new CreateQueueCommand({ QueueName: process.argv[2] }));
  const attrs = { tenant: { DataType: "String", StringValue: "acme \u00e9\u4e2d" },
                  n: { DataType: "Number", StringValue: "42" },
                  raw: { DataType: "Binary", BinaryValue: Buffer.from([0, 1, 2, 255]) } };
  const body = "payload \u2603 " + "x".repeat(3000);
  const sent = await sqs.send(new SendMessageCommand({ QueueUrl, MessageBody: body,
                                                       MessageAttributes: attrs }));
  const got = await sqs.send(new ReceiveMessageCommand({ QueueUrl, WaitTimeSeconds: 5,
      MaxNumberOfMessages: 1, MessageAttributeNames: ["All"],
      MessageSystemAttributeNames: ["All"] }));
  const m = got.Messages[0];
  await sqs.send(new DeleteMessageCommand({ QueueUrl, ReceiptHandle: m.ReceiptHandle }));
  console.log(JSON.stringify({ sent, id: m.MessageId, same: m.Body === body,
      md5: m.MD5OfBody, attrMd5: m.MD5OfMessageAttributes, expectAttrMd5: attrMd5(attrs),
      gotAttrMd5: attrMd5(m.MessageAttributes),
      tenant: m.MessageAttributes.tenant.StringValue,
      raw: Array.from(m.MessageAttributes.raw.BinaryValue),
      count: m.Attributes.ApproximateReceiveCount }));
})().catch((e) => { console.error(e); process.exit(1); });
"""


def test_javascript_sdk_checks_md5s(sqs_endpoint: Endpoint, tmp_path: Path) -> None:
    modules = npm_package("@aws-sdk/client-sqs", JS_SDK_VERSION)
    if modules is None:
        pytest.skip("node and npm are needed for the JavaScript SDK (Debian: nodejs npm)")
    script = tmp_path / "sqs.js"
    script.write_text(_JS)
    env = sqs_endpoint.env(NODE_PATH=str(modules / "node_modules"))
    out = json.loads(_run(["node", str(script), f"js-{uuid.uuid4().hex[:8]}"], env))
    # the SDK itself verified MD5OfMessageBody on send and receive (a mismatch throws);
    # the attributes' digest is checked here with the algorithm the Java and .NET SDKs use
    assert out["same"] is True
    assert out["id"] == out["sent"]["MessageId"]
    assert out["md5"] == out["sent"]["MD5OfMessageBody"]
    assert out["attrMd5"] == out["sent"]["MD5OfMessageAttributes"] == out["expectAttrMd5"]
    assert out["gotAttrMd5"] == out["expectAttrMd5"]
    assert out["tenant"] == "acme \u00e9\u4e2d"
    assert out["raw"] == [0, 1, 2, 255]
    assert out["count"] == "1"


# --------------------------------------------------------------------------- Celery

_CELERY_APP = """
import os, pathlib, time
from urllib.parse import quote
from celery import Celery

OUT = pathlib.Path(os.environ["OUT"])
host, port = os.environ["SQS_HOSTPORT"].split(":")
app = Celery("capp", broker="sqs://%s:%s@%s:%s" % (
    quote(os.environ["AWS_ACCESS_KEY_ID"], safe=""),
    quote(os.environ["AWS_SECRET_ACCESS_KEY"], safe=""), host, port))
app.conf.broker_transport_options = {
    "region": os.environ["AWS_REGION"], "visibility_timeout": 3, "wait_time_seconds": 1,
    "polling_interval": 0.1, "queue_name_prefix": os.environ["PREFIX"]}
app.conf.task_acks_late = True
app.conf.worker_prefetch_multiplier = 1
app.conf.task_default_queue = "work"
app.conf.broker_connection_retry_on_startup = True


@app.task(bind=True, max_retries=3)
def add(self, x, y, fail_first=False):
    if fail_first and not (OUT / f"try-{x}").exists():
        (OUT / f"try-{x}").touch()
        raise self.retry(countdown=0)
    (OUT / f"add-{x}").write_text(str(x + y))


@app.task
def slow(n, first_secs):
    first = not any(OUT.glob(f"slow-{n}-started-*"))
    (OUT / f"slow-{n}-started-{os.getpid()}-{time.monotonic_ns()}").touch()
    time.sleep(first_secs if first else 0.2)
    with open(OUT / f"slow-{n}-done", "a") as f:
        f.write(f"{os.getpid()}\\n")
"""


class _Celery:
    def __init__(self, ep: Endpoint, where: Path) -> None:
        self.ep, self.where = ep, where
        self.out = where / "out"
        self.out.mkdir()
        (where / "capp.py").write_text(_CELERY_APP)
        self.prefix = f"c{uuid.uuid4().hex[:6]}-"
        host = ep.url.split("://", 1)[1].rstrip("/")
        self.env = ep.env(OUT=str(self.out), SQS_HOSTPORT=host, PREFIX=self.prefix,
                          PYTHONPATH=str(where))

    def worker(self) -> subprocess.Popen[bytes]:
        with open(self.where / f"worker-{uuid.uuid4().hex[:4]}.log", "wb") as log:
            return subprocess.Popen(
                [python(), "-m", "celery", "-A", "capp", "worker", "--pool=solo",
                 "--without-heartbeat", "--without-gossip", "--without-mingle", "-l", "info",
                 "-Q", "work"], cwd=self.where, env=self.env, stdout=log, stderr=log)

    def send(self, code: str) -> None:
        _run([python(), "-c", "import capp\n" + textwrap.dedent(code)], self.env)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:]
                         for p in self.where.glob("worker-*.log"))


@pytest.fixture
def celery(sqs_endpoint: Endpoint, tmp_path: Path) -> Iterator[_Celery]:
    pytest.importorskip("celery")
    pytest.importorskip("pycurl", reason="kombu's SQS transport needs pycurl")
    c = _Celery(sqs_endpoint, tmp_path)
    yield c


def _stop(p: subprocess.Popen[bytes]) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)


def test_celery_worker_runs_tasks_with_retries(celery: _Celery) -> None:
    w = celery.worker()
    try:
        celery.send("for i in range(8):\n    capp.add.delay(i, 100, fail_first=i % 2 == 0)")
        wait_for(lambda: len(list(celery.out.glob("add-*"))) == 8, 120,
                 what=f"8 Celery tasks; worker log:\n{celery.logs()}")
        assert sorted(int(p.read_text()) for p in celery.out.glob("add-*")) == \
            [i + 100 for i in range(8)]
        assert len(list(celery.out.glob("try-*"))) == 4  # each even task retried once
    finally:
        _stop(w)


def test_celery_task_longer_than_its_visibility_timeout(celery: _Celery) -> None:
    """acks_late with a visibility timeout (3 s) shorter than the task (6 s): SQS semantics
    make the message visible again while it runs, so it may run twice (at least once);
    it is deleted once a run acknowledges it, and the queue drains."""
    w = celery.worker()
    w2 = celery.worker()
    try:
        celery.send("capp.slow.delay(1, 6)")
        wait_for(lambda: (celery.out / "slow-1-done").exists(), 120,
                 what=f"the slow task to finish; logs:\n{celery.logs()}")
        url = celery.ep.boto3_client().get_queue_url(QueueName=celery.prefix + "work")
        wait_for(lambda: _drained(celery.ep, url["QueueUrl"]), 60, what="the queue to drain")
    finally:
        _stop(w)
        _stop(w2)


def test_celery_worker_killed_mid_task_the_task_comes_back(celery: _Celery) -> None:
    w = celery.worker()
    try:
        celery.send("capp.slow.delay(2, 600)")
        wait_for(lambda: any(celery.out.glob("slow-2-started-*")), 120,
                 what=f"the task to start; log:\n{celery.logs()}")
        os.kill(w.pid, signal.SIGKILL)
        w.wait(timeout=30)
        w = celery.worker()
        wait_for(lambda: (celery.out / "slow-2-done").exists(), 120,
                 what=f"the task to come back after the kill; logs:\n{celery.logs()}")
        assert len(list(celery.out.glob("slow-2-started-*"))) >= 2
    finally:
        _stop(w)


# ------------------------------------------------------------------------- dramatiq

_DRAMATIQ_APP = """
import os, pathlib
import dramatiq
from dramatiq_sqs import SQSBroker

OUT = pathlib.Path(os.environ["OUT"])
broker = SQSBroker(namespace=os.environ["PREFIX"], endpoint_url=os.environ["AWS_ENDPOINT_URL_SQS"],
                   region_name=os.environ["AWS_REGION"], visibility_timeout=30)
dramatiq.set_broker(broker)


@dramatiq.actor(max_retries=3, min_backoff=100, max_backoff=500)
def record(n):
    if n % 3 == 0 and not (OUT / f"try-{n}").exists():
        (OUT / f"try-{n}").touch()
        raise RuntimeError("first try fails")
    (OUT / f"done-{n}").write_text(str(n))
"""


def test_dramatiq_worker_through_dramatiq_sqs(sqs_endpoint: Endpoint, tmp_path: Path) -> None:
    pytest.importorskip("dramatiq_sqs")
    out = tmp_path / "out"
    out.mkdir()
    (tmp_path / "dapp.py").write_text(_DRAMATIQ_APP)
    env = sqs_endpoint.env(OUT=str(out), PREFIX=f"d{uuid.uuid4().hex[:6]}",
                           PYTHONPATH=str(tmp_path))
    _run([python(), "-c", "import dapp\nfor n in range(12):\n    dapp.record.send(n)"], env)
    with open(tmp_path / "worker.log", "wb") as log:
        w = subprocess.Popen([python(), "-m", "dramatiq", "dapp", "--processes", "1",
                              "--threads", "2"], cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        wait_for(lambda: len(list(out.glob("done-*"))) == 12, 120,
                 what="12 dramatiq messages; worker log:\n"
                 + (tmp_path / "worker.log").read_text(errors="replace")[-3000:])
        assert sorted(int(p.read_text()) for p in out.glob("done-*")) == list(range(12))
        assert len(list(out.glob("try-*"))) == 4
    finally:
        w.send_signal(signal.SIGTERM)
        try:
            w.wait(timeout=30)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()


cluster = cluster_fixture("sqsclients", nodes=2)


@pytest.fixture(scope="module")
def sqs_endpoint(cluster: Any) -> Endpoint:
    return endpoint_for(cluster)
