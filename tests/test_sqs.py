"""The SQS-compatible endpoint (docs/sqs.md) through boto3 and aiobotocore, as an
application would use Amazon SQS: a real cluster (master and two data nodes) on loopback,
access keys minted by the master, every action, the errors mapped to botocore's modelled
exception classes, and squall's own client on the same queues."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import time
from typing import Any

import httpx
import orjson
import pytest

from tests.helpers import ADMIN, ADMIN_TOKEN, cluster_fixture, wait_for

boto3 = pytest.importorskip("boto3")
from botocore.auth import SigV4Auth, SigV4QueryAuth  # noqa: E402
from botocore.awsrequest import AWSRequest  # noqa: E402
from botocore.config import Config  # noqa: E402
from botocore.credentials import Credentials  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

from squall.client import Client  # noqa: E402
from squall.datanode.sqs.md5 import md5_attributes  # noqa: E402

pytestmark = pytest.mark.timeout(300)
cluster = cluster_fixture("sqs", nodes=2)
REGION = "us-east-1"


def mint_key(master_url: str, *roles: str, groups: list[str] | None = None,
             ttl_secs: float = 86400.0) -> dict[str, Any]:
    body: dict[str, Any] = {"roles": list(roles), "ttl_secs": ttl_secs}
    if groups is not None:
        body["groups"] = groups
    r = httpx.post(master_url + "/v1/auth/sqs-keys", json=body, headers=ADMIN)
    assert r.status_code == 200, r.text
    ans: dict[str, Any] = r.json()
    return ans


def sqs_client(endpoint: str, key: dict[str, Any], secret: str | None = None,
               region: str = REGION) -> Any:
    return boto3.client("sqs", endpoint_url=endpoint, region_name=region,
                        aws_access_key_id=key["access_key_id"],
                        aws_secret_access_key=secret or key["secret_access_key"],
                        config=Config(retries={"max_attempts": 1}))


@pytest.fixture(scope="module")
def key(cluster: Any) -> dict[str, Any]:
    return mint_key(cluster.master_url, "admin")


@pytest.fixture(scope="module")
def sqs(cluster: Any, key: dict[str, Any]) -> Any:
    return sqs_client(cluster.node_url(1), key)


@pytest.fixture(scope="module")
def sqs2(cluster: Any, key: dict[str, Any]) -> Any:
    """The other data node: messages sent to one are received from the other."""
    return sqs_client(cluster.node_url(2), key)


def code(e: ClientError) -> str:
    return str(e.response["Error"]["Code"])


# -- queues -------------------------------------------------------------------------------
def test_queue_lifecycle(sqs: Any, sqs2: Any) -> None:
    url = sqs.create_queue(QueueName="life", Attributes={"VisibilityTimeout": "45"},
                           tags={"team": "a"})["QueueUrl"]
    assert url.endswith("/default/life")
    # the same attributes again: the same queue; others: QueueNameExists
    assert sqs2.create_queue(QueueName="life", Attributes={"VisibilityTimeout": "45"}
                             )["QueueUrl"].endswith("/default/life")
    with pytest.raises(sqs.exceptions.QueueNameExists):
        sqs.create_queue(QueueName="life", Attributes={"VisibilityTimeout": "46"})
    assert sqs2.get_queue_url(QueueName="life")["QueueUrl"].endswith("/default/life")
    with pytest.raises(sqs.exceptions.QueueDoesNotExist) as ei:
        sqs.get_queue_url(QueueName="no-such-queue")
    assert code(ei.value) == "AWS.SimpleQueueService.NonExistentQueue"
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["VisibilityTimeout"] == "45"
    assert attrs["QueueArn"] == "arn:aws:sqs:us-east-1:default:life"
    assert attrs["ApproximateNumberOfMessages"] == "0"
    assert int(attrs["CreatedTimestamp"]) > time.time() - 600
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "2",
                                                       "MessageRetentionPeriod": "3600"})
    got = sqs2.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "DelaySeconds", "MessageRetentionPeriod"])["Attributes"]
    assert got == {"DelaySeconds": "2", "MessageRetentionPeriod": "3600"}
    with pytest.raises(ClientError) as ei:
        sqs.set_queue_attributes(QueueUrl=url, Attributes={"DelaySeconds": "901"})
    assert code(ei.value) == "InvalidAttributeValue"
    with pytest.raises(sqs.exceptions.InvalidAttributeName):
        sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["Nope"])
    # tags
    sqs.tag_queue(QueueUrl=url, Tags={"env": "test"})
    assert sqs.list_queue_tags(QueueUrl=url)["Tags"] == {"team": "a", "env": "test"}
    sqs.untag_queue(QueueUrl=url, TagKeys=["team"])
    assert sqs2.list_queue_tags(QueueUrl=url)["Tags"] == {"env": "test"}
    # delete
    sqs.delete_queue(QueueUrl=url)
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs2.get_queue_url(QueueName="life")
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.send_message(QueueUrl=url.replace("/life", "/gone"), MessageBody="x")


def test_list_queues_prefix_and_pages(sqs: Any) -> None:
    names = [f"lst-{i}" for i in range(5)]
    for n in names:
        sqs.create_queue(QueueName=n)
    urls = sqs.list_queues(QueueNamePrefix="lst-")["QueueUrls"]
    assert [u.rsplit("/", 1)[1] for u in urls] == names
    seen, token = [], None
    for _ in range(10):
        kw = {"NextToken": token} if token else {}
        page = sqs.list_queues(QueueNamePrefix="lst-", MaxResults=2, **kw)
        seen += [u.rsplit("/", 1)[1] for u in page["QueueUrls"]]
        token = page.get("NextToken")
        if not token:
            break
    assert seen == names
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix="zzz-none")


def test_bad_queue_names(sqs: Any) -> None:
    for bad in ("a" * 81, "sp ace", "dot.ted", "_leading"):
        with pytest.raises(ClientError) as ei:
            sqs.create_queue(QueueName=bad)
        assert code(ei.value) == "InvalidParameterValue", bad
    with pytest.raises(ClientError) as ei:
        sqs.create_queue(QueueName="notfifo", Attributes={"FifoQueue": "true"})
    assert code(ei.value) == "InvalidParameterValue"


# -- messages -----------------------------------------------------------------------------
def test_send_receive_delete_with_attributes_and_md5s(sqs: Any, sqs2: Any) -> None:
    url = sqs.create_queue(QueueName="msgs")["QueueUrl"]
    attrs = {"s": {"DataType": "String", "StringValue": "héllo"},
             "n": {"DataType": "Number", "StringValue": "42"},
             "b": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"},
             "c": {"DataType": "String.custom", "StringValue": "x"}}
    body = "body ✓ " * 10
    sent = sqs.send_message(QueueUrl=url, MessageBody=body, MessageAttributes=attrs)
    assert sent["MD5OfMessageBody"] == hashlib.md5(body.encode()).hexdigest()
    # the SDKs' algorithm, computed independently here
    assert sent["MD5OfMessageAttributes"] == _sdk_md5(attrs)
    got = sqs2.receive_message(QueueUrl=url, MessageAttributeNames=["All"],
                               MessageSystemAttributeNames=["All"], WaitTimeSeconds=5)
    (m,) = got["Messages"]
    assert m["MessageId"] == sent["MessageId"]
    assert m["Body"] == body and m["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert m["MessageAttributes"] == attrs
    assert m["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    assert abs(int(m["Attributes"]["SentTimestamp"]) / 1000 - time.time()) < 300
    # a prefix picks attributes
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                  VisibilityTimeout=0)
    (m2,) = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["s", "n"],
                                AttributeNames=["ApproximateReceiveCount"],
                                WaitTimeSeconds=5)["Messages"]
    assert set(m2["MessageAttributes"]) == {"s", "n"}
    assert m2["Attributes"] == {"ApproximateReceiveCount": "2"}
    assert m2["ReceiptHandle"] != m["ReceiptHandle"]
    sqs2.delete_message(QueueUrl=url, ReceiptHandle=m2["ReceiptHandle"])
    assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=0)
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"] == {"ApproximateNumberOfMessages": "0",
                        "ApproximateNumberOfMessagesNotVisible": "0"}


def _sdk_md5(attrs: dict[str, dict[str, Any]]) -> str:
    """MD5OfMessageAttributes as the Java/JS/.NET SDKs compute it."""
    out = b""
    for name in sorted(attrs):
        a = attrs[name]
        out += len(name.encode()).to_bytes(4, "big") + name.encode()
        out += len(a["DataType"].encode()).to_bytes(4, "big") + a["DataType"].encode()
        if "BinaryValue" in a:
            out += b"\x02" + len(a["BinaryValue"]).to_bytes(4, "big") + a["BinaryValue"]
        else:
            v = a["StringValue"].encode()
            out += b"\x01" + len(v).to_bytes(4, "big") + v
    return hashlib.md5(out).hexdigest()


def test_md5_known_vector() -> None:
    """A published vector: the attribute of the AWS SQS developer guide's example."""
    attrs = {"attr1": {"DataType": "String", "StringValue": "value1"}}
    assert md5_attributes(attrs) == _sdk_md5(attrs)
    assert _sdk_md5({}) == hashlib.md5(b"").hexdigest()


