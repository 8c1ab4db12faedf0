"""The soak's cluster: a master (or a master set of 3, `masters`, a file lease or an etcd
electing) and five data nodes (RF 2) as real processes, each in its own network namespace
with its data folder on its own tmpfs (see netns.py, disks.py), or all on 127.0.0.1 and
plain folders when namespaces cannot be built here. With the etcd elector, one etcd
(Debian's etcd-server) runs in a namespace of its own ("e"), so a member can be cut off
from it by a route like any other host."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from typing import Any

import httpx

from squall.common.security import tokens
from tests.chaos import disks
from tests.chaos.netns import Net
from tests.helpers import free_port_block, http_status, master_auth, wait_for

KEY = "soak-cluster-key-0123456789abcdef"
ENV = {"SQUALL_CLUSTER_KEY": KEY}
NODES = 5
RF = 2
BEAT_S = 0.5
DEAD_AFTER_BEATS = 3
MASTER_PORT, NODE_PORT = 7070, 7071
MASTER_FS_MB, NODE_FS_MB = 256, 192
SET_LEASE_S = 2.0  # a master set's elector lease
CHECKPOINT_S = 5.0
ETCD_TTL_S = 2  # the etcd elector's lease TTL (etcd's minimum is about 2 s)
ETCD_PORT, ETCD_PEER_PORT = 2379, 2380
ETCD_FS_MB = 256  # etcd preallocates 64 MiB WAL segments, and the next one ahead


def etcd_binary() -> str | None:
    return shutil.which("etcd")


class Server:
    """One server process; `argv` is fixed so a restart comes back where it was."""

    def __init__(self, name: str, argv: list[str], url: str, data_dir: str, log: str) -> None:
        self.name, self.argv, self.url, self.data_dir, self.log = name, argv, url, data_dir, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def up(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def launch(self) -> None:
        with open(self.log, "ab") as log:
            log.write(f"--- {time.strftime('%H:%M:%S')} start #{self.starts}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         env={**os.environ, **ENV})
        self.starts += 1

    def ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited ({self.log})")
        return http_status(self.url + "/readyz") == 200

    def signal(self, sig: int) -> None:
        """Send `sig` (SIGSTOP, SIGCONT) to the server (``ip netns exec`` execs: its pid)."""
        if self.up:
            assert self.proc is not None
            self.proc.send_signal(sig)

    def wait_ready(self, timeout: float = 180.0) -> None:  # imports take a minute at load 40
        wait_for(self.ready, timeout, interval=0.05, what=f"{self.name} ready")

    def kill9(self) -> None:
        if self.up:
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.up:
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill9()


class EtcdServer(Server):
    """The etcd the master set's elector talks to; ready once ``/health`` says so."""

    def ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited ({self.log})")
        with urllib.request.urlopen(self.url + "/health", timeout=1.0) as r:
            return bool(json.loads(r.read()).get("health") == "true")


