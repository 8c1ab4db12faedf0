"""`squall datanode`: run a data node."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import typer

from squall.common.masters import parse_masters
from squall.common.security import auth
from squall.common.security.auth import (
    AUTH_KEY_ENV,
    AUTH_KEY_FILE_ENV,
    check_bind,
    load_public_keys,
)
from squall.common.security.files import ALLOW_SHARED_ENV, check_data_dir, private_umask
from squall.common.security.tls import TLSConfig
from squall.datanode.config import DataNodeSettings

NODE_CREDENTIAL_WARN_S = 30 * 86400.0  # log a warning at start when it expires sooner


def serve(settings: DataNodeSettings, host: str, port: int) -> None:
    import uvicorn

    from squall.common.server.runtime import serve_tuning
    from squall.common.server.serving import uvicorn_options
    from squall.datanode.http.app import create_datanode_app

    app = create_datanode_app(settings)
    serve_tuning()
    uvicorn.run(app, host=host, port=port, **uvicorn_options(settings.tls.uvicorn_kwargs()))


def register(app: typer.Typer) -> None:
    @app.command("datanode")
    def datanode(
        master: str = typer.Option("", "--master", envvar="SQUALL_MASTER",
                                   help="master base URL for heartbeats; a master set's "
                                        "members comma-separated (empty: none)"),
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
                                             help="file holding the master's cluster key "
                                                  "(else SQUALL_CLUSTER_KEY; required)"),
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
            help="pace the re-replication copies this node sends while no client uses it "
                 "(bytes/s; 0: unpaced)"),
        repair_busy_bytes_per_s: float = typer.Option(
            64e6, envvar="SQUALL_REPAIR_BUSY_BYTES_PER_S", min=0.0,
            help="pace of those copies while clients use this node, so that their requests "
                 "keep their latency (bytes/s, each blob counting 32 KiB more; 0: unpaced)"),
        auth_public_key_file: str = typer.Option(
            "", "--auth-public-key-file", envvar="SQUALL_AUTH_PUBLIC_KEY_FILE",
            help="public key(s) of credentials, one per line (squall auth pubkey; else "
                 "SQUALL_AUTH_PUBLIC_KEY; without one, routes for client credentials answer "
                 "401). A data node verifies credentials, it never holds the private key"),
        node_credential_file: str = typer.Option(
            "", "--node-credential-file", envvar="SQUALL_NODE_CREDENTIAL_FILE",
            help="this node's credential (squall auth mint --role node --node ID) for "
                 "heartbeats (else a token it signs with the cluster key)"),
        allowed_hosts: str = typer.Option(
            "", "--allowed-hosts", envvar="SQUALL_ALLOWED_HOSTS",
            help="comma-separated Host names besides loopback and --advertise ('*': any)"),
        sqs_region: str = typer.Option(
            "us-east-1", "--sqs-region", envvar="SQUALL_SQS_REGION",
            help="the region(s) SQS clients sign for, comma-separated ('*': any; "
                 "docs/sqs.md)"),
        public_metrics: bool = typer.Option(False, "--public-metrics",
                                            envvar="SQUALL_PUBLIC_METRICS",
                                            help="serve /metrics without a credential"),
        allow_shared_data_dir: bool = typer.Option(
            False, "--allow-shared-data-dir", envvar=ALLOW_SHARED_ENV,
            help="start even if other users can read the data folder (e.g. a volume with a "
                 "trusted fsGroup)"),
        insecure: bool = typer.Option(False, "--insecure",
                                      help="start beyond loopback without keys (DANGEROUS)"),
        tls_cert: str = typer.Option("", "--tls-cert", envvar="SQUALL_TLS_CERT",
                                     help="serve HTTPS with this PEM certificate (also "
                                          "presented to the master and peers)"),
        tls_key: str = typer.Option("", "--tls-key", envvar="SQUALL_TLS_KEY",
                                    help="private key of --tls-cert"),
        tls_ca: str = typer.Option("", "--tls-ca", envvar="SQUALL_TLS_CA",
                                   help="CA bundle verifying the master, peers and client "
                                        "certificates"),
        tls_require_client_cert: bool = typer.Option(
            False, "--tls-require-client-cert", envvar="SQUALL_TLS_REQUIRE_CLIENT_CERT",
            help="mutual TLS: refuse connections without a certificate from --tls-ca"),
    ) -> None:
        """Run a data node: LMDB blob store, replication, heartbeats to the master."""
        from squall.common.security.tokens import load_cluster_key

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        logging.getLogger("httpx").setLevel(logging.WARNING)  # no line per peer request
        private_umask()
        try:
            cluster_key = load_cluster_key(cluster_key_file or None)
            auth_keys = load_public_keys(auth_public_key_file or None)
        except (OSError, ValueError) as e:
            raise SystemExit(f"refusing to start: {e}") from None
        if cluster_key is None:
            raise SystemExit(
                "refusing to start: a data node needs the master's cluster key. A master "
                "without --cluster-key-file makes one in its data folder (cluster.key); copy "
                "it here (mode 0600) and pass --cluster-key-file FILE or "
                "SQUALL_CLUSTER_KEY_FILE (docs/security.md, keys)")
        if auth_keys is None and (os.environ.get(AUTH_KEY_FILE_ENV)
                                  or os.environ.get(AUTH_KEY_ENV)):
            raise SystemExit(
                "refusing to start: SQUALL_AUTH_KEY(_FILE) is the master's private auth key; "
                "a data node takes only the public one: squall auth pubkey AUTH_KEY_FILE > "
                "auth.pub, then --auth-public-key-file auth.pub (SQUALL_AUTH_PUBLIC_KEY_FILE)")
        try:
            parse_masters(master or None)
        except ValueError as e:
            raise SystemExit(f"refusing to start: --master: {e}") from None
        check_bind(host, True, auth_keys is not None, insecure, "datanode")
        check_data_dir(str(data_dir), allow_shared_data_dir, "data node")
        tls = TLSConfig(tls_cert or None, tls_key or None, tls_ca or None,
                        tls_require_client_cert)
        tls.check()
        scheme = "https" if tls.enabled else "http"
        node_cred = None
        if node_credential_file:
            try:
                with open(node_credential_file) as f:
                    node_cred = f.read().strip()
            except OSError as e:  # e.g. no key for this pod in the Secret
                raise SystemExit(f"--node-credential-file: cannot read {node_credential_file}: "
                                 f"{e.strerror}") from None
            exp = auth.credential_expiry(node_cred)
            if exp is not None and exp - time.time() < NODE_CREDENTIAL_WARN_S:
                logging.getLogger("squall.datanode").warning(
                    "the node credential (%s) expires in %.1f days: mint a new one (squall "
                    "auth mint --role node --node ID) before then, or heartbeats and the "
                    "lifecycle hooks get 401", node_credential_file,
                    (exp - time.time()) / 86400)
        try:
            settings = DataNodeSettings(
                data_dir=str(data_dir), advertise_url=advertise or f"{scheme}://{host}:{port}",
                master_url=master or None, node_id=node_id or None,
                cluster_key=cluster_key,
                heartbeat_interval_s=heartbeat_interval_s, full_report_every=full_report_every,
                map_size=min(1 << 30, map_size_max), map_size_max=map_size_max,
                scrub_bytes_per_s=scrub_bytes_per_s, scrub_interval_s=scrub_interval_s,
                copies_max=copies_max, repair_bytes_per_s=repair_bytes_per_s,
                repair_busy_bytes_per_s=repair_busy_bytes_per_s,
                auth_keys=auth_keys,
                node_credential=node_cred, tls=tls, sqs_region=sqs_region,
                public=("metrics",) if public_metrics else (),
                allowed_hosts=tuple(h for h in allowed_hosts.split(",") if h.strip()))
        except ValueError as e:  # a setting from the environment (SQUALL_FRONT_DOOR_PARALLEL)
            raise SystemExit(f"squall datanode: {e}") from None
        serve(settings, host, port)