def test_batches_and_their_errors(sqs: Any, sqs2: Any) -> None:
    url = sqs.create_queue(QueueName="batch", Attributes={"MaximumMessageSize": "1024"}
                           )["QueueUrl"]
    res = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": f"e{i}", "MessageBody": f"m{i}"} for i in range(10)])
    assert sorted(e["Id"] for e in res["Successful"]) == sorted(f"e{i}" for i in range(10))
    assert res.get("Failed", []) == []
    with pytest.raises(sqs.exceptions.TooManyEntriesInBatchRequest):
        sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": f"e{i}", "MessageBody": "x"} for i in range(11)])
    with pytest.raises(sqs.exceptions.BatchEntryIdsNotDistinct):
        sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": "same", "MessageBody": "x"}, {"Id": "same", "MessageBody": "y"}])
    with pytest.raises(sqs.exceptions.EmptyBatchRequest):
        sqs.send_message_batch(QueueUrl=url, Entries=[])
    with pytest.raises(sqs.exceptions.InvalidBatchEntryId):
        sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": "bad id!", "MessageBody": "x"}])
    # over 1 MiB in all: the whole request is refused, before any entry is looked at
    with pytest.raises(sqs.exceptions.BatchRequestTooLong):
        sqs.send_message_batch(QueueUrl=url, Entries=[
            {"Id": "ok", "MessageBody": "fine"}, {"Id": "big", "MessageBody": "x" * 1048573}])
    # one bad entry fails alone (over the queue's MaximumMessageSize)
    res = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "ok", "MessageBody": "fine"},
        {"Id": "big", "MessageBody": "x" * 1025}])
    assert [e["Id"] for e in res["Successful"]] == ["ok"]
    assert [(e["Id"], e["Code"], e["SenderFault"]) for e in res["Failed"]] == [
        ("big", "InvalidParameterValue", True)]
    # receive them all, 10 at a time, delete in batches
    bodies, rounds = [], 0
    while len(bodies) < 11 and rounds < 20:
        rounds += 1
        got = sqs2.receive_message(QueueUrl=url, MaxNumberOfMessages=9, WaitTimeSeconds=2)
        ms = got.get("Messages", [])
        assert len(ms) <= 9
        bodies += [m["Body"] for m in ms]
        if ms:
            d = sqs.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(ms)]
                                         + [{"Id": "forged", "ReceiptHandle": "sqh1.x.y"}])
            assert len(d["Successful"]) == len(ms)
            assert [(f["Id"], f["Code"]) for f in d["Failed"]] == [
                ("forged", "ReceiptHandleIsInvalid")]
    assert sorted(bodies) == sorted([f"m{i}" for i in range(10)] + ["fine"])
    with pytest.raises(ClientError) as ei:
        sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=11)
    assert code(ei.value) == "InvalidParameterValue"


