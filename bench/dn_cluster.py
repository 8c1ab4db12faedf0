"""A master and data nodes as real processes for the data node benchmark, and the client
side of the payload paths (allocate → write → enqueue with receipts; lease → read →
dequeue), written against the wire protocol with ``common/wire/payload.py``'s helpers.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from bench.harness import AUTH, Server, free_port, proc_cpu_s
from squall.common.transport.adapters import SyncTransport
from squall.common.wire import payload
from squall.common.wire.cluster import BatchPutResult, PutResult
from tests import blobhttp

KEY = "bench-cluster-key-0123456789abcdef"
ENV = {"SQUALL_CLUSTER_KEY": KEY}
GROUP = "dnbench"
JSON_H = {"content-type": "application/json"}
MIB = 1 << 20


@dataclass
class ClusterSpec:
    nodes: int = 3
    rf: int = 2
    beat_s: float = 3.0  # the default; R uses a short profile (0.5 s)
    copies_per_node: int = 5000  # the master's --max-copies-per-node (blobs in flight)
    repair_bytes: int = 64 << 20  # the master's --max-repair-bytes-per-node
    node_extra: tuple[str, ...] = ()
    masters: int = 1  # 3 (or 5): a master set on a quorum-replicated log (a file lease elects)


@dataclass
class Cluster:
    spec: ClusterSpec
    tmp: Path
    master: Server | None = None  # a master set's leader
    nodes: list[Server] = field(default_factory=list)
    members: list[Server] = field(default_factory=list)  # a master set's members

    def _master_set(self, argv: list[str], logs: Path, timeout: float) -> Server:
        """Start the members of a master set; the one that leads."""
        ports = [free_port() for _ in range(self.spec.masters)]
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for k, port in enumerate(ports):
            m: Server = FixedServer(f"master{k}", [
                *(a.replace("{port}", str(port)) for a in argv),
                "--data-dir", str(self.tmp / f"master{k}"), "--members", ",".join(urls),
                "--advertise-url", urls[k], "--elector", f"file:{self.tmp / 'master.lease'}",
                "--elector-lease-s", "3"], logs / f"master{k}.log")
            m.port = port
            self.members.append(m.start())
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=5.0) as c:
            while time.monotonic() < deadline:
                for m in self.members:
                    with contextlib.suppress(httpx.TransportError):
                        if c.get(m.url + "/readyz").status_code == 200:
                            return m
                time.sleep(0.1)
        raise TimeoutError("no member of the master set became the leader")

    def start(self, timeout: float = 120.0) -> Cluster:
        s = self.spec
        logs = self.tmp / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "squall.master", "--port", "{port}", "--fsync",
                "--replication-factor", str(s.rf), "--heartbeat-interval-s", str(s.beat_s),
                "--max-copies-per-node", str(s.copies_per_node),
                "--max-repair-bytes-per-node", str(s.repair_bytes)]
        if s.masters == 1:
            self.master = EnvServer("master", [*argv, "--data-dir", str(self.tmp / "master")],
                                    logs / "master.log")
            self.master.start()
            self.master.wait_serving(timeout=timeout)
        else:
            self.master = self._master_set(argv, logs, timeout)
        masters = ",".join(m.url for m in self.members) if self.members else self.master.url
        for i in range(s.nodes):
            n = EnvServer(f"dn{i}", [
                sys.executable, "-m", "squall.datanode", "--data-dir", str(self.tmp / f"dn{i}"),
                "--port", "{port}", "--advertise", "http://127.0.0.1:{port}", "--master",
                masters, "--heartbeat-interval-s", str(s.beat_s), *s.node_extra],
                logs / f"dn{i}.log")
            self.nodes.append(n.start())
        for node in self.nodes:
            node.wait_serving(timeout=timeout)
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.master.url, timeout=10, headers=AUTH) as c:
            while self.alive(c) < s.nodes:
                if time.monotonic() > deadline:
                    raise TimeoutError("data nodes did not all heartbeat in time")
                time.sleep(0.05)
        return self

    def info(self, c: httpx.Client) -> dict[str, Any]:
        return dict(c.get(self.url + "/v1/cluster").json())

    def alive(self, c: httpx.Client) -> int:
        return sum(n["state"] == "alive" for n in self.info(c)["nodes"])

    @property
    def url(self) -> str:
        assert self.master is not None
        return self.master.url

    def node_by_url(self, url: str) -> Server:
        return next(n for n in self.nodes if n.url == url.rstrip("/"))

    def pids(self) -> dict[str, int]:
        out = {n.name: n.pid for n in self.nodes if n.proc and n.proc.poll() is None}
        for m in self.members:  # a master set: every member's CPU counts
            if m.proc and m.proc.poll() is None:
                out[m.name] = m.pid
        if self.master and self.master.proc and not self.members:
            out["master"] = self.master.pid
        return out

    def stop(self) -> None:
        for n in [*self.nodes, *(self.members or ([self.master] if self.master else []))]:
            with contextlib.suppress(Exception):
                n.terminate(30)


class EnvServer(Server):
    """A server process started with the cluster key in its environment."""

    def start(self) -> Server:
        self.port = free_port()
        argv = [a.replace("{port}", str(self.port)) for a in self.argv]
        with open(self.log_path, "ab") as log:
            self.t_start = time.perf_counter()
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **ENV})
        return self


class FixedServer(EnvServer):
    """An :class:`EnvServer` on a port chosen before it starts (a master set's members
    name each other)."""

    def start(self) -> Server:
        with open(self.log_path, "ab") as log:
            self.t_start = time.perf_counter()
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **ENV})
        return self


@contextlib.contextmanager
def running_cluster(spec: ClusterSpec, tmp: Path) -> Iterator[Cluster]:
    c = Cluster(spec, tmp)
    try:
        yield c.start()
    finally:
        c.stop()


class CpuMeter:
    """CPU seconds of the servers (and this process) over a block."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.used: dict[str, float] = {}

    @contextlib.contextmanager
    def measure(self) -> Iterator[CpuMeter]:
        import resource

        def me() -> float:
            r = resource.getrusage(resource.RUSAGE_SELF)
            return r.ru_utime + r.ru_stime

        t0 = {k: proc_cpu_s(p) for k, p in self.pids.items()}
        c0 = me()
        try:
            yield self
        finally:
            self.used = {k: round(proc_cpu_s(p) - t0[k], 2) for k, p in self.pids.items()}
            self.used["client"] = round(me() - c0, 2)


