"""`squall datanode`: run a data node."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from squall.datanode.config import DataNodeSettings


def serve(settings: DataNodeSettings, host: str, port: int) -> None:
    import uvicorn

    from squall.datanode.app import create_datanode_app

    uvicorn.run(create_datanode_app(settings), host=host, port=port, loop="uvloop",
                http="httptools", access_log=False, log_level="warning", lifespan="on")


def register(app: typer.Typer) -> None:
    @app.command("datanode")
    def datanode(
        master: str = typer.Option("", "--master", envvar="SQUALL_MASTER",
                                   help="master base URL for heartbeats (empty: none)"),
        data_dir: Path = typer.Option(Path(".squall/datanode"), "--data-dir",
                                      envvar="SQUALL_DATA_DIR", help="where blobs live"),
        host: str = typer.Option("127.0.0.1", envvar="SQUALL_HOST", help="address to bind"),
        port: int = typer.Option(7071, envvar="SQUALL_PORT", help="port to listen on"),
        advertise: str = typer.Option("", "--advertise", envvar="SQUALL_ADVERTISE",
                                      help="URL others reach this node at "
                                           "(default http://HOST:PORT)"),
        node_id: str = typer.Option("", "--node-id", envvar="SQUALL_NODE_ID",
                                    help="node id (default: made once, kept in --data-dir)"),
        cluster_key_file: str = typer.Option("", "--cluster-key-file",
                                             envvar="SQUALL_CLUSTER_KEY_FILE",
                                             help="file holding the cluster key (else "
                                                  "SQUALL_CLUSTER_KEY, else a dev key)"),
        heartbeat_interval_s: float = typer.Option(3.0, envvar="SQUALL_HEARTBEAT_INTERVAL_S",
                                                  min=0.001),
        full_report_every: int = typer.Option(20, envvar="SQUALL_FULL_REPORT_EVERY",
                                              help="beats between full block reports"),
        map_size_max: int = typer.Option(1 << 40, envvar="SQUALL_MAP_SIZE_MAX",
                                         help="bound on the LMDB map, in bytes"),
        scrub_bytes_per_s: float = typer.Option(32 << 20, envvar="SQUALL_SCRUB_BYTES_PER_S",
                                                help="scrubber read rate (0: off)"),
        scrub_interval_s: float = typer.Option(3600.0, envvar="SQUALL_SCRUB_INTERVAL_S",
                                               help="pause between scrub passes"),
        copies_max: int = typer.Option(4, envvar="SQUALL_COPIES_MAX", min=1,
                                       help="re-replication commands this node runs at once"),
        repair_bytes_per_s: float = typer.Option(
            0.0, envvar="SQUALL_REPAIR_BYTES_PER_S", min=0.0,
            help="pace the re-replication copies this node sends (bytes/s; 0: unpaced)"),
    ) -> None:
        """Run a data node: LMDB blob store, replication, heartbeats to the master."""
        from squall.common.tokens import load_cluster_key

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per peer request
        settings = DataNodeSettings(
            data_dir=str(data_dir), advertise_url=advertise or f"http://{host}:{port}",
            master_url=master or None, node_id=node_id or None,
            cluster_key=load_cluster_key(cluster_key_file or None),
            heartbeat_interval_s=heartbeat_interval_s, full_report_every=full_report_every,
            map_size=min(1 << 30, map_size_max), map_size_max=map_size_max,
            scrub_bytes_per_s=scrub_bytes_per_s, scrub_interval_s=scrub_interval_s,
            copies_max=copies_max, repair_bytes_per_s=repair_bytes_per_s)
        serve(settings, host, port)