def test_oversize_and_invalid_bodies(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="sizes")["QueueUrl"]
    with pytest.raises(ClientError) as ei:
        sqs.send_message(QueueUrl=url, MessageBody="x" * 1048577)
    assert code(ei.value) == "InvalidParameterValue"
    assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    with pytest.raises(sqs.exceptions.InvalidMessageContents):
        sqs.send_message(QueueUrl=url, MessageBody="nul \x00 here")
    big = "y" * 1048576  # the limit itself is fine (stored past the 64 KiB front-door path)
    sqs.send_message(QueueUrl=url, MessageBody=big)
    (m,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert m["Body"] == big


def test_visibility_and_fenced_receipt_handles(sqs: Any, sqs2: Any) -> None:
    url = sqs.create_queue(QueueName="vis")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="v")
    (m1,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=60,
                                WaitTimeSeconds=5)["Messages"]
    assert "Messages" not in sqs2.receive_message(QueueUrl=url)  # invisible
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m1["ReceiptHandle"],
                                  VisibilityTimeout=120)  # extend
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m1["ReceiptHandle"],
                                  VisibilityTimeout=0)  # give back now
    (m2,) = sqs2.receive_message(QueueUrl=url, VisibilityTimeout=60, AttributeNames=["All"],
                                 WaitTimeSeconds=5)["Messages"]
    assert m2["MessageId"] == m1["MessageId"] and m2["ReceiptHandle"] != m1["ReceiptHandle"]
    assert m2["Attributes"]["ApproximateReceiveCount"] == "2"
    # the old handle can neither extend nor delete the new lease
    with pytest.raises(ClientError) as ei:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m1["ReceiptHandle"],
                                      VisibilityTimeout=0)
    assert code(ei.value) == "InvalidParameterValue"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m1["ReceiptHandle"])  # as SQS: "succeeds"
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    assert a["ApproximateNumberOfMessagesNotVisible"] == "1"  # ... but deleted nothing
    res = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "new", "ReceiptHandle": m2["ReceiptHandle"], "VisibilityTimeout": 90},
        {"Id": "old", "ReceiptHandle": m1["ReceiptHandle"], "VisibilityTimeout": 90}])
    assert [e["Id"] for e in res["Successful"]] == ["new"]
    assert [(e["Id"], e["Code"]) for e in res["Failed"]] == [("old", "InvalidParameterValue")]
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m2["ReceiptHandle"])
    assert sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"][
        "ApproximateNumberOfMessagesNotVisible"] == "0"
    # forged, damaged, another queue's
    for bad in ("nonsense", m2["ReceiptHandle"][:-3] + "AAA"):
        with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
            sqs.delete_message(QueueUrl=url, ReceiptHandle=bad)
    other = sqs.create_queue(QueueName="vis-other")["QueueUrl"]
    with pytest.raises(sqs.exceptions.ReceiptHandleIsInvalid):
        sqs.delete_message(QueueUrl=other, ReceiptHandle=m2["ReceiptHandle"])


