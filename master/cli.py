"""`squall master`: run a master server."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from squall.master.cluster import ClusterSettings
from squall.master.service import MasterSettings


def serve(settings: MasterSettings, host: str, port: int) -> None:
    import uvicorn

    from squall.master.app import create_master_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    uvicorn.run(create_master_app(settings), host=host, port=port, loop="uvloop",
                http="httptools", access_log=False, log_level="warning", lifespan="on")


def register(app: typer.Typer) -> None:
    @app.command("master")
    def master(
        data_dir: Path = typer.Option(Path(".squall/master"), "--data-dir",
                                      envvar="SQUALL_DATA_DIR",
                                      help="where the WAL and the LMDB index live"),
        host: str = typer.Option("127.0.0.1", envvar="SQUALL_HOST", help="address to bind"),
        port: int = typer.Option(7070, envvar="SQUALL_PORT", help="port to listen on"),
        fsync: bool = typer.Option(True, envvar="SQUALL_FSYNC",
                                   help="fdatasync the WAL before answering (never turn off "
                                        "in production)"),
        checkpoint_interval_s: float = typer.Option(
            30.0, envvar="SQUALL_CHECKPOINT_INTERVAL_S", help="seconds between checkpoints"),
        replication_factor: int = typer.Option(
            2, envvar="SQUALL_REPLICATION_FACTOR", min=1, max=16,
            help="copies of every payload on distinct data nodes"),
        write_quorum: int = typer.Option(
            0, envvar="SQUALL_WRITE_QUORUM", min=0, max=16,
            help="durable copies a payload write needs before an enqueue may reference it "
                 "(0: all of the replica set)"),
        heartbeat_interval_s: float = typer.Option(
            3.0, envvar="SQUALL_HEARTBEAT_INTERVAL_S", help="data nodes' heartbeat period"),
        dead_after_beats: int = typer.Option(
            3, envvar="SQUALL_DEAD_AFTER_BEATS", min=1,
            help="missed heartbeats after which a data node is dead and re-replicated"),
        max_copies_per_node: int = typer.Option(
            4, envvar="SQUALL_MAX_COPIES_PER_NODE", min=1,
            help="re-replication copies in flight per source and per target node"),
        orphan_grace_s: float = typer.Option(
            600.0, envvar="SQUALL_ORPHAN_GRACE_S",
            help="how long a written but uncommitted payload is kept before collection"),
        index_sync: bool = typer.Option(
            True, envvar="SQUALL_INDEX_SYNC",
            help="fsync the LMDB index once per WAL group commit, so it survives a power "
                 "loss or kernel crash intact; --no-index-sync syncs it at checkpoints "
                 "only (faster, but a power loss can corrupt the index)"),
        cluster_key_file: Path | None = typer.Option(
            None, "--cluster-key-file", envvar="SQUALL_CLUSTER_KEY_FILE",
            help="file with the cluster's HMAC key (else SQUALL_CLUSTER_KEY, else a dev key)"),
    ) -> None:
        """Run a master: task metadata, leases, WAL + LMDB index, data-node placement."""
        cluster = ClusterSettings(
            replication_factor=replication_factor, write_quorum=write_quorum,
            heartbeat_interval_s=heartbeat_interval_s, dead_after_beats=dead_after_beats,
            max_copies_per_node=max_copies_per_node, orphan_grace_s=orphan_grace_s)
        settings = MasterSettings(
            data_dir=str(data_dir), fsync=fsync, checkpoint_interval_s=checkpoint_interval_s,
            index_sync=index_sync,
            cluster=cluster, cluster_key_file=str(cluster_key_file) if cluster_key_file else None)
        serve(settings, host, port)