class SoakCluster:
    def __init__(self, base: str, use_netns: bool, masters: int = 1,
                 elector: str = "file", checkpoint_s: float = CHECKPOINT_S) -> None:
        """`elector` (a master set): "file" (a lease file in `base`) or "etcd" (an etcd in
        namespace "e"; needs the `etcd` binary). `checkpoint_s`: the masters'
        checkpoint interval (a checkpoint drops the WAL segments the index holds)."""
        self.base = base
        self.net: Net | None = None
        self.tmpfs = False
        self.master_names = ["m"] if masters == 1 else [f"m{i}" for i in range(masters)]
        names = {**{n: 10 if i == 0 else 20 + i for i, n in enumerate(self.master_names)},
                 **{f"d{i}": 11 + i for i in range(NODES)}}
        self.etcd: EtcdServer | None = None
        if masters > 1 and elector == "etcd":
            names["e"] = 30
        if use_netns:
            self.net = Net(names)
            self.net.build()
            host = dict(self.net.ips)
            ports = {**dict.fromkeys(self.master_names, MASTER_PORT),
                     **{f"d{i}": NODE_PORT for i in range(NODES)}, "e": ETCD_PORT}
            peer_port = ETCD_PEER_PORT
        else:
            host = dict.fromkeys(names, "127.0.0.1")
            p0 = free_port_block(len(names) + 1)
            ports = {n: p0 + i for i, n in enumerate(names)}
            peer_port = p0 + len(names)
        murls = [f"http://{host[n]}:{ports[n]}" for n in self.master_names]
        self.master_urls = ",".join(murls)  # what clients and data nodes are given
        self.elector_spec = f"file:{os.path.join(base, 'lease')}"
        if "e" in names:
            self.etcd = self._etcd(host["e"], ports["e"], peer_port)
            self.elector_spec = f"etcd:{self.etcd.url}/squall/soak?ttl={ETCD_TTL_S}"
        self.masters: list[Server] = []
        for n, u in zip(self.master_names, murls, strict=True):
            one = [] if masters == 1 else [
                "--members", self.master_urls, "--advertise-url", u,
                "--elector", self.elector_spec, "--elector-lease-s", str(SET_LEASE_S)]
            self.masters.append(self._server(n, host[n], ports[n], [
                "-m", "squall.master", "--heartbeat-interval-s", str(BEAT_S),
                "--dead-after-beats", str(DEAD_AFTER_BEATS), "--replication-factor", str(RF),
                "--orphan-grace-s", "120", "--checkpoint-interval-s", f"{checkpoint_s:g}", *one]))
        self.nodes = [self._server(f"d{i}", host[f"d{i}"], ports[f"d{i}"], [
            "-m", "squall.datanode", "--master", self.master_urls, "--advertise",
            f"http://{host[f'd{i}']}:{ports[f'd{i}']}", "--heartbeat-interval-s", str(BEAT_S),
            "--full-report-every", "10", "--scrub-bytes-per-s", "0"]) for i in range(NODES)]
        self.http = httpx.Client(timeout=10.0, auth=master_auth(self.master_urls))

    def _etcd(self, host: str, port: int, peer_port: int) -> EtcdServer:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("the etcd elector needs the `etcd` binary (make etcd)")
        data = os.path.join(self.base, "e")
        os.makedirs(data, exist_ok=True)
        if self.net is not None:
            disks.mount_tmpfs(data, ETCD_FS_MB)
        url, peer = f"http://{host}:{port}", f"http://{host}:{peer_port}"
        argv = [binary, "--name", "soak", "--data-dir", os.path.join(data, "data"),
                "--listen-client-urls", url, "--advertise-client-urls", url,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"soak={peer}", "--log-level", "error"]
        if self.net is not None:
            argv = self.net.wrap("e", argv)
        return EtcdServer("e", argv, url, data, os.path.join(self.base, "etcd.log"))

    def _server(self, name: str, host: str, port: int, args: list[str]) -> Server:
        data = os.path.join(self.base, name)
        os.makedirs(data, exist_ok=True)
        if self.net is not None:
            disks.mount_tmpfs(data, MASTER_FS_MB if name.startswith("m") else NODE_FS_MB)
            self.tmpfs = True
        argv = [sys.executable, *args, "--host", host, "--port", str(port),
                "--data-dir", os.path.join(data, "data")]
        if self.net is not None:
            argv = self.net.wrap(name, argv)
        return Server(name, argv, f"http://{host}:{port}", data,
                      os.path.join(self.base, f"{name}.log"))

    @property
    def servers(self) -> list[Server]:
        return [*self.masters, *self.nodes]

    @property
    def master(self) -> Server:
        """The master; on a master set the leader (waiting for one)."""
        if len(self.masters) == 1:
            return self.masters[0]
        return self.masters[self.wait_leader()]

    def leader(self) -> int | None:
        """The member that is ready (leads and its log is writable), if any."""
        for i, s in enumerate(self.masters):
            if not s.up:
                continue
            try:
                if http_status(s.url + "/readyz") == 200:
                    return i
            except OSError:  # refused, reset, timed out
                continue
        return None

    def wait_leader(self, timeout: float = 180.0, not_: int | None = None) -> int:
        def found() -> int | None:
            i = self.leader()
            return None if i is None or i == not_ else i + 1  # 0 is a leader too

        got = wait_for(found, timeout, interval=0.05, what="a leader")
        assert got is not None
        return got - 1

    def leader_view(self, i: int) -> dict[str, Any] | None:
        """Member `i`'s ``GET /v1/leader`` (role, leader, epoch), None if it does not
        answer."""
        try:
            r = self.http.get(self.masters[i].url + "/v1/leader", timeout=2.0)
            return dict(r.json()) if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None

    def role(self, i: int) -> str | None:
        v = self.leader_view(i)
        return None if v is None else str(v.get("role"))

    def journal_view(self, leader: int, i: int) -> dict[str, Any] | None:
        """How the leader `leader` sees member `i`'s journal (in_sync, lag, status), from
        its ``GET /v1/master/members``; None when it does not answer as the leader."""
        try:
            r = self.http.get(self.masters[leader].url + "/v1/master/members")
            if r.status_code != 200 or r.json().get("role") != "leader":
                return None
            return dict(r.json()["log"]["members"][self.masters[i].url])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None

    def wait_ready(self) -> None:
        """Every server serving: on a master set, a leader and every other member a
        standby (only the leader answers /readyz with 200)."""
        for s in self.nodes if len(self.masters) > 1 else self.servers:
            s.wait_ready()
        if len(self.masters) > 1:
            self.wait_leader()
            for i in range(len(self.masters)):
                def member(i: int = i) -> bool:
                    return self.role(i) in ("leader", "standby")

                wait_for(member, 180, interval=0.1, what=f"{self.master_names[i]} in the set")

    def start(self) -> None:
        if self.etcd is not None:
            self.etcd.launch()
            self.etcd.wait_ready(60)
        for s in self.servers:
            s.launch()
        self.wait_ready()
        wait_for(lambda: self.alive() == NODES, 180, interval=0.1, what="data nodes alive")

    def info(self) -> Any:
        return self.http.get(self.master.url + "/v1/cluster").json()

    def alive(self) -> int:
        return sum(n["state"] == "alive" for n in self.info()["nodes"])

    def settled(self) -> bool:
        i = self.info()
        return (sum(n["state"] == "alive" for n in i["nodes"]) == NODES
                and i["under_replicated"] == 0 and i["lost"] == 0
                and i["copies_in_flight"] == 0)

    def holders(self, blob_id: str) -> int:
        tok = tokens.sign(KEY.encode(), "read", [blob_id], time.time() + 300)
        n = 0
        for d in self.nodes:
            r = self.http.head(f"{d.url}/v1/blobs/{blob_id}",
                               headers={"Authorization": f"Bearer {tok}"})
            n += r.status_code == 200
        return n

    def close(self) -> None:
        self.http.close()
        for s in self.servers:
            s.signal(signal.SIGCONT)  # a member stopped when the soak was interrupted
            s.stop()
        if self.etcd is not None:
            self.etcd.stop()
        if self.net is not None:
            self.net.heal_all()