def lease_waiting(master_url: str) -> float:
    """The master's count of leases parked waiting for a task (squall_lease_waiting)."""
    text = httpx.get(master_url + "/metrics", headers=ADMIN).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith("squall_lease_waiting "))


def test_long_poll_wakes_on_send(cluster: Any, sqs: Any, sqs2: Any) -> None:
    url = sqs.create_queue(QueueName="poll")["QueueUrl"]

    def later() -> None:  # once the receive waits at the master
        wait_for(lambda: lease_waiting(cluster.master_url) >= 1, 30,
                 what="the receive's lease parked")
        sqs2.send_message(QueueUrl=url, MessageBody="woke")

    import threading
    t = threading.Thread(target=later)
    t.start()
    got = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=20)
    t.join()
    assert [m["Body"] for m in got["Messages"]] == ["woke"]


def test_delay_and_purge(sqs: Any) -> None:
    url = sqs.create_queue(QueueName="delayed")["QueueUrl"]
    sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=600)
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert a["ApproximateNumberOfMessagesDelayed"] == "1"
    assert "Messages" not in sqs.receive_message(QueueUrl=url)
    sqs.send_message(QueueUrl=url, MessageBody="now")
    sqs.purge_queue(QueueUrl=url)
    a = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert (a["ApproximateNumberOfMessages"], a["ApproximateNumberOfMessagesDelayed"]) == (
        "0", "0")
    assert sqs.get_queue_url(QueueName="delayed")  # purged, not deleted


def test_fifo_order_and_deduplication(sqs: Any, sqs2: Any) -> None:
    url = sqs.create_queue(QueueName="orders.fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    ids = []
    for i in range(5):
        r = (sqs if i % 2 else sqs2).send_message(QueueUrl=url, MessageBody=f"o{i}",
                                                  MessageGroupId="g1")
        ids.append(r["MessageId"])
        assert len(r["SequenceNumber"]) == 20
    dup = sqs.send_message(QueueUrl=url, MessageBody="o0", MessageGroupId="g1")
    assert dup["MessageId"] == ids[0]  # content-based deduplication
    d1 = sqs.send_message(QueueUrl=url, MessageBody="x", MessageGroupId="g2",
                          MessageDeduplicationId="k")
    d2 = sqs.send_message(QueueUrl=url, MessageBody="y", MessageGroupId="g2",
                          MessageDeduplicationId="k")
    assert d1["MessageId"] == d2["MessageId"]
    with pytest.raises(ClientError) as ei:
        sqs.send_message(QueueUrl=url, MessageBody="no group")
    assert code(ei.value) == "MissingParameter"
    # one message of a group in flight at a time, in the order sent
    seen: dict[str, list[str]] = {"g1": [], "g2": []}
    for _ in range(20):
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                  MessageSystemAttributeNames=["MessageGroupId"],
                                  WaitTimeSeconds=1).get("Messages", [])
        groups = [m["Attributes"]["MessageGroupId"] for m in got]
        assert len(groups) == len(set(groups)), groups  # never two of a group at once
        # while they are in flight, nothing more of their groups comes
        more = sqs2.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                    MessageSystemAttributeNames=["MessageGroupId"])
        assert not {m["Attributes"]["MessageGroupId"] for m in more.get("Messages", [])} & \
            set(groups)
        for m in [*got, *more.get("Messages", [])]:
            seen[m["Attributes"]["MessageGroupId"]].append(m["Body"])
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        if len(seen["g1"]) == 5 and seen["g2"]:
            break
    assert seen == {"g1": [f"o{i}" for i in range(5)], "g2": ["x"]}
    plain = sqs.create_queue(QueueName="plain-fifo.fifo",
                             Attributes={"FifoQueue": "true"})["QueueUrl"]
    with pytest.raises(ClientError) as ei:
        sqs.send_message(QueueUrl=plain, MessageBody="b", MessageGroupId="g")
    assert code(ei.value) == "InvalidParameterValue"  # no dedup id, no content-based


