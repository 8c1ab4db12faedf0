"""`squall master`: run a master server."""

from __future__ import annotations

import logging
from pathlib import Path
from types import FrameType

import typer

from squall.common.security.auth import load_auth_keys
from squall.common.security.files import ALLOW_SHARED_ENV, check_data_dir, private_umask
from squall.common.security.tls import TLSConfig
from squall.common.security.tokens import load_cluster_key
from squall.master.cluster.nodes import ClusterSettings
from squall.master.security import SecuritySettings
from squall.master.service import MasterSettings


def serve(settings: MasterSettings, host: str, port: int,
          security: SecuritySettings | None = None, tls: TLSConfig | None = None) -> None:
    import uvicorn

    from squall.common.server.runtime import serve_tuning
    from squall.common.server.serving import uvicorn_options
    from squall.master.http.app import create_master_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    app = create_master_app(settings, security=security)
    serve_tuning()

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # uvicorn waits for requests in flight before shutting the app down: answer
            # parked leases now (empty), or a stop would wait out their wait_secs
            master = getattr(app.state, "master", None)
            if master is not None:
                master.waiters.close_threadsafe()
            super().handle_exit(sig, frame)

    Server(uvicorn.Config(app, host=host, port=port,
                          **uvicorn_options((tls or TLSConfig()).uvicorn_kwargs()))).run()


def _call(master: str, method: str, path: str, body: dict[str, object] | None = None,
          follow: bool = True) -> dict[str, object]:
    """One admin call to a master set member (the leader: a standby's answer names it)."""
    import json
    import os
    from urllib.parse import urlsplit

    from squall.common.transport.sync import Pool

    u = urlsplit(master.rstrip("/"))
    if u.scheme not in ("http", "https") or not u.hostname:
        raise typer.BadParameter(f"--master must be a base URL, not {master!r}")
    port = u.port or (443 if u.scheme == "https" else 80)
    headers = [("Host", f"{u.hostname}:{port}"),
               ("Authorization", f"Bearer {os.environ.get('SQUALL_TOKEN', '')}")]
    content = None
    if body is not None:
        content = json.dumps(body).encode()
        headers.append(("Content-Type", "application/json"))
    pool = Pool()
    try:
        r = pool.request((u.scheme, u.hostname, port), method, path, headers, content,
                         connect_timeout=5.0, read_timeout=150.0)
        try:
            data = r.read()
            status, hdrs = r.status, r.header_dict()
        finally:
            r.release()
    except OSError as e:
        raise typer.BadParameter(f"{master} cannot be reached: {e}") from None
    finally:
        pool.close()
    leader = hdrs.get("x-squall-leader")
    if status == 503 and leader and follow:  # a standby: ask the leader it names
        return _call(leader, method, path, body, follow=False)
    try:
        out: dict[str, object] = json.loads(data)
    except ValueError:
        out = {"raw": data.decode(errors="replace")}
    if status >= 400:
        typer.echo(f"{master}: {status} {out}", err=True)
        raise typer.Exit(1)
    return out


MASTER_OPT = typer.Option("http://127.0.0.1:7070", "--master", envvar="SQUALL_MASTER",
                          help="any member's base URL (a standby names the leader)")


def _register_set_commands(master_app: typer.Typer) -> None:
    import json

    members = typer.Typer(help="a master set's members (admin)", no_args_is_help=True)

    @members.command("list")
    def members_list(master: str = MASTER_OPT) -> None:
        """Members, leader, epoch, each journal's lag, the elector."""
        typer.echo(json.dumps(_call(master, "GET", "/v1/master/members"), indent=2))

    @members.command("add")
    def members_add(url: str, master: str = MASTER_OPT) -> None:
        """Add a member (or re-add one with a new or wiped disk): its journal is
        formatted, caught up, then the new set is logged."""
        typer.echo(json.dumps(_call(master, "POST", "/v1/master/members",
                                    {"action": "add", "member": url}), indent=2))

    @members.command("remove")
    def members_remove(url: str, master: str = MASTER_OPT) -> None:
        """Remove a member (logged; it no longer counts toward a majority)."""
        typer.echo(json.dumps(_call(master, "POST", "/v1/master/members",
                                    {"action": "remove", "member": url}), indent=2))

    master_app.add_typer(members, name="members")

    @master_app.command("step-down")
    def step_down(master: str = MASTER_OPT) -> None:
        """The leader stops leading (maintenance); another member takes over."""
        typer.echo(json.dumps(_call(master, "POST", "/v1/master/step-down")))


