"""The master's records of the data nodes (one :class:`Node` per node, soft state rebuilt
from heartbeats) and the cluster's settings; :mod:`squall.master.cluster.state` keeps the table."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ClusterSettings:
    replication_factor: int = 2
    write_quorum: int = 0  # 0: all of the replica set
    heartbeat_interval_s: float = 3.0
    dead_after_beats: int = 3
    max_copies_per_node: int = 5000  # blobs in flight per node (source and target)
    max_repair_bytes_per_node: int = 64 << 20  # bytes of copies in flight per node
    orphan_grace_s: float = 600.0
    blob_scan_grace_s: float = 0.0  # 0: (dead_after_beats + 2) heartbeats after start
    blob_scan_interval_s: float = 600.0  # between passes of the unreported-blob scan
    blob_scan_batch: int = 5000  # blob ids the scan reads per tick

    def __post_init__(self) -> None:
        if self.replication_factor < 1:
            raise ValueError("replication_factor must be at least 1")
        if not 0 <= self.write_quorum <= self.replication_factor:
            raise ValueError(f"write_quorum {self.write_quorum} must be 0 (all of the replica "
                             f"set) up to the replication factor {self.replication_factor}")
        if not self.heartbeat_interval_s > 0:
            raise ValueError(f"heartbeat_interval_s must be > 0, not {self.heartbeat_interval_s}")

    @property
    def quorum(self) -> int:
        return self.write_quorum or self.replication_factor


@dataclass
class Node:
    node_id: str
    address: str
    started_at: float
    last_beat: float
    capacity_bytes: int = 0
    used_bytes: int = 0
    free_bytes: int = 0
    blob_count: int = 0
    dead: bool = False
    blobs: set[str] = field(default_factory=set)
    reported_full: bool = False  # a full block report arrived since it (re)joined
    # blobs receipts (copies, writes) proved it holds since its last beat: its next report
    # may have been made before they landed, so a full one that lacks them drops nothing
    vouched: set[str] = field(default_factory=set)
    drain_remaining: int = -1  # draining: blobs still short of RF elsewhere (-1: not known)
    # of those, blobs allocated but not (yet) committed by an enqueue: the drain waits for
    # their commit or the end of their orphan grace (at `drain_uncommitted_until`)
    drain_uncommitted: int = 0
    drain_uncommitted_until: float = 0.0
    block_grants: list[float] = field(default_factory=list)  # front-door block expiries