def test_redrive_policy_dead_letters_and_move_task(sqs: Any, cluster: Any) -> None:
    dlq = sqs.create_queue(QueueName="work-dlq")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"]
                                   )["Attributes"]["QueueArn"]
    policy = orjson.dumps({"deadLetterTargetArn": arn, "maxReceiveCount": 1}).decode()
    url = sqs.create_queue(QueueName="work", Attributes={"RedrivePolicy": policy,
                                                         "VisibilityTimeout": "1"})["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
    assert orjson.loads(got["Attributes"]["RedrivePolicy"]) == orjson.loads(policy)
    with Client(cluster.master_url, token=ADMIN_TOKEN) as c:  # the squall policy it maps to
        p = c.policy("default#work")
        assert (p.max_attempts, p.dead_letter_queue, p.lease_secs) == (
            1, "work-dlq", 1.0)
    sqs.send_message(QueueUrl=url, MessageBody="poison")
    assert sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    # the lease runs out after one receive: the next receive moves the message to the
    # dead-letter queue instead of handing it out (as SQS does)

    def dead() -> bool:
        assert "Messages" not in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=1)
        a = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=[
            "ApproximateNumberOfMessages"])["Attributes"]
        return a["ApproximateNumberOfMessages"] == "1"
    wait_for(dead, timeout=60)
    task = sqs.start_message_move_task(SourceArn=arn, DestinationArn=arn.replace(
        "work-dlq", "work"))
    assert task["TaskHandle"]
    (m,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert m["Body"] == "poison"


# -- squall's own client on the same queues -----------------------------------------------
def test_squall_put_received_through_sqs_and_back(sqs: Any, cluster: Any) -> None:
    with Client(cluster.master_url, token=ADMIN_TOKEN) as c:
        c.put("default#interop", b"from squall")
        c.put("default#interop", b"\xff\xfe not utf-8")
        url = sqs.get_queue_url(QueueName="interop")["QueueUrl"]
        got: list[dict[str, Any]] = []
        for _ in range(10):
            if len(got) == 2:
                break
            got += sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                       MessageAttributeNames=["All"], WaitTimeSeconds=5
                                       ).get("Messages", [])
        by = {m["Body"]: m for m in got}
        assert "from squall" in by
        binary = next(m for m in got if m["Body"] != "from squall")
        assert binary["MessageAttributes"]["squall.encoding"]["StringValue"] == "base64"
        for m in got:
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
        # and an SQS message is a task whose payload is its body
        sqs.send_message(QueueUrl=url, MessageBody="to squall")
        tasks = c.lease("default#interop", max_tasks=1, wait_secs=5)
        assert [t.payload() for t in tasks] == [b"to squall"]
        for t in tasks:
            t.done()


# -- credentials ---------------------------------------------------------------------------
def _raw(endpoint: str, headers: dict[str, str], body: bytes = b"{}") -> httpx.Response:
    return httpx.post(endpoint + "/", content=body, headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues",
        **headers})