def register(app: typer.Typer) -> None:
    master_app = typer.Typer(invoke_without_command=True, add_completion=False,
                             help="Run a master (no subcommand), or manage a master set.")
    _register_set_commands(master_app)
    app.add_typer(master_app, name="master")

    @master_app.callback()
    def master(
        ctx: typer.Context,
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
            5000, envvar="SQUALL_MAX_COPIES_PER_NODE", min=1,
            help="re-replication: blobs in flight per node (as source and target)"),
        max_repair_bytes_per_node: int = typer.Option(
            64 << 20, envvar="SQUALL_MAX_REPAIR_BYTES_PER_NODE", min=1,
            help="re-replication: bytes of copies in flight per node (as source and "
                 "target); small blobs travel many per request"),
        blob_scan_interval_s: float = typer.Option(
            600.0, envvar="SQUALL_BLOB_SCAN_INTERVAL_S",
            help="seconds between passes of the paced scan for referenced blobs that no "
                 "live data node reports (the first pass runs soon after start)"),
        orphan_grace_s: float = typer.Option(
            600.0, envvar="SQUALL_ORPHAN_GRACE_S",
            help="how long a written but uncommitted payload is kept before collection"),
        index_sync: bool = typer.Option(
            True, envvar="SQUALL_INDEX_SYNC",
            help="fsync the LMDB index once per WAL group commit, so it survives a power "
                 "loss or kernel crash intact; --no-index-sync syncs it at checkpoints "
                 "only (faster, but a power loss can corrupt the index)"),
        lease_wait_max_s: float = typer.Option(
            20.0, envvar="SQUALL_LEASE_WAIT_MAX_S", min=0.0, max=3600.0,
            help="longest a lease's wait_secs may hold a request (long polling)"),
        pending_deadline_s: float = typer.Option(
            10.0, envvar="SQUALL_PENDING_DEADLINE_S", min=0.1, max=3600.0,
            help="a task enqueued through a data node while its payload was being stored "
                 "is settled by the master (from the nodes' block reports) if its node has "
                 "not confirmed it this long after"),
        cluster_key_file: Path | None = typer.Option(
            None, "--cluster-key-file", envvar="SQUALL_CLUSTER_KEY_FILE",
            help="file with the cluster's HMAC key (else SQUALL_CLUSTER_KEY, else one made in "
                 "--data-dir: cluster.key, which the data nodes need a copy of)"),
        auth_key_file: Path | None = typer.Option(
            None, "--auth-key-file", envvar="SQUALL_AUTH_KEY_FILE",
            help="file with the Ed25519 private key(s) of credentials, one per line, the first "
                 "signs (else SQUALL_AUTH_KEY, else one made in --data-dir with its public key "
                 "auth.pub and an admin credential)"),
        allowed_hosts: str = typer.Option(
            "", "--allowed-hosts", envvar="SQUALL_ALLOWED_HOSTS",
            help="comma-separated Host names clients use besides loopback ('*': any)"),
        public_metrics: bool = typer.Option(False, "--public-metrics",
                                            envvar="SQUALL_PUBLIC_METRICS",
                                            help="serve /metrics without a credential"),
        public_status: bool = typer.Option(False, "--public-status",
                                           envvar="SQUALL_PUBLIC_STATUS",
                                           help="serve the dashboard's data (/v1/overview) "
                                                "without a credential"),
        allow_shared_data_dir: bool = typer.Option(
            False, "--allow-shared-data-dir", envvar=ALLOW_SHARED_ENV,
            help="start even if other users can read the data folder (e.g. a volume with a "
                 "trusted fsGroup)"),
        tls_cert: Path | None = typer.Option(None, "--tls-cert", envvar="SQUALL_TLS_CERT",
                                             help="serve HTTPS with this PEM certificate"),
        tls_key: Path | None = typer.Option(None, "--tls-key", envvar="SQUALL_TLS_KEY",
                                            help="private key of --tls-cert"),
        tls_ca: Path | None = typer.Option(None, "--tls-ca", envvar="SQUALL_TLS_CA",
                                           help="CA bundle to verify client certificates"),
        tls_require_client_cert: bool = typer.Option(
            False, "--tls-require-client-cert", envvar="SQUALL_TLS_REQUIRE_CLIENT_CERT",
            help="mutual TLS: refuse connections without a certificate from --tls-ca"),
        members: str = typer.Option(
            "", "--members", envvar="SQUALL_MEMBERS",
            help="a master set: every member's advertised base URL, comma-separated (3 or "
                 "5); empty: a single master"),
        advertise_url: str = typer.Option(
            "", "--advertise-url", "--advertise", envvar="SQUALL_ADVERTISE",
            help="this member's base URL as the other members reach it (one of --members; "
                 "default http://<host>:<port>)"),
        elector: str = typer.Option(
            "", "--elector", envvar="SQUALL_ELECTOR",
            help="who tries to lead a master set: static:<url>, etcd:..., kubernetes:..., "
                 "file:<path> (one machine, dev); default static:<first member>"),
        elector_lease_s: float = typer.Option(
            0.0, "--elector-lease-s", envvar="SQUALL_ELECTOR_LEASE_S", min=0.0, max=600.0,
            help="the leadership lease (0: the elector's default); a failover takes about "
                 "one lease"),
        max_wal_kept_mb: int = typer.Option(
            4096, "--max-wal-kept-mb", envvar="SQUALL_MAX_WAL_KEPT_MB", min=1,
            help="a master set's leader keeps WAL segments a lagging member still lacks up "
                 "to this size; past it a member that is down so long is restored from a "
                 "copy of a standby's volume"),
    ) -> None:
        """Run a master: task metadata, leases, WAL + LMDB index, data-node placement."""
        if ctx.invoked_subcommand is not None:
            return
        try:
            cluster = ClusterSettings(
                replication_factor=replication_factor, write_quorum=write_quorum,
                heartbeat_interval_s=heartbeat_interval_s, dead_after_beats=dead_after_beats,
                max_copies_per_node=max_copies_per_node,
                max_repair_bytes_per_node=max_repair_bytes_per_node,
                blob_scan_interval_s=blob_scan_interval_s, orphan_grace_s=orphan_grace_s)
        except ValueError as e:
            raise typer.BadParameter(str(e)) from None
        settings = MasterSettings(
            data_dir=str(data_dir), fsync=fsync, checkpoint_interval_s=checkpoint_interval_s,
            index_sync=index_sync, lease_wait_max_s=lease_wait_max_s,
            pending_deadline_s=pending_deadline_s,
            cluster=cluster, cluster_key_file=str(cluster_key_file) if cluster_key_file else None)
        # a master always has its keys (configured, or made in its data folder), on any
        # address; published key material is refused
        private_umask()
        try:
            load_cluster_key(settings.cluster_key_file)
            keys = load_auth_keys(str(auth_key_file) if auth_key_file else None)
        except (OSError, ValueError) as e:
            raise SystemExit(f"refusing to start: {e}") from None
        if keys is not None and not keys.can_sign:
            raise SystemExit("refusing to start: the master's auth key holds no private key "
                             "(ed25519-private:...); only the master mints credentials")
        check_data_dir(str(data_dir), allow_shared_data_dir, "master")
        if members:
            from squall.master.ha.members import parse_members
            from squall.master.ha.role import SetSettings

            try:
                listed = parse_members(members)
                me = parse_members(advertise_url or f"http://{host}:{port}")[0]
            except ValueError as e:
                raise typer.BadParameter(str(e)) from None
            if me not in listed:
                raise typer.BadParameter(f"--advertise-url {me} is not one of --members")
            settings.master_set = SetSettings(me=me, members=listed, elector=elector,
                                              lease_secs=elector_lease_s or None,
                                              max_wal_kept_bytes=max_wal_kept_mb << 20)
        tls = TLSConfig(str(tls_cert) if tls_cert else None, str(tls_key) if tls_key else None,
                        str(tls_ca) if tls_ca else None, tls_require_client_cert)
        tls.check()
        public = tuple(n for n, on in (("metrics", public_metrics), ("status", public_status))
                       if on)
        hosts = tuple(h for h in allowed_hosts.split(",") if h.strip())
        if host not in ("0.0.0.0", "::", ""):
            hosts += (host,)
        security = SecuritySettings(auth_key_file=str(auth_key_file) if auth_key_file else None,
                                    allowed_hosts=hosts, public=public)
        serve(settings, host, port, security, tls)
