"""Data node settings (the CLI fills them from flags and ``SQUALL_*`` variables)."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

from squall.common.security.auth import AuthKeys
from squall.common.security.files import private_dir
from squall.common.security.tls import TLSConfig

PARALLEL_MODES = {"auto": "auto", "1": "on", "on": "on", "0": "off", "off": "off"}


def parallel_mode(value: str | None) -> str:
    """SQUALL_FRONT_DOOR_PARALLEL as "auto", "on" or "off" (unset: "off")."""
    mode = PARALLEL_MODES.get((value or "off").strip().lower())
    if mode is None:
        raise ValueError(f"SQUALL_FRONT_DOOR_PARALLEL={value!r}: use auto, 1 (on) or 0 (off)")
    return mode


@dataclass
class DataNodeSettings:
    data_dir: str
    advertise_url: str  # base URL other nodes and clients reach this node at
    master_url: str | None = None  # None: no heartbeats (a standalone node, or tests)
    node_id: str | None = None  # None: the id persisted in data_dir (made on first start)
    cluster_key: bytes | None = None  # required: the master's cluster key (no default key)
    node_credential: str | None = None  # for heartbeats; else a token signed with cluster_key
    tls: TLSConfig = field(default_factory=TLSConfig)  # serving, and outgoing connections
    auth_keys: AuthKeys | None = None  # public keys of credentials (None: SQUALL_AUTH_PUBLIC_KEY*)
    allowed_hosts: tuple[str, ...] = ()  # Host names besides loopback and the advertised one
    public: tuple[str, ...] = ()  # "metrics": served without a credential
    body_timeout_s: float = 30.0  # longest wait for the next chunk of a request body
    heartbeat_interval_s: float = 3.0
    full_report_every: int = 20  # beats between full block reports
    chunk_bytes: int = 1 << 20
    txn_bytes: int = 8 << 20  # chunks committed per transaction while streaming in
    map_size: int = 1 << 30  # initial LMDB map; doubles on MapFullError ...
    map_size_max: int = 1 << 40  # ... up to this bound
    max_body_bytes: int = 64 << 20  # batch and JSON bodies (blob PUTs stream, unbounded)
    batch_blob_bytes_max: int = 16 << 20  # largest blob a batch-get returns
    scrub_bytes_per_s: float = 32 << 20
    scrub_interval_s: float = 3600.0  # pause between two full scrub passes
    node_token_ttl_s: float = 300.0  # node-signed replicate and heartbeat tokens
    peer_connect_timeout_s: float = 5.0
    peer_timeout_s: float = 60.0  # per read/write on node-to-node streams
    copies_max: int = 4  # replicate commands run at once
    repair_bytes_per_s: float = 0.0  # pace of re-replication copies sent (0: unpaced) ...
    repair_busy_bytes_per_s: float = 64e6  # ... and while clients use the node (repairpace)
    forward_queue_chunks: int = 4  # chunks buffered per peer while forwarding
    front_door_max_bytes: int = 64 << 10  # largest payload the front door takes
    sqs_region: str = "us-east-1"  # the region SigV4 requests to the SQS endpoint name
    # the parallel put (datanode/frontdoor.py, decisions 0028 and 0036): the enqueue goes
    # to the master (pending) while the payloads are stored. SQUALL_FRONT_DOOR_PARALLEL:
    # "auto" for a small request that finds no other front-door request on this node (a
    # client waiting for each put), "1" ("on") for every small request, "0" ("off", the
    # default: a task put is then available as soon as its put is answered)
    front_door_parallel: str = field(
        default_factory=lambda: parallel_mode(os.environ.get("SQUALL_FRONT_DOOR_PARALLEL")))

    def resolve_node_id(self) -> str:
        """The configured id, else the one stored in ``data_dir/node_id`` (created once)."""
        if self.node_id:
            return self.node_id
        private_dir(self.data_dir)
        path = os.path.join(self.data_dir, "node_id")
        try:
            with open(path) as f:
                nid = f.read().strip()
            if nid:
                return nid
        except FileNotFoundError:
            pass
        nid = "dn-" + uuid.uuid4().hex[:12]
        tmp = path + ".tmp"
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(nid + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return nid