def test_unsigned_and_badly_signed_requests_are_refused(cluster: Any, key: dict[str, Any],
                                                        monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    node = cluster.node_url(1)
    r = _raw(node, {})
    assert r.status_code == 403
    assert r.headers["x-amzn-query-error"] == "MissingAuthenticationToken;Sender"
    r = _raw(node, {"Authorization": f"Bearer {ADMIN_TOKEN}"})  # a squall credential
    assert r.status_code in (400, 403) and "x-amzn-query-error" in r.headers
    with pytest.raises(ClientError) as ei:
        sqs_client(node, key, secret="wrong" + key["secret_access_key"]).list_queues()
    assert code(ei.value) == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as ei:
        sqs_client(node, {"access_key_id": "SQ" + "A" * 26, "secret_access_key": "x"}
                   ).list_queues()
    assert code(ei.value) == "InvalidClientTokenId"
    with pytest.raises(ClientError) as ei:
        sqs_client(node, key, region="eu-west-1").list_queues()
    assert code(ei.value) == "SignatureDoesNotMatch"
    # a date outside the 15-minute window
    import botocore.auth
    old = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=20)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *a, **k: old)
    with pytest.raises(ClientError) as ei:
        sqs_client(node, key).list_queues()
    assert code(ei.value) == "RequestExpired"
    monkeypatch.undo()
    # a body changed after signing
    creds = Credentials(key["access_key_id"], key["secret_access_key"])
    req = AWSRequest("POST", node + "/", data=b"{}", headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"})
    SigV4Auth(creds, "sqs", REGION).add_auth(req)
    r = httpx.post(node + "/", content=b'{"QueueNamePrefix": "x"}', headers=dict(req.headers))
    assert r.headers["x-amzn-query-error"] == "SignatureDoesNotMatch;Sender"
    r = httpx.post(node + "/", content=b"{}", headers=dict(req.headers))
    assert r.status_code == 200, r.text


def test_presigned_query_form(cluster: Any, key: dict[str, Any]) -> None:
    node = cluster.node_url(1)
    creds = Credentials(key["access_key_id"], key["secret_access_key"])
    req = AWSRequest("POST", node + "/", data=b"{}", headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"})
    SigV4QueryAuth(creds, "sqs", REGION, expires=60).add_auth(req)  # the body is signed
    r = httpx.post(req.url, content=b"", headers={  # empty (its parameters are in the URL)
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"})
    assert r.status_code == 200, r.text
    r = httpx.post(req.url.replace("X-Amz-Signature=", "X-Amz-Signature=0"), content=b"",
                   headers={"X-Amz-Target": "AmazonSQS.ListQueues"})
    assert r.status_code in (400, 403)


def test_roles_groups_and_revocation(cluster: Any) -> None:
    node = cluster.node_url(1)
    producer = mint_key(cluster.master_url, "producer", groups=["reports"])
    p = sqs_client(node, producer)
    with pytest.raises(ClientError) as ei:  # creating needs admin
        p.create_queue(QueueName="r1")
    assert code(ei.value) == "AccessDenied"
    admin_reports = sqs_client(node, mint_key(cluster.master_url, "admin", groups=["reports"]))
    url = admin_reports.create_queue(QueueName="r1")["QueueUrl"]
    assert url.endswith("/reports/r1")  # a key limited to one group lives in it
    p.send_message(QueueUrl=url, MessageBody="ok")
    with pytest.raises(ClientError) as ei:  # another group's queue
        p.send_message(QueueUrl=url.replace("/reports/", "/default/"), MessageBody="x")
    assert code(ei.value) in ("AccessDenied", "AWS.SimpleQueueService.NonExistentQueue")
    with pytest.raises(ClientError) as ei:  # consuming needs the consumer role
        p.receive_message(QueueUrl=url)
    assert code(ei.value) == "AccessDenied"
    with pytest.raises(ClientError) as ei:  # a queue's Policy is the admin's
        p.add_permission(QueueUrl=url, Label="l", AWSAccountIds=["1"], Actions=["*"])
    assert code(ei.value) == "AccessDenied"
    r = httpx.delete(cluster.master_url + f"/v1/auth/credentials/{producer['id']}",
                     headers=ADMIN)
    assert r.status_code == 200

    def refused() -> bool:
        try:
            p.send_message(QueueUrl=url, MessageBody="after revocation")
        except ClientError as e:
            return code(e) == "InvalidClientTokenId"
        return False
    wait_for(refused, timeout=90)  # the next heartbeat, at the latest the key cache's minute
    expired = sqs_client(node, mint_key(cluster.master_url, "admin", ttl_secs=1))
    codes: list[str] = []

    def expired_refused() -> bool:
        try:
            expired.list_queues()
        except ClientError as e:
            codes.append(code(e))
            return True
        return False
    wait_for(expired_refused, timeout=30, what="the one-second key refused")
    assert codes == ["InvalidClientTokenId"]


def test_cli_mints_an_sqs_key(cluster: Any) -> None:
    from typer.testing import CliRunner

    from squall.client.cli import app as cli_app
    r = CliRunner().invoke(cli_app, ["auth", "mint", "--role", "admin", "--sqs", "--master",
                                     cluster.master_url])
    assert r.exit_code == 0, r.output
    env = dict(line.removeprefix("export ").split("=", 1) for line in r.stdout.split("\n")
               if line.startswith("export "))
    s = boto3.client("sqs", endpoint_url=cluster.node_url(2), region_name=REGION,
                     aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    assert s.create_queue(QueueName="cli-made")["QueueUrl"].endswith("/default/cli-made")


def test_dev_profile(cluster: Any) -> None:
    prof = cluster.sqs_profile()
    assert prof == cluster.sqs_profile()  # kept
    s = boto3.client("sqs", endpoint_url=prof["AWS_ENDPOINT_URL_SQS"],
                     region_name=prof["AWS_DEFAULT_REGION"],
                     aws_access_key_id=prof["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=prof["AWS_SECRET_ACCESS_KEY"])
    s.create_queue(QueueName="dev-made")


# -- aiobotocore ---------------------------------------------------------------------------
def test_aiobotocore(cluster: Any, key: dict[str, Any]) -> None:
    aiobotocore_session = pytest.importorskip("aiobotocore.session")

    async def main() -> None:
        session = aiobotocore_session.get_session()
        async with session.create_client(
                "sqs", endpoint_url=cluster.node_url(2), region_name=REGION,
                aws_access_key_id=key["access_key_id"],
                aws_secret_access_key=key["secret_access_key"]) as s:
            url = (await s.create_queue(QueueName="aio"))["QueueUrl"]
            await s.send_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "MessageBody": f"a{i}"} for i in range(3)])
            got = await s.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                          WaitTimeSeconds=5)
            assert sorted(m["Body"] for m in got["Messages"]) == ["a0", "a1", "a2"]
            await s.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                for i, m in enumerate(got["Messages"])])
            with pytest.raises(s.exceptions.QueueDoesNotExist):
                await s.get_queue_url(QueueName="aio-missing")
            with pytest.raises(s.exceptions.ReceiptHandleIsInvalid):
                await s.delete_message(QueueUrl=url, ReceiptHandle="nope")

    asyncio.run(main())


def test_requests_posted_to_a_queue_url(cluster: Any, key: dict[str, Any], sqs: Any) -> None:
    """Some clients post their JSON requests to the queue URL rather than to `/`."""
    url = sqs.create_queue(QueueName="posted")["QueueUrl"]
    creds = Credentials(key["access_key_id"], key["secret_access_key"])
    body = orjson.dumps({"QueueUrl": url, "MessageBody": "via the queue URL"})
    req = AWSRequest("POST", url, data=body, headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.SendMessage"})
    SigV4Auth(creds, "sqs", REGION).add_auth(req)
    r = httpx.post(url, content=body, headers=dict(req.headers))
    assert r.status_code == 200, r.text
    (m,) = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert m["Body"] == "via the queue URL"
    assert httpx.post(url, content=body, headers={"X-Amz-Target": "AmazonSQS.SendMessage"}
                      ).status_code == 403


def test_bad_input_is_a_4xx_never_a_500(cluster: Any, key: dict[str, Any], sqs: Any) -> None:
    from squall.datanode.sqs.actions import ACTIONS

    url = sqs.create_queue(QueueName="fuzz")["QueueUrl"]
    creds = Credentials(key["access_key_id"], key["secret_access_key"])
    node = cluster.node_url(1)
    bodies: list[bytes] = [b"", b"not json", b"[]", b'"s"', b"{}"]
    for doc in ({"QueueUrl": 5}, {"QueueUrl": url + "/x"}, {"QueueName": ["x"]},
                {"QueueUrl": url, "Entries": "x"}, {"QueueUrl": url, "Entries": [1]},
                {"QueueUrl": url, "Entries": [{"Id": "a"}]}, {"QueueUrl": url, "Tags": 3},
                {"QueueUrl": url, "MessageBody": 5}, {"QueueUrl": url, "Attributes": [1]},
                {"QueueUrl": url, "Attributes": {"VisibilityTimeout": 3}},
                {"QueueUrl": url, "MaxNumberOfMessages": "x", "WaitTimeSeconds": -1},
                {"QueueUrl": url, "MessageBody": "b", "MessageAttributes": {"a": 1}},
                {"QueueUrl": url, "MessageBody": "b", "MessageAttributes": {
                    "a": {"DataType": "Binary", "BinaryValue": "%%%"}}},
                {"QueueUrl": url, "ReceiptHandle": "sqh1.AAAA.BBBB", "VisibilityTimeout": 5},
                {"QueueUrl": url, "TagKeys": [1, 2]}, {"SourceArn": "arn:x"},
                {"QueueUrl": url, "AttributeNames": "All", "MessageAttributeNames": 7}):
        bodies.append(orjson.dumps(doc))
    with httpx.Client(timeout=60) as http:  # one client for the ~400 requests
        for action in ACTIONS:
            if action in ("DeleteQueue", "PurgeQueue"):
                continue
            for body in bodies:
                headers = {"Content-Type": "application/x-amz-json-1.0",
                           "X-Amz-Target": f"AmazonSQS.{action}"}
                req = AWSRequest("POST", node + "/", data=body, headers=headers)
                SigV4Auth(creds, "sqs", REGION).add_auth(req)
                r = http.post(node + "/", content=body, headers=dict(req.headers))
                assert r.status_code < 500, (action, body, r.text)
                if r.status_code >= 400:
                    assert "x-amzn-query-error" in r.headers and r.json()["message"], r.text


def test_imported_key(cluster: Any) -> None:
    """A key an application or a test suite already uses (moto's FOOBARKEY...) can be
    imported; its secret stays with the master like a minted one's key material."""
    r = httpx.post(cluster.master_url + "/v1/auth/sqs-keys", headers=ADMIN, json={
        "roles": ["admin"], "access_key_id": "FOOBARKEY", "secret_access_key": "FOOBARSECRET"})
    assert r.status_code == 200, r.text
    assert r.json()["access_key_id"] == "FOOBARKEY"
    s = sqs_client(cluster.node_url(2), {"access_key_id": "FOOBARKEY",
                                         "secret_access_key": "FOOBARSECRET"})
    assert s.create_queue(QueueName="imported")["QueueUrl"].endswith("/default/imported")
    with pytest.raises(ClientError) as ei:
        sqs_client(cluster.node_url(2), {"access_key_id": "FOOBARKEY",
                                         "secret_access_key": "WRONGSECRET"}).list_queues()
    assert code(ei.value) == "SignatureDoesNotMatch"
    again = httpx.post(cluster.master_url + "/v1/auth/sqs-keys", headers=ADMIN, json={
        "roles": ["admin"], "access_key_id": "FOOBARKEY", "secret_access_key": "other-one"})
    assert again.status_code == 400  # ids are unique
    r = httpx.post(cluster.master_url + "/v1/auth/sqs-keys", headers=ADMIN, json={
        "roles": ["admin"], "access_key_id": "ONLYID"})
    assert r.status_code == 400


def test_sqs_details_clients_notice(sqs: Any, sqs2: Any) -> None:
    """Behaviours of Amazon SQS that moto's suite checks and a client can see."""
    url = sqs.create_queue(QueueName="details")["QueueUrl"]
    # a bare queue name stands for the queue URL (in the key's group)
    sqs.send_message(QueueUrl="details", MessageBody="by name")
    # a receive with VisibilityTimeout 0 leaves the message visible (and counted)
    (m,) = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=5
                               )["Messages"]
    assert sqs2.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages"])["Attributes"]["ApproximateNumberOfMessages"] == "1"
    (m2,) = sqs2.receive_message(QueueUrl=url, AttributeNames=["ApproximateReceiveCount"],
                                 WaitTimeSeconds=5)["Messages"]
    assert m2["MessageId"] == m["MessageId"]
    assert m2["Attributes"]["ApproximateReceiveCount"] == "2"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m2["ReceiptHandle"])
    # an unknown queue is named before a bad receipt handle
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs.delete_message(QueueUrl=url + "-nope", ReceiptHandle="unknown")
    # a deleted queue that held messages is neither listed nor found
    sqs.delete_queue(QueueUrl=url)
    assert "QueueUrls" not in sqs.list_queues(QueueNamePrefix="details")
    with pytest.raises(sqs.exceptions.QueueDoesNotExist):
        sqs2.get_queue_url(QueueName="details")
    # RedrivePolicy: maxReceiveCount sent as a string is answered as a number
    dlq = sqs.create_queue(QueueName="details-dlq")["QueueUrl"]
    arn = sqs.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"]
                                   )["Attributes"]["QueueArn"]
    src = sqs.create_queue(QueueName="details-src")["QueueUrl"]
    sqs.set_queue_attributes(QueueUrl=src, Attributes={"RedrivePolicy": orjson.dumps(
        {"deadLetterTargetArn": arn, "maxReceiveCount": "3"}).decode()})
    got = sqs2.get_queue_attributes(QueueUrl=src, AttributeNames=["RedrivePolicy"])
    assert orjson.loads(got["Attributes"]["RedrivePolicy"])["maxReceiveCount"] == 3
    # a FIFO queue's dead-letter queue is a FIFO queue
    with pytest.raises(ClientError) as ei:
        sqs.create_queue(QueueName="details-f.fifo", Attributes={
            "FifoQueue": "true", "RedrivePolicy": orjson.dumps(
                {"deadLetterTargetArn": arn, "maxReceiveCount": 2}).decode()})
    assert code(ei.value) == "InvalidParameterValue"
    # FIFO batches: a missing group id or deduplication id refuses the whole request
    fifo = sqs.create_queue(QueueName="details.fifo", Attributes={"FifoQueue": "true"}
                            )["QueueUrl"]
    with pytest.raises(ClientError) as ei:
        sqs.send_message_batch(QueueUrl=fifo, Entries=[
            {"Id": "a", "MessageBody": "x", "MessageGroupId": "g",
             "MessageDeduplicationId": "d"}, {"Id": "b", "MessageBody": "y"}])
    assert code(ei.value) == "MissingParameter"
    with pytest.raises(ClientError) as ei:
        sqs.send_message_batch(QueueUrl=fifo, Entries=[
            {"Id": "a", "MessageBody": "x", "MessageGroupId": "g"}])
    assert code(ei.value) == "InvalidParameterValue"
    assert "Messages" not in sqs.receive_message(QueueUrl=fifo)


