"""``squall dev``: one master and N data nodes on 127.0.0.1 as subprocesses, data under one
folder (``master/``, ``node-1/``, …, logs in ``logs/``). Ports: the master on ``--port``,
node i on ``--port`` + i, the same on every start so the data nodes keep their addresses
and a restart keeps the data. Keys: unless the environment names them
(``SQUALL_CLUSTER_KEY[_FILE]``, ``SQUALL_AUTH_KEY[_FILE]``), a random cluster key and an
Ed25519 auth key are made once under ``keys/`` (the data nodes get only its public half,
``keys/auth.pub``), with an admin credential (``keys/admin.credential``) that the banner
tells how to use. No key is built in. Ctrl-C (or SIGTERM) stops the nodes, then the master.
A data node that exits does not stop the cluster: it is reported, the master marks it dead
and re-replicates its blobs, and ``restart N`` typed on stdin (or SIGHUP, for every dead
node) starts it again on the same port and folder (with the same keys).

The servers are started as ``python -m squall.master`` / ``python -m squall.datanode``:
this package never imports them.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from squall.client import Client, SquallError
from squall.client.cli.common import SERVER_EXTRA_HINT, err, fail, missing_server_deps, say
from squall.common.security import auth

STOP_TIMEOUT_S = 15.0


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class DevCluster:
    """The processes of a local cluster (also used by the end-to-end tests)."""

    def __init__(self, data_dir: Path, port: int, nodes: int,
                 replication_factor: int | None = None, heartbeat_interval_s: float = 1.0,
                 extra_env: dict[str, str] | None = None, masters: int = 1) -> None:
        self.data_dir = data_dir.resolve()
        self.port, self.n = port, nodes
        self.masters = masters  # > 1: a master set (file lease elector, one machine)
        self.master_procs: dict[int, subprocess.Popen[bytes]] = {}
        self.rf = replication_factor or min(2, max(1, nodes))
        self.heartbeat_interval_s = heartbeat_interval_s
        self.env = {**os.environ, **(extra_env or {})}
        self.credential_file: Path | None = None
        self.admin = self._keys()
        self.master_proc: subprocess.Popen[bytes] | None = None
        self.node_procs: dict[int, subprocess.Popen[bytes]] = {}

    @property
    def master_url(self) -> str:
        """The first master; with a master set, every member's URL comma-separated (what
        clients and data nodes are given: they follow the leader)."""
        return ",".join(self.master_urls)

    @property
    def master_urls(self) -> list[str]:
        """Master k listens on --port (k = 0), then on --port + 16 + k (data nodes use
        --port + 1 .. --port + 16)."""
        return [f"http://127.0.0.1:{self.master_port(k)}" for k in range(self.masters)]

    def master_port(self, k: int) -> int:
        return self.port if k == 0 else self.port + 16 + k

    def node_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.port + i}"

    def _keys(self) -> str:
        """Make the cluster's keys under ``keys/`` (once, mode 0600 in a 0700 folder) unless
        the environment has them: a random cluster key, an Ed25519 auth key for the master,
        its public half for the data nodes; return an admin credential. No key of a dev
        cluster is built in or published."""
        keys_dir = self.data_dir / "keys"
        keys_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not (self.env.get("SQUALL_CLUSTER_KEY") or self.env.get("SQUALL_CLUSTER_KEY_FILE")):
            path = keys_dir / "cluster.key"
            if not path.exists():
                auth.write_secret(str(path), auth.new_key() + b"\n")
            self.env["SQUALL_CLUSTER_KEY_FILE"] = str(path)
        keys = auth.load_auth_keys(env=self.env)
        cred = None
        own = keys is None
        if keys is None:
            path = keys_dir / "auth.key"
            self.credential_file = keys_dir / "admin.credential"
            try:
                keys = auth.parse_keys(path.read_bytes())
                cred = self.credential_file.read_text().strip()
            except (OSError, ValueError):  # none yet, or an HMAC key of an older squall
                auth.write_secret(str(path), auth.new_private_key() + b"\n")
                keys = auth.parse_keys(path.read_bytes())
                cred = auth.mint(keys, ["admin"], 365 * 86400.0, time.time())
                auth.write_secret(str(self.credential_file), cred.encode() + b"\n")
            self.env["SQUALL_AUTH_KEY_FILE"] = str(path)
        if own or not (self.env.get(auth.PUBLIC_KEY_ENV)
                       or self.env.get(auth.PUBLIC_KEY_FILE_ENV)):
            pub = keys_dir / "auth.pub"  # what the data nodes get: they only verify
            auth.write_secret(str(pub), keys.public_text())
            self.env[auth.PUBLIC_KEY_FILE_ENV] = str(pub)
            self.env.pop(auth.PUBLIC_KEY_ENV, None)
        return cred or auth.mint(keys, ["admin"], 86400.0, time.time())

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        logs = self.data_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as log:
            return subprocess.Popen([sys.executable, "-m", *argv], stdout=log,
                                    stderr=subprocess.STDOUT, env=self.env,
                                    start_new_session=True)  # Ctrl-C reaches only us

    def start(self, timeout_s: float = 60.0) -> None:
        ports = [*range(self.port, self.port + self.n + 1),
                 *(self.master_port(k) for k in range(1, self.masters))]
        busy = [p for p in ports if not _port_free(p)]
        if busy:
            raise RuntimeError(f"port(s) {', '.join(map(str, busy))} on 127.0.0.1 are in use "
                               "(another squall dev?); stop it or pick another --port")
        # the servers refuse a data folder other users can reach; folders an older squall
        # dev made 0755 under this dev folder are ours: make them private
        for d in (self.data_dir, *(p for p in self.data_dir.iterdir() if p.is_dir())):
            if d.stat().st_mode & 0o077:
                d.chmod(0o700)
        for k in range(self.masters):
            self.start_master(k)
        self.wait_leader(timeout_s)
        for i in range(1, self.n + 1):
            self.start_node(i)
        for i in range(1, self.n + 1):
            self.wait_ready(self.node_url(i), self.node_procs[i], f"node-{i}", timeout_s)
        self.wait_alive(self.n, timeout_s)

    def sqs_profile(self) -> dict[str, str]:
        """The environment an AWS SDK or the AWS CLI needs to use the SQS endpoint of node 1
        (an admin SQS access key, minted once and kept in ``keys/sqs.env``, mode 0600)."""
        path = self.data_dir / "keys" / "sqs.env"
        env: dict[str, str] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                k, _, v = line.partition("=")
                env[k.strip()] = v.strip()
        if not env.get("AWS_ACCESS_KEY_ID"):
            with Client(self.master_url, token=self.admin) as c:
                ans = c.mint_credential("admin", ttl_secs=365 * 86400.0, note="squall dev",
                                        sqs=True)
            env = {"AWS_ACCESS_KEY_ID": ans["access_key_id"],
                   "AWS_SECRET_ACCESS_KEY": ans["secret_access_key"]}
            path.parent.mkdir(parents=True, exist_ok=True)
            auth.write_secret(str(path), "".join(f"{k}={v}\n" for k, v in env.items())
                              .encode())
        return {"AWS_ENDPOINT_URL_SQS": self.node_url(1), "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": env["AWS_ACCESS_KEY_ID"],
                "AWS_SECRET_ACCESS_KEY": env["AWS_SECRET_ACCESS_KEY"]}

    def master_name(self, k: int) -> str:
        return "master" if self.masters == 1 else f"master-{k + 1}"

    def start_master(self, k: int) -> None:
        """Start master k (a member of the set when there are several)."""
        argv = ["squall.master", "--data-dir", str(self.data_dir / self.master_name(k)),
                "--host", "127.0.0.1", "--port", str(self.master_port(k)),
                "--replication-factor", str(self.rf),
                "--heartbeat-interval-s", str(self.heartbeat_interval_s)]
        if self.masters > 1:
            argv += ["--members", self.master_url, "--advertise-url", self.master_urls[k],
                     "--elector", f"file:{self.data_dir / 'master.lease'}",
                     "--elector-lease-s", "3"]
        self.master_procs[k] = self._spawn(self.master_name(k), argv)
        if k == 0:
            self.master_proc = self.master_procs[0]

    def wait_leader(self, timeout_s: float) -> str:
        """Until one master is ready (leads); its URL."""
        deadline = time.monotonic() + timeout_s
        while True:
            for k, url in enumerate(self.master_urls):
                p = self.master_procs[k]
                if p.poll() is not None and self.masters == 1:
                    raise RuntimeError(f"master exited with code {p.returncode}; see "
                                       f"{self.data_dir / 'logs' / 'master.log'}")
                with contextlib.suppress(SquallError), \
                        Client(url, retries=0, timeout=1.0) as c:
                    c.ready()
                    return url
            if time.monotonic() > deadline:
                raise RuntimeError(f"no master became ready in {timeout_s:.0f}s")
            time.sleep(0.05)

    def kill_master(self, k: int) -> None:
        p = self.master_procs[k]
        if p.poll() is None:
            p.kill()
            p.wait(STOP_TIMEOUT_S)

    def start_node(self, i: int, master: str | None = None) -> None:
        """Start data node `i`; `master`: the master URL it is given (tests: a proxy)."""
        self.node_procs[i] = self._spawn(f"node-{i}", [
            "squall.datanode", "--master", master or self.master_url, "--data-dir",
            str(self.data_dir / f"node-{i}"), "--host", "127.0.0.1", "--port",
            str(self.port + i), "--advertise", self.node_url(i),
            "--heartbeat-interval-s", str(self.heartbeat_interval_s)])

    def wait_ready(self, url: str, proc: subprocess.Popen[bytes], name: str, timeout_s: float
              ) -> None:
        """Until the server at `url` answers ``/readyz`` with 200."""
        deadline = time.monotonic() + timeout_s
        with Client(url, retries=0, timeout=1.0) as c:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {proc.returncode}; see "
                                       f"{self.data_dir / 'logs' / (name + '.log')}")
                with contextlib.suppress(SquallError):
                    c.ready()
                    return
                time.sleep(0.05)
        raise RuntimeError(f"{name} did not become ready in {timeout_s:.0f}s")

    def wait_alive(self, n: int, timeout_s: float = 30.0) -> None:
        """Until the master sees `n` live data nodes (their first heartbeats)."""
        deadline = time.monotonic() + timeout_s
        with Client(self.master_url, retries=2, timeout=2.0, token=self.admin) as c:
            while time.monotonic() < deadline:
                with contextlib.suppress(SquallError):
                    if sum(1 for x in c.cluster().nodes if x.state == "alive") >= n:
                        return
                time.sleep(0.05)
        raise RuntimeError(f"the master did not see {n} live data nodes in {timeout_s:.0f}s")

    def failed(self) -> str | None:
        """Name of a server that exited, if any."""
        for k, p in self.master_procs.items():
            if p.poll() is not None and self.masters == 1:
                return self.master_name(k)
        for i, p in self.node_procs.items():
            if p.poll() is not None:
                return f"node-{i}"
        return None

    def kill_node(self, i: int) -> None:
        p = self.node_procs[i]
        if p.poll() is None:
            p.kill()
            p.wait(STOP_TIMEOUT_S)

    def stop(self) -> None:
        """Data nodes first (SIGTERM, then SIGKILL after a timeout), then the master."""
        procs = list(self.node_procs.values())
        for group in (procs, list(self.master_procs.values())):
            for p in group:
                if p.poll() is None:
                    p.terminate()
            for p in group:
                try:
                    p.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait(STOP_TIMEOUT_S)


HELP = ("commands (type + Enter): `restart N` restarts data node N (`restart`: every dead "
        "one), `kill N` kills node N (watch re-replication), with --masters: "
        "`kill-master K` (kill the leader and watch another take over) and "
        "`restart-master K`; `status`, `help`; "
        "`kill -HUP {pid}` also restarts dead nodes")


class _Console:
    """What `squall dev` does after start-up: report nodes that exit (the cluster keeps
    running; the master marks them dead and re-replicates), restart them on request (a
    command on stdin, or SIGHUP), and stop on Ctrl-C / SIGTERM. Only the master exiting
    stops the cluster."""

    def __init__(self, cluster: DevCluster) -> None:
        self.cluster = cluster
        self.stopping = False
        self.restart_dead = False
        self.reported: set[int] = set()
        self.stdin_open = True

    def log(self, i: int) -> Path:
        return self.cluster.data_dir / "logs" / f"node-{i}.log"

    def check(self) -> None:
        c = self.cluster
        if c.masters == 1 and c.master_proc is not None and c.master_proc.poll() is not None:
            fail(f"the master exited (code {c.master_proc.returncode}); see "
                 f"{c.data_dir / 'logs' / 'master.log'}")
        for k, p in c.master_procs.items():
            if c.masters > 1 and p.poll() is not None and -k - 1 not in self.reported:
                self.reported.add(-k - 1)
                say(f"master-{k + 1} exited (code {p.returncode}); the set elects another "
                    f"leader if it led. Type `restart-master {k + 1}` to start it again.")
        for i, p in c.node_procs.items():
            if p.poll() is not None and i not in self.reported:
                self.reported.add(i)
                say(f"node-{i} exited (code {p.returncode}); the cluster keeps running and "
                    f"the master will mark it dead. Log: {self.log(i)}. Type `restart {i}` "
                    "to start it again.")
        if self.restart_dead:
            self.restart_dead = False
            self.restart(None)

    def dead(self) -> list[int]:
        return [i for i, p in self.cluster.node_procs.items() if p.poll() is not None]

    def restart(self, i: int | None) -> None:
        for n in [i] if i is not None else self.dead():
            if self.cluster.node_procs[n].poll() is None:
                say(f"node-{n} is running")
                continue
            self.cluster.start_node(n)
            self.reported.discard(n)
            say(f"node-{n} restarted at {self.cluster.node_url(n)}")

    def status(self) -> None:
        for k, p in self.cluster.master_procs.items():
            state = "running" if p.poll() is None else f"exited (code {p.returncode})"
            say(f"  {self.cluster.master_name(k)}  {self.cluster.master_urls[k]}  {state}")
        for i, p in self.cluster.node_procs.items():
            state = "running" if p.poll() is None else f"exited (code {p.returncode})"
            say(f"  node-{i}  {self.cluster.node_url(i)}  {state}")

    def command(self, line: str) -> None:
        words = line.split()
        if not words:
            return
        verb, args = words[0], words[1:]
        c = self.cluster
        if verb in ("kill-master", "restart-master"):
            if len(args) != 1 or not args[0].isdigit() or not 1 <= int(args[0]) <= c.masters:
                say(f"no such master: {' '.join(args)} (masters are 1..{c.masters})")
            elif verb == "kill-master":
                c.kill_master(int(args[0]) - 1)
            elif c.master_procs[int(args[0]) - 1].poll() is None:
                say(f"master-{args[0]} is running")
            else:
                c.start_master(int(args[0]) - 1)
                self.reported.discard(-int(args[0]))
                say(f"master-{args[0]} restarted (it comes back as a standby)")
            return
        nodes = self.cluster.node_procs
        if len(args) > 1 or (args and (not args[0].isdigit() or int(args[0]) not in nodes)):
            say(f"no such node: {' '.join(args)} (nodes are 1..{len(nodes)})")
        elif verb == "restart":
            self.restart(int(args[0]) if args else None)
        elif verb == "kill" and args:
            self.cluster.kill_node(int(args[0]))
        elif verb == "status":
            self.status()
        else:
            say(HELP.format(pid=os.getpid()))

    def read_stdin(self, timeout_s: float) -> None:
        """Wait up to `timeout_s` for a command line on stdin (if stdin is open)."""
        if not self.stdin_open:
            time.sleep(timeout_s)
            return
        try:
            ready, _, _ = select.select([sys.stdin], [], [], timeout_s)
        except (OSError, ValueError):  # no selectable stdin (closed, or not a file)
            self.stdin_open = False
            return
        if ready:
            line = sys.stdin.readline()
            if not line:
                self.stdin_open = False  # EOF: keep running without commands
            else:
                self.command(line)


def dev(nodes: Annotated[int, typer.Option(min=0, max=16, help="data nodes to start")] = 3,
        data_dir: Annotated[Path, typer.Option(envvar="SQUALL_DEV_DIR",
                                               help="where all data and logs live")
                            ] = Path(".squall"),
        port: Annotated[int, typer.Option(min=1, max=65535 - 17, help="master port; node i "
                                          "listens on port + i")] = 7070,
        replication_factor: Annotated[int | None, typer.Option(
            min=1, max=16, help="payload copies (default: 2, or 1 with one node)")] = None,
        masters: Annotated[int, typer.Option(
            min=1, max=5, help="masters: 3 (or 5) run a master set on one machine (a file "
            "lease elects; member k > 1 listens on port + 16 + k)")] = 1,
        ) -> None:
    """Run a local cluster: one master and N data nodes on 127.0.0.1 (Ctrl-C stops it).
    A data node that dies is reported and can be restarted (`restart N` on stdin)."""
    if missing := missing_server_deps():
        fail(f"`squall dev` runs a master and data nodes, which need the server dependencies "
             f"(missing: {', '.join(missing)}): {SERVER_EXTRA_HINT}")
    if replication_factor is not None and replication_factor > max(nodes, 1):
        fail(f"replication factor {replication_factor} needs at least that many nodes", 2)
    if masters == 2 or masters == 4:
        fail("a master set needs an odd number of members (3 or 5)", 2)
    cluster = DevCluster(data_dir, port, nodes, replication_factor, masters=masters)
    con = _Console(cluster)

    def on_signal(signum: int, frame: object) -> None:
        con.stopping = True

    def on_hup(signum: int, frame: object) -> None:
        con.restart_dead = True

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    old[signal.SIGHUP] = signal.signal(signal.SIGHUP, on_hup)
    try:
        try:
            cluster.start()
        except RuntimeError as e:
            fail(str(e))
        _say_up(cluster)
        say(HELP.format(pid=os.getpid()), style="dim")
        say("Ctrl-C to stop", style="dim")
        sys.stdout.flush()
        while not con.stopping:
            con.check()
            sys.stdout.flush()
            con.read_stdin(0.2)
        err.print("stopping…")
    finally:
        cluster.stop()
        for s, h in old.items():
            signal.signal(s, h)
    say("stopped; start again to continue with the same data")


def _say_up(cluster: DevCluster) -> None:
    """What is running where, and how to use it."""
    say(f"squall dev cluster is up (data in {cluster.data_dir})")
    for k, url in enumerate(cluster.master_urls):
        say(f"  master     {url}   (dashboard /, API docs /docs)"
            + (f"  master-{k + 1} of a set: GET /v1/leader" if cluster.masters > 1 else ""))
    for i in range(1, cluster.n + 1):
        say(f"  data node  {cluster.node_url(i)}")
    say(f"  logs       {cluster.data_dir / 'logs'}")
    if cluster.credential_file is not None:
        say(f"  admin credential  {cluster.credential_file}")
        say(f"use it: export SQUALL_TOKEN=$(cat {cluster.credential_file})")
    if cluster.n:
        _say_sqs(cluster)
    say(f"try: squall put demo#hello 'hi there' --master {cluster.master_url}")


def _say_sqs(cluster: DevCluster) -> None:
    try:
        prof = cluster.sqs_profile()
    except (SquallError, OSError) as e:
        say(f"  (no SQS profile: {e})")
        return
    say(f"  SQS        {prof['AWS_ENDPOINT_URL_SQS']}   (every data node serves it; "
        "docs/sqs.md); for boto3, the AWS CLI and the other AWS SDKs:")
    say("export " + " ".join(f"{k}={v}" for k, v in prof.items()))


def register(app: typer.Typer) -> None:
    app.command("dev")(dev)