# -- the client side of the payload paths --------------------------------------------------
class Payloads:
    """One client: an ``httpx.Client`` with keep-alive to the master and the data nodes."""

    def __init__(self, master_url: str, queue: str, timeout: float = 120.0) -> None:
        self.master = master_url
        self.queue = queue
        self.http = httpx.Client(timeout=timeout, limits=httpx.Limits(
            max_connections=32, max_keepalive_connections=32))
        self.downloads = httpx.Client(timeout=timeout, transport=SyncTransport(
            ssl.create_default_context(), 32, max_connections=32))
        self.fast_get = True  # blob GETs through the engine (common/transport), else httpx's
        self.phases: dict[str, float] = {}  # seconds spent per step, for the breakdown

    def _took(self, phase: str, t0: float) -> float:
        now = time.perf_counter()
        self.phases[phase] = self.phases.get(phase, 0.0) + now - t0
        return now

    def close(self) -> None:
        self.http.close()
        self.downloads.close()

    def _post(self, path: str, body: Any) -> Any:
        r = self.http.post(self.master + path, content=orjson.dumps(body),
                           headers={**JSON_H, **AUTH})
        if r.status_code != 200:
            raise RuntimeError(f"POST {path}: {r.status_code} {r.text[:300]}")
        return orjson.loads(r.content)

    def allocate(self, count: int, size: int) -> dict[str, Any]:
        return dict(self._post("/v1/blobs/allocate", {"count": count, "size_bytes": size}))

    def enqueue(self, tasks: list[dict[str, Any]]) -> None:
        self._post(f"/v1/groups/{GROUP}/queues/{self.queue}/tasks", {"tasks": tasks})

    def put(self, pid: str, data: bytes) -> PutResult:
        """allocate 1 → PUT to the first replica (it forwards) → enqueue with receipts."""
        t = time.perf_counter()
        a = self.allocate(1, len(data))
        t = self._took("allocate", t)
        b = a["blobs"][0]
        res = blobhttp.put_blob(self.http, b["replicas"][0], b["blob_id"], data, a["token"],
                               replicas=b["replicas"][1:])
        t = self._took("write", t)
        self.enqueue([{"pid": pid, "payload": _ref(res)}])
        self._took("enqueue", t)
        return res

    def put_batch(self, pids: list[str], datas: list[bytes]) -> BatchPutResult:
        """allocate n → one batch-put → one enqueue of n."""
        t = time.perf_counter()
        a = self.allocate(len(pids), max(len(d) for d in datas))
        t = self._took("allocate", t)
        reps = a["blobs"][0]["replicas"]
        ids = [b["blob_id"] for b in a["blobs"]]
        res = blobhttp.put_batch(self.http, reps[0], zip(ids, datas, strict=True), a["token"],
                                replicas=reps[1:])
        t = self._took("write", t)
        self.enqueue([{"pid": p, "payload": _ref(r)}
                      for p, r in zip(pids, res.blobs, strict=True)])
        self._took("enqueue", t)
        return res

    def lease(self, n: int) -> list[dict[str, Any]]:
        t = time.perf_counter()
        ans = self._post(f"/v1/groups/{GROUP}/queues/{self.queue}/lease",
                         {"max_tasks": n, "lease_secs": 600})
        out = list(ans["tasks"])
        for task in out:  # one read token covers the answer's payloads
            if task["payload"] is not None:
                task["payload"]["token"] = ans["read_token"]
        self._took("lease", t)
        return out

    def dequeue(self, tasks: list[dict[str, Any]]) -> None:
        t = time.perf_counter()
        self._post(f"/v1/groups/{GROUP}/update", {"dequeue": [
            {"queue": self.queue, "pid": t["pid"], "token": t["token"]} for t in tasks]})
        self._took("dequeue", t)

    def get(self, task: dict[str, Any]) -> int:
        """Read a leased task's payload (checksum verified); its size."""
        p = task["payload"]
        t = time.perf_counter()
        data = blobhttp.get_blob(self.downloads if self.fast_get else self.http,
                                p["replicas"][0], p["blob_id"], p["token"])
        self._took("read", t)
        if len(data) != p["size"]:
            raise RuntimeError(f"{p['blob_id']}: {len(data)} bytes, expected {p['size']}")
        return len(data)

    def get_batch(self, tasks: list[dict[str, Any]]) -> int:
        """Read many leased payloads with batch-gets (one per first replica); bytes read."""
        by_node: dict[str, list[dict[str, Any]]] = {}
        for t in tasks:
            by_node.setdefault(t["payload"]["replicas"][0], []).append(t["payload"])
        n = 0
        t0 = time.perf_counter()
        for node, ps in by_node.items():
            got = blobhttp.get_batch(self.http, node, [p["blob_id"] for p in ps],
                                    [p["token"] for p in ps])
            for p in ps:
                f = got[p["blob_id"]]
                if f.status != payload.OK or len(f.data) != p["size"]:
                    raise RuntimeError(f"{p['blob_id']}: status {f.status}")
                n += len(f.data)
        self._took("read", t0)
        return n


def _ref(res: Any) -> dict[str, Any]:
    return {"blob_id": res.blob_id, "size": res.size, "crc32c": res.crc32c,
            "replicas": [s.address for s in res.stored],
            "receipts": [s.receipt for s in res.stored]}
