"""Private network: one namespace per server behind a bridge, and partitions as routes.

The soak re-executes itself under ``unshare --mount --net`` (see ``run.py``), so everything
here happens in namespaces it created and vanishes with it; the host's network and mount
table are never touched. Layout::

    soak's own namespace ("hub"): bridge sq0 10.77.0.1/24, the harness, producers, workers
      veth -> namespace "m":  master     10.77.0.10
      veth -> namespace "d0": data node  10.77.0.11   ... "d4": 10.77.0.15
      a master set: "m0" 10.77.0.10, "m1" 10.77.0.21, "m2" 10.77.0.22 (...); its etcd "e"
      10.77.0.30 (partition_leader_elector cuts a member off from it)

A partition adds ``blackhole`` routes inside the cut node's namespace towards the master
and/or its peers: its own packets to them are dropped (its connects fail at once), and
their SYNs still arrive but the answers never leave, so they see timeouts, as across a
real partition. The hub (clients) still reaches the node. Healing deletes the routes.
No nftables is needed (the machine has none); routes do the same job for whole hosts.
"""

from __future__ import annotations

import os
import shutil
import subprocess

SUBNET = "10.77.0"
HUB_IP = f"{SUBNET}.1"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def possible() -> str | None:
    """None when this process may build namespaces (root, `ip`, `unshare`), else why not."""
    if os.geteuid() != 0:
        return "not root"
    for tool in ("ip", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"no `{tool}` command"
    return None


class Net:
    """Namespaces for `names` (host name -> last octet), built in the current (private)
    network namespace. Call only inside ``unshare --mount --net``."""

    def __init__(self, names: dict[str, int]) -> None:
        self.ips = {n: f"{SUBNET}.{octet}" for n, octet in names.items()}
        self.cut: dict[str, list[str]] = {}

    def build(self) -> None:
        # a private /run/netns: the named namespaces live only in our mount namespace
        os.makedirs("/run/netns", exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "soak-netns", "/run/netns"],
                       check=True)
        _ip("link", "set", "lo", "up")
        _ip("link", "add", "sq0", "type", "bridge")
        _ip("addr", "add", f"{HUB_IP}/24", "dev", "sq0")
        _ip("link", "set", "sq0", "up")
        for name, ip in self.ips.items():
            _ip("netns", "add", name)
            _ip("link", "add", f"v-{name}", "type", "veth", "peer", "name", f"p-{name}")
            _ip("link", "set", f"p-{name}", "netns", name)
            _ip("-n", name, "link", "set", f"p-{name}", "name", "eth0")
            _ip("-n", name, "addr", "add", f"{ip}/24", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("link", "set", f"v-{name}", "master", "sq0")
            _ip("link", "set", f"v-{name}", "up")

    def wrap(self, name: str, argv: list[str]) -> list[str]:
        """`argv` run inside namespace `name` (``ip netns exec`` execs: same pid)."""
        return ["ip", "netns", "exec", name, *argv]

    def partition(self, name: str, away_from: list[str]) -> None:
        """Cut `name` off from the hosts `away_from` (both directions, see above)."""
        for other in away_from:
            _ip("-n", name, "route", "add", "blackhole", f"{self.ips[other]}/32")
        self.cut.setdefault(name, []).extend(away_from)

    def heal(self, name: str) -> None:
        for other in self.cut.pop(name, []):
            _ip("-n", name, "route", "del", "blackhole", f"{self.ips[other]}/32", check=False)

    def heal_all(self) -> None:
        for name in list(self.cut):
            self.heal(name)
