"""The SQS endpoint through boto3 against squall's native client, same cluster, same run.

    .venv/bin/python -m bench.sqs_bench [--n 300] [--rounds 2]

A `squall dev`-style cluster (master and 2 data nodes on loopback, replication factor 2).
Workloads, each alternating SQS and native for `--rounds` rounds (the median is kept):

- one:   N messages sent one request at a time (SendMessage / Client.put, small payloads:
         both take the data node's front door);
- batch: N messages in batches of 10 (SendMessageBatch / Client.put_many batch_size=10);
- drain: N messages received 10 at a time and deleted (ReceiveMessage 10 +
         DeleteMessageBatch / Client.lease(10, payloads=True) + done).

Prints messages/s and the ratio SQS/native (1.0 = as fast). ElasticMQ is not run: its jar
cannot be downloaded here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx


def one_round(sqs: Any, native: Any, url: str, nq: str, n: int, body: str,
              timed: Any) -> None:
    from squall.client import NewTask

    timed("one", "sqs", lambda: [sqs.send_message(QueueUrl=url, MessageBody=body)
                                 for _ in range(n)])
    timed("one", "native", lambda: [native.put(nq, body.encode()) for _ in range(n)])

    def sqs_batch() -> None:
        for _ in range(n // 10):
            sqs.send_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "MessageBody": body} for i in range(10)])

    timed("batch", "sqs", sqs_batch)
    timed("batch", "native", lambda: native.put_many(
        nq, [NewTask(payload=body.encode()) for _ in range(n)], batch_size=10, in_flight=1))

    def sqs_drain() -> None:
        got = 0
        while got < n:
            ms = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10).get("Messages", [])
            if not ms:
                break
            sqs.delete_message_batch(QueueUrl=url, Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(ms)])
            got += len(ms)

    def native_drain() -> None:
        got = 0
        while got < n:
            ts = native.lease(nq, 10, payloads=True)
            if not ts:
                break
            for t in ts:
                t.payload()
            native.done(ts)
            got += len(ts)

    timed("drain", "sqs", sqs_drain)
    timed("drain", "native", native_drain)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import boto3

    from squall.client import Client
    from tests.helpers import ADMIN, ADMIN_TOKEN, start_cluster

    results: dict[str, dict[str, list[float]]] = {}
    n = args.n

    def timed(name: str, side: str, fn: Any) -> None:
        t0 = time.perf_counter()
        fn()
        results.setdefault(name, {}).setdefault(side, []).append(
            n / (time.perf_counter() - t0))

    c = start_cluster(Path(tempfile.mkdtemp(prefix="sqsbench")), 2)
    try:
        key = httpx.post(c.master_url + "/v1/auth/sqs-keys", json={"roles": ["admin"]},
                         headers=ADMIN).json()
        sqs = boto3.client("sqs", endpoint_url=c.node_url(1), region_name="us-east-1",
                           aws_access_key_id=key["access_key_id"],
                           aws_secret_access_key=key["secret_access_key"])
        with Client(c.master_url, token=ADMIN_TOKEN) as native:
            for r in range(args.rounds):
                url = sqs.create_queue(QueueName=f"b{r}")["QueueUrl"]
                one_round(sqs, native, url, f"default#n{r}", n, "x" * 200, timed)
    finally:
        c.stop()
    print(f"{'workload':8} {'sqs msg/s':>10} {'native msg/s':>13} {'sqs/native':>10}")
    for name, sides in results.items():
        s, nat = statistics.median(sides["sqs"]), statistics.median(sides["native"])
        print(f"{name:8} {s:10.0f} {nat:13.0f} {s / nat:10.2f}")


if __name__ == "__main__":
    main()
