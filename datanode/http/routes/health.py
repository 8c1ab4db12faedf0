"""Liveness, readiness and Prometheus metrics of a data node (no token needed)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from starlette.responses import Response

from squall.common.errors import Unavailable
from squall.common.security import auth
from squall.common.server import runtime
from squall.common.server.http import JSON
from squall.common.server.metrics import Exposition, build_info
from squall.datanode.http.deps import NodeDep
from squall.datanode.service import DataNode


async def healthz() -> JSON:
    """The process is up."""
    return JSON({"ok": True})


async def readyz(node: NodeDep) -> JSON:
    """The store is open and its writer runs."""
    if not node.ready():
        raise Unavailable("the blob store is not open", retry_after=1)
    hb = node.heartbeat
    return JSON({"ok": True, "node_id": node.node_id, "address": node.address,
                 "master_reachable": bool(hb and hb.last_ok_at)})


class NodeCollector:
    """Reads the node's counters at scrape time."""

    def __init__(self, node: DataNode) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric | str]:
        n, s = self.node, self.node.store
        sp = s.space()
        cred = n.settings.node_credential
        exp = auth.credential_expiry(cred) if cred else None
        if exp is not None:  # alert well before it runs out (docs/kubernetes.md)
            yield GaugeMetricFamily("squall_datanode_credential_expiry_seconds",
                                    "seconds until this node's node credential expires",
                                    value=exp - n.clock.now())
        yield GaugeMetricFamily("squall_datanode_blobs", "blobs stored", value=sp.blob_count)
        yield GaugeMetricFamily("squall_datanode_used_bytes", "payload bytes stored",
                                value=sp.used_bytes)
        yield GaugeMetricFamily("squall_datanode_free_bytes", "bytes it can still take",
                                value=sp.free_bytes)
        yield GaugeMetricFamily("squall_datanode_map_bytes", "LMDB map size",
                                value=s.env.map_size)
        yield GaugeMetricFamily("squall_datanode_uploads_in_progress",
                                "blob uploads neither committed nor aborted",
                                value=s.uploads_open)
        for name, doc, value in (
            ("puts", "blobs written (client and replica writes)", n.puts),
            ("gets", "blob reads", n.gets),
            ("forwarded", "copies forwarded to peers", n.forwarded),
            ("peer_errors", "forwarding errors", n.peer_errors),
            ("bytes_written", "payload bytes committed", s.bytes_written),
            ("bytes_read", "payload bytes read and verified", s.bytes_read),
            ("corrupt_replicas", "replicas found corrupt and dropped", s.corrupt_found),
            ("commits", "LMDB write transactions", s.env.commits),
            ("syncs", "LMDB syncs (group commits)", s.env.syncs),
            ("write_failures", "failed writes (disk full, I/O)", s.env.failures),
            ("preallocations", "data file extensions ahead of LMDB", s.env.tail.preallocs),
            ("repair_write_ops", "write ops of repair copies (behind client writes)",
             s.env.background_ops),
            ("repair_pace_wait_seconds", "time repair copies sent waited for their pace",
             n.repair_pacer.waited_s),
            ("write_ops_seconds", "writer time running write ops", s.env.ops_seconds),
            ("commit_seconds", "writer time in LMDB commits (page writes + data sync)",
             s.env.commit_seconds),
            ("sync_seconds", "writer time syncing the meta page", s.env.sync_seconds),
            ("heartbeats", "heartbeats answered", n.heartbeat.beats if n.heartbeat else 0),
            ("heartbeat_failures", "failed heartbeats",
             n.heartbeat.failures if n.heartbeat else 0),
            ("scrubbed_bytes", "bytes re-verified by the scrubber",
             n.scrubber.bytes_checked if n.scrubber else 0),
            ("scrubbed_blobs", "blobs re-verified by the scrubber",
             n.scrubber.blobs_checked if n.scrubber else 0),
            ("scrub_passes", "scrubber passes over every blob completed",
             n.scrubber.passes if n.scrubber else 0),
            ("scrub_corrupt", "corrupt replicas the scrubber found",
             n.scrubber.corrupt_found if n.scrubber else 0),
        ):
            yield CounterMetricFamily(f"squall_datanode_{name}", doc, value=value)
        yield build_info("squall_datanode")
        http = getattr(self.node, "http_stats", None)
        if http is not None:
            yield from http.collect("squall_datanode")
        yield runtime.metric()


async def metrics(node: NodeDep) -> Response:
    """Prometheus metrics: the node's counters, HTTP requests and latency per route
    (reads: GET blobs, writes: PUT blobs, replication: PUT replicate), process and Python."""
    if node.metrics_registry is None:
        node.metrics_registry = Exposition(NodeCollector(node).collect)
    data = await node.store.run(node.metrics_registry.body)
    return Response(data, media_type=CONTENT_TYPE_LATEST)
