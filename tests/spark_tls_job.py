"""A Spark job run by ``tests/test_spark_tls.py`` in a process of its own, whose environment
has no ``SQUALL_*`` variable (so neither has its JVM nor its executors' Python workers):
the master's URL, the credential and the TLS material come from Spark conf and data source
options only. It writes, reads and runs a stage against a cluster served over mutual TLS
with a private CA, records the data nodes' request counters around each step, looks for
the credentials in the plans and the UI's environment, and prints one JSON line.

    python -m tests.spark_tls_job ARGS.json
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import ssl
import sys
import urllib.request
from typing import Any

import httpx

from squall.client.spark import local_session, run_stage, save

SQUALL_ENV = re.compile(r"^SQUALL_")
METRIC = re.compile(r'^squall_datanode_http_requests_total\{method="(\w+)",'
                    r'route="([^"]+)",status="2xx"\} ([0-9.e+]+)$')


def expected(i: int) -> bytes:
    return (hashlib.sha256(str(i).encode()).hexdigest() * 32).encode()  # 2 KiB


def squall_env() -> list[str]:
    import os

    return sorted(k for k in os.environ if k.startswith("SQUALL_"))


def reverse(data: bytes) -> bytes:
    return data[::-1]


class Nodes:
    """The data nodes' request counters (batch reads, single reads), over mutual TLS."""

    def __init__(self, urls: list[str], ca: str, cert: str, key: str, token: str) -> None:
        self.urls = urls
        self.ctx = ssl.create_default_context(cafile=ca)
        self.ctx.load_cert_chain(cert, key)
        self.headers = {"Authorization": f"Bearer {token}"}

    def counts(self) -> dict[str, float]:
        out = {"batch_get": 0.0, "get": 0.0}
        for u in self.urls:
            text = httpx.get(u + "/metrics", headers=self.headers, verify=self.ctx,
                             timeout=10).text
            for line in text.splitlines():
                m = METRIC.match(line)
                if m and (m[1], m[2]) == ("POST", "/v1/blobs:batch-get"):
                    out["batch_get"] += float(m[3])
                elif m and (m[1], m[2]) == ("GET", "/v1/blobs/{blob_id}"):
                    out["get"] += float(m[3])
        return out


def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: b[k] - a[k] for k in a}


def explains(df: Any) -> str:
    qe = df._jdf.queryExecution()
    utils = df.sparkSession._jvm.PythonSQLUtils
    return "\n".join(utils.explainString(qe, m)
                     for m in ("simple", "extended", "codegen", "cost", "formatted"))


def main(a: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"driver_env": [k for k in os.environ if SQUALL_ENV.match(k)]}
    n, src, sink = a["n"], "tls#in", "tls#out"
    with open(a["key_file"]) as f:
        key_pem = f.read()
    spark = local_session("squall-tls", "local[2,2]", ui=True, conf={
        "spark.ui.port": "0", "spark.local.dir": a["scratch"],
        "spark.squall.master": a["master"], "spark.squall.token": a["conf_token"],
        "spark.squall.tls_ca": a["ca"], "spark.squall.tls_cert": a["cert"],
        "spark.squall.tls_key_secret": key_pem})
    sc = spark.sparkContext
    nodes = Nodes(a["nodes"], a["ca"], a["cert"], a["key_file"], a["conf_token"])
    try:
        out["executor_env"] = sc.parallelize(range(2), 2).map(lambda _: squall_env()).collect()

        from pyspark.sql import functions as F

        df = (spark.range(n, numPartitions=2)
              .select(F.format_string("k%05d", "id").alias("pid"),
                      F.expr("cast(repeat(sha2(cast(id as string), 256), 32) as binary)")
                      .alias("payload")))
        c0 = nodes.counts()
        st = save(df, src, pid="pid", payload="payload")
        out["written"] = st.added

        # a read with the credential as an option (not the conf's): it wins
        c1 = nodes.counts()
        rd = (spark.read.format("squall").option("queue", src).option("with_payload", "true")
              .option("token", a["option_token"]).load())
        out["explain"] = explains(rd)
        rows = rd.select("pid", "payload").collect()
        out["read_rows"] = len(rows)
        out["read_bad"] = [r.pid for r in rows if bytes(r.payload) != expected(int(r.pid[1:]))]
        out["read_partitions"] = rd.rdd.getNumPartitions()
        c2 = nodes.counts()

        res = run_stage(spark, src, reverse, sink, parallelism=2, batch_size=100,
                        timeout_s=180)
        out["stage"] = {"done": res.done, "failed": res.failed, "lost": res.lost}
        c3 = nodes.counts()
        moved = (spark.read.format("squall").option("queue", sink)
                 .option("with_payload", "true").load().select("pid", "payload").collect())
        out["sink_rows"] = len(moved)
        out["sink_bad"] = [r.pid for r in moved
                           if bytes(r.payload) != expected(int(r.pid[1:]))[::-1]]
        out["requests"] = {"write": delta(c0, c1), "read": delta(c1, c2),
                           "stage": delta(c2, c3)}

        # an option overrides the conf: a wrong credential there is refused
        try:
            spark.read.format("squall").option("queue", sink).option("token", "bogus") \
                .load().count()
            out["bogus_token"] = "accepted"
        except Exception as e:
            out["bogus_token"] = str(e)[-2000:]

        store = spark._jsparkSession.sharedState().statusStore().executionsList()
        out["sql_plans"] = "\n".join(
            f"{e.description()}\n{e.physicalPlanDescription()}"
            for e in (store.apply(i) for i in range(store.size())))
        url = sc.uiWebUrl
        with urllib.request.urlopen(f"{url}/api/v1/applications/{sc.applicationId}/"
                                    "environment", timeout=30) as r:
            out["ui_environment"] = r.read().decode()
    finally:
        spark.stop()
    return out


if __name__ == "__main__":
    with open(sys.argv[1]) as f:
        args = json.load(f)
    print("SQUALL-JOB-RESULT " + json.dumps(main(args)), flush=True)