def test_add_and_remove_permission_edit_the_policy(sqs: Any, sqs2: Any) -> None:
    """Stored in the queue's Policy as SQS writes it (not applied: docs/sqs.md)."""
    url = sqs.create_queue(QueueName="perms")["QueueUrl"]
    sqs.add_permission(QueueUrl=url, Label="one", AWSAccountIds=["111111111111"],
                       Actions=["SendMessage"])
    sqs.add_permission(QueueUrl=url, Label="two", AWSAccountIds=["222222222222"],
                       Actions=["*"])
    doc = orjson.loads(sqs2.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])[
        "Attributes"]["Policy"])
    assert doc["Id"] == "arn:aws:sqs:us-east-1:default:perms/SQSDefaultPolicy"
    assert [(st["Sid"], st["Action"], st["Principal"]["AWS"]) for st in doc["Statement"]] == [
        ("one", "SQS:SendMessage", "arn:aws:iam::111111111111:root"),
        ("two", "SQS:*", "arn:aws:iam::222222222222:root")]
    with pytest.raises(ClientError) as ei:
        sqs.add_permission(QueueUrl=url, Label="one", AWSAccountIds=["1"], Actions=["*"])
    assert code(ei.value) == "InvalidParameterValue"
    with pytest.raises(ClientError) as ei:
        sqs.add_permission(QueueUrl=url, Label="x", AWSAccountIds=["1"],
                           Actions=["DeleteQueue"])
    assert code(ei.value) == "InvalidParameterValue"
    sqs.remove_permission(QueueUrl=url, Label="one")
    sqs.remove_permission(QueueUrl=url, Label="two")
    assert "Attributes" not in sqs.get_queue_attributes(QueueUrl=url,
                                                        AttributeNames=["Policy"])
    with pytest.raises(ClientError) as ei:
        sqs.remove_permission(QueueUrl=url, Label="one")
    assert code(ei.value) == "InvalidParameterValue"
