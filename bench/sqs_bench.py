"""The SQS endpoint against squall's own client, on the same cluster in the same run.

A master and 3 data nodes (`squall dev`'s defaults: replication factor 2, fsync on), 1 KiB
bodies. Each workload runs once through boto3 against a data node's SQS endpoint and once
through ``squall.client``, alternating, on queues of their own:

- S1   one message per call: ``SendMessage`` / ``Client.put``
- S10  ten per call: ``SendMessageBatch`` / ``Client.put_many(batch_size=10)``
- R10  ten per call: ``ReceiveMessage(10)`` then ``DeleteMessageBatch`` /
       ``Client.lease(10, payloads=True)`` then ``Client.done``

The ratio is SQS / native: the SQS path should cost at most one extra hop. ElasticMQ is not
measured: its jar comes from Maven Central or GitHub, neither reachable here.

Run ``python -m bench.sqs_bench [--quick]``; results in ``bench/results/sqs.md`` + ``.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.harness import AUTH, DEFAULT_OUT, free_port

BODY = b"x" * 1024


def _cluster(where: Path) -> Any:
    from squall.client.cli.dev import DevCluster

    c = DevCluster(where, free_port(), 3)
    c.start()
    return c


def _timed(n: int, limit_s: float, step: Callable[[], int]) -> tuple[int, float]:
    """Run `step` (which does some items and returns how many) until `n` items or the time
    limit; returns (items, seconds)."""
    done, t0 = 0, time.perf_counter()
    while done < n and time.perf_counter() - t0 < limit_s:
        done += step()
    return done, time.perf_counter() - t0


def run(n: int, limit_s: float) -> list[dict[str, Any]]:
    import boto3
    from botocore.config import Config

    from squall.client import Client

    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="squall-sqs-bench-") as tmp:
        cluster = _cluster(Path(tmp))
        try:
            r = httpx.post(cluster.master_url + "/v1/auth/sqs-keys",
                           json={"roles": ["admin"], "ttl_secs": 86400.0}, headers=AUTH)
            r.raise_for_status()
            key = r.json()
            sqs = boto3.client("sqs", endpoint_url=cluster.node_url(1), region_name="us-east-1",
                               aws_access_key_id=key["access_key_id"],
                               aws_secret_access_key=key["secret_access_key"],
                               config=Config(retries={"max_attempts": 1}))
            native = Client(cluster.master_url)
            body = BODY.decode()

            def sqs_queue(name: str) -> str:
                return str(sqs.create_queue(QueueName=name)["QueueUrl"])

            # S1
            u = sqs_queue("bench-s1")

            def s1_sqs() -> int:
                sqs.send_message(QueueUrl=u, MessageBody=body)
                return 1

            def s1_native() -> int:
                native.put("bench-n1", BODY)
                return 1

            rows.append(_pair("S1", "one message per call", n, limit_s, s1_sqs, s1_native))
            # S10
            u10 = sqs_queue("bench-s10")
            entries = [{"Id": str(i), "MessageBody": body} for i in range(10)]

            def s10_sqs() -> int:
                out = sqs.send_message_batch(QueueUrl=u10, Entries=entries)
                return len(out.get("Successful", []))

            def s10_native() -> int:
                return int(native.put_many("bench-n10", [BODY] * 10, batch_size=10))

            rows.append(_pair("S10", "ten messages per call", n, limit_s, s10_sqs,
                              s10_native))

            # R10: drain what S10 sent
            def r10_sqs() -> int:
                got = sqs.receive_message(QueueUrl=u10, MaxNumberOfMessages=10,
                                          WaitTimeSeconds=1).get("Messages", [])
                if got:
                    sqs.delete_message_batch(QueueUrl=u10, Entries=[
                        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                        for i, m in enumerate(got)])
                return len(got) or _empty()

            def r10_native() -> int:
                got = native.lease("bench-n10", 10, 60, payloads=True)
                if got:
                    native.done(got)
                return len(got) or _empty()

            drained = min(rows[-1]["sqs_items"], rows[-1]["native_items"])
            rows.append(_pair("R10", "receive ten + delete them", drained, limit_s, r10_sqs,
                              r10_native))
            native.close()
        finally:
            cluster.stop()
    return rows


class _Empty(Exception):
    pass


def _empty() -> int:
    raise _Empty


def _pair(rid: str, what: str, n: int, limit_s: float, via_sqs: Callable[[], int],
          via_native: Callable[[], int]) -> dict[str, Any]:
    out: dict[str, Any] = {"id": rid, "what": what}
    for name, step in (("sqs", via_sqs), ("native", via_native)):
        step()  # warm-up: connections, queue creation
        try:
            items, el = _timed(n, limit_s, step)
        except _Empty:
            items, el = n, limit_s
        out[f"{name}_items"] = items
        out[f"{name}_rate"] = items / el if el > 0 else 0.0
    out["ratio"] = out["sqs_rate"] / out["native_rate"] if out["native_rate"] else 0.0
    return out


def write(rows: list[dict[str, Any]], out: Path, quick: bool) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    stem = "sqs-quick" if quick else "sqs"
    (out / f"{stem}.json").write_text(json.dumps(rows, indent=2))
    lines = [f"# SQS endpoint vs squall's client ({dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC)",
             "", f"{platform.node()}, {os.cpu_count()} cores; master + 3 data nodes, RF 2, "
             "fsync on, 1 KiB bodies; boto3 against a data node's endpoint, squall.client "
             "against the master (front door on), same cluster, same run.", "",
             "| workload | what | SQS (boto3) msg/s | native msg/s | SQS / native |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['id']} | {r['what']} | {r['sqs_rate']:,.0f} | "
                     f"{r['native_rate']:,.0f} | {r['ratio']:.2f} |")
    lines += ["", "ElasticMQ is not measured: its jar is published on Maven Central and "
              "GitHub, which this machine cannot reach."]
    path = out / f"{stem}.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="300 messages per workload")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = p.parse_args(argv)
    n = 300 if a.quick else 3000
    rows = run(n, 60.0)
    print(write(rows, a.out, a.quick).read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
