"""The SQS endpoint under the chaos soak's faults, with real processes and a ledger.

boto3 sends batches through one data node while another data node and then that node
itself are killed (kill -9); a long poll waits while the master is killed and restarted;
a receiver is killed mid-drain with messages in flight. Every message SQS acknowledged
(a ``Successful`` entry) is received afterwards; nothing acknowledged is lost."""

from __future__ import annotations

import contextlib
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import wait_for
from tests.test_cluster import Cluster

boto3 = pytest.importorskip("boto3")
from botocore.config import Config  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def _restart(p: Any) -> Any:
    """The same server again: same data folder, port, options and environment."""
    again = type(p)(p.data_dir, extra=p.extra, env=p.env, port=p.port)
    return again.start(timeout=60)


def _sqs(url: str, key: dict[str, Any]) -> Any:
    return boto3.client("sqs", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=key["access_key_id"],
                        aws_secret_access_key=key["secret_access_key"],
                        config=Config(retries={"max_attempts": 1}, connect_timeout=2,
                                      read_timeout=30))


class Sender:
    """Sends batches of 10 unique bodies until stopped or an error; keeps the ledger of the
    bodies SQS acknowledged."""

    def __init__(self, sqs: Any, url: str) -> None:
        self.sqs, self.url = sqs, url
        self.acked: set[str] = set()
        self.errors = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set() and len(self.acked) < 20_000:
            bodies = {str(i): f"m-{uuid.uuid4().hex}" for i in range(10)}
            try:
                out = self.sqs.send_message_batch(QueueUrl=self.url, Entries=[
                    {"Id": i, "MessageBody": b} for i, b in bodies.items()])
            except Exception:
                self.errors += 1
                if self.errors > 50:
                    return
                continue
            self.acked.update(bodies[e["Id"]] for e in out.get("Successful", []))


def test_nothing_acknowledged_is_lost_under_kills(tmp_path: Path) -> None:
    c = Cluster(tmp_path, nodes=3)
    try:
        r = c.http.post("/v1/auth/sqs-keys", json={"roles": ["admin"], "ttl_secs": 3600.0})
        assert r.status_code == 200, r.text
        key = r.json()
        n0, n1, n2 = c.nodes
        sqs0, sqs1 = _sqs(n0.url, key), _sqs(n1.url, key)
        url = sqs0.create_queue(QueueName="chaos",
                                Attributes={"VisibilityTimeout": "2"})["QueueUrl"]

        # a data node (not the endpoint) dies while batches are being sent through n0
        s = Sender(sqs0, url)
        s.thread.start()
        wait_for(lambda: len(s.acked) >= 50, timeout=60, what="50 messages acknowledged")
        n2.kill9()
        before = len(s.acked)
        wait_for(lambda: len(s.acked) >= before + 50, timeout=90,
                 what="sends acknowledged after a replica's death")
        # now the endpoint itself dies mid-batch
        n0.kill9()
        s.stop.set()
        s.thread.join(60)
        c.nodes[2] = n2 = _restart(n2)
        c.nodes[0] = n0 = _restart(n0)
        assert len(s.acked) >= 100

        # a long poll is waiting when the master is killed and restarted
        url2 = sqs1.create_queue(QueueName="poll")["QueueUrl"]
        polled: list[Any] = []
        poller = threading.Thread(target=lambda: polled.append(_poll(sqs1, url2)), daemon=True)
        poller.start()
        c.master.kill9()
        c.master = _restart(c.master)
        wait_for(lambda: c.alive() == 3, timeout=60, what="data nodes back with the master")
        late = sqs1.send_message(QueueUrl=url2, MessageBody="after the restart")
        poller.join(60)
        # the waiting poll (if it outlived the master) or a later receive gets it; draining
        # for a message the poll already took would wait out the drain's whole deadline
        got = {m.get("Body") for m in polled if m}
        if "after the restart" not in got:
            got |= _drain(sqs1, url2, want={"after the restart"})
        assert "after the restart" in got
        assert late["MessageId"]

        # a receiver dies mid-drain with messages in flight: they come back (visibility 2 s)
        first = _receive_some(sqs1, url, 30)
        n1.kill9()
        c.nodes[1] = n1 = _restart(n1)
        received = first | _drain(_sqs(n0.url, key), url, want=s.acked - first)
        lost = s.acked - received
        assert not lost, f"{len(lost)} of {len(s.acked)} acknowledged messages lost"
    finally:
        c.close()


def _poll(sqs: Any, url: str) -> dict[str, Any] | None:
    try:
        got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=20, MaxNumberOfMessages=1)
    except Exception:
        return None
    msgs: list[dict[str, Any]] = got.get("Messages", [])
    for m in msgs:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    return msgs[0] if msgs else None


def _receive_some(sqs: Any, url: str, n: int) -> set[str]:
    """Receive up to `n` messages, deleting only the first batch (the rest stay leased)."""
    out: set[str] = set()
    deleted = False
    for _ in range(20):
        if len(out) >= n:
            break
        msgs = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
        if msgs and not deleted:
            sqs.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                for i, m in enumerate(msgs)])
            out.update(m["Body"] for m in msgs)
            deleted = True
    return out


def _drain(sqs: Any, url: str, want: set[str]) -> set[str]:
    """Receive and delete until every body in `want` was seen (or a deadline)."""
    seen: set[str] = set()

    def more() -> bool:
        try:
            msgs = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                       WaitTimeSeconds=1).get("Messages", [])
        except Exception:
            return False
        if msgs:
            seen.update(m["Body"] for m in msgs)
            sqs.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                for i, m in enumerate(msgs)])
        return want <= seen

    with contextlib.suppress(TimeoutError):  # the caller reports what is missing
        wait_for(more, timeout=120, interval=0.0, what="every acknowledged message")
    return seen

