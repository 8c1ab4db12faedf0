"""The seeded fault schedule and the hands that carry it out.

:func:`plan` draws the whole schedule from one seed before anything starts: which fault,
when, against which server, for how long. The same seed gives the same schedule (the
load's interleaving around it is the machine's). Faults run one after another; each one
is an *episode* with a start, a fault, a hold time and a repair, written to the episode
log with its timings.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from squall.client import Client, SquallError
from tests.chaos import disks
from tests.chaos.cluster import NODES, SoakCluster
from tests.chaos.ledger import Writer, crc, payload_of
from tests.helpers import wait_for

KINDS = ("kill_master", "kill_node", "kill_two_nodes", "kill_holder_during_repair",
         "kill_worker", "fill_node_disk", "fill_master_disk", "partition_node")
NEEDS_ROOT = ("fill_node_disk", "fill_master_disk", "partition_node")
# a master set (`--masters 3`): the leader killed (-9) and restarted as a standby instead
# of the master; the master's disk is not filled (a set member's journal is another test)
SET_KINDS = {"kill_master": "kill_leader", "fill_master_disk": None}
PROBE_QUEUE = "soak#probe"
RESUME_LIMIT_S = 20.0


@dataclass
class Fault:
    gap_s: float  # pause after the previous episode ended (or after the load started)
    kind: str
    targets: list[int]  # data node numbers, or a worker slot
    hold_s: float  # how long the fault lasts before the repair
    variant: str = ""  # partition_node: "master" or "master+peers"


def plan(seed: int, kinds: tuple[str, ...], workers: int, n: int = 500) -> list[Fault]:
    """The fault sequence of a seed: every kind once in a seeded order, then seeded picks.
    The soak runs a prefix of it: episodes start while the fault window is open (and at
    least one of each kind), so how many fit depends on the machine, not the order."""
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    out: list[Fault] = []
    for _ in range(max(n, len(kinds))):
        kind = order.pop(0) if order else rng.choice(kinds)
        nodes = rng.sample(range(NODES), 2)
        hold = rng.uniform(0.3, 3.0) if kind == "kill_leader" else {
                "kill_master": rng.uniform(0.3, 3.0), "kill_node": rng.uniform(0.5, 6.0),
                "kill_two_nodes": rng.uniform(2.0, 6.0),
                "kill_holder_during_repair": rng.uniform(2.0, 5.0),
                "kill_worker": rng.uniform(0.0, 2.0), "fill_node_disk": rng.uniform(2.0, 6.0),
                "fill_master_disk": rng.uniform(1.0, 4.0),
                "partition_node": rng.uniform(2.0, 8.0)}[kind]
        targets = {"kill_master": [], "kill_leader": [], "kill_node": nodes[:1],
                   "kill_two_nodes": nodes,
                   "kill_holder_during_repair": nodes, "fill_node_disk": nodes[:1],
                   "fill_master_disk": [], "partition_node": nodes[:1],
                   "kill_worker": [rng.randrange(workers)]}[kind]
        variant = rng.choice(("master", "master+peers")) if kind == "partition_node" else ""
        out.append(Fault(round(rng.uniform(1.0, 5.0), 2), kind, targets, round(hold, 2),
                         variant))
    return out


@dataclass
class Episode:
    fault: Fault
    started: float = 0.0
    ended: float = 0.0
    notes: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        return {**asdict(self.fault), "took_s": round(self.ended - self.started, 2),
                **self.notes}


class Faults:
    """Carries out a schedule against a cluster and a pool of worker processes."""

    def __init__(self, cluster: SoakCluster, restart_worker: Callable[[int], None],
                 stop: threading.Event, log: Callable[[str], None], ledger_dir: str) -> None:
        self.c = cluster
        self.restart_worker = restart_worker
        self.stop = stop
        self.log = log
        self.episodes: list[Episode] = []
        self.findings: list[str] = []  # broken promises seen during an episode
        self.probe_led = Writer(os.path.join(ledger_dir, "probe.jsonl"))
        self.probes = 0

    def run(self, schedule: list[Fault], window_s: float) -> None:
        end = time.monotonic() + window_s
        seen: set[str] = set()
        kinds = {f.kind for f in schedule}
        for f in schedule:
            if time.monotonic() >= end and seen >= kinds:
                return
            if self.stop.wait(f.gap_s):
                return
            seen.add(f.kind)
            ep = Episode(f, started=time.monotonic())
            self.log(f"fault {f.kind} targets={f.targets} hold={f.hold_s}s {f.variant}")
            try:
                getattr(self, f.kind)(f, ep)
            except Exception as e:  # written down; the soak goes on and fails at the end
                ep.notes["error"] = repr(e)
                self.log(f"fault {f.kind} went wrong: {e!r}")
            ep.ended = time.monotonic()
            self.episodes.append(ep)

    def _hold(self, s: float) -> None:
        self.stop.wait(s)

    # -- processes -----------------------------------------------------------------------
    def kill_master(self, f: Fault, ep: Episode) -> None:
        self.c.master.kill9()
        self._hold(f.hold_s)
        t = time.monotonic()
        self.c.master.launch()
        self.c.master.wait_ready()
        ep.notes["restart_s"] = round(time.monotonic() - t, 2)

    def kill_leader(self, f: Fault, ep: Episode) -> None:
        """A master set's leader killed (-9): time until another member leads, hold, then
        the old leader restarted until it is a standby again."""
        old = self.c.wait_leader()
        t = time.monotonic()
        self.c.masters[old].kill9()
        new = self.c.wait_leader(not_=old)
        ep.notes["failover_s"] = round(time.monotonic() - t, 2)
        ep.notes["new_leader"] = self.c.master_names[new]
        self._hold(f.hold_s)
        t = time.monotonic()
        self.c.masters[old].launch()
        wait_for(lambda: self.c.role(old) == "standby", 180, interval=0.1,
                 what=f"{self.c.master_names[old]} back as a standby")
        ep.notes["restart_s"] = round(time.monotonic() - t, 2)

    def _nodes_back(self, ids: list[int], ep: Episode, killed_at: float) -> None:
        for i in ids:
            self.c.nodes[i].launch()
        for i in ids:
            self.c.nodes[i].wait_ready()
        ep.notes["to_rf_s"] = self._time_to_rf(killed_at)

    def _time_to_rf(self, since: float, limit_s: float = 120.0) -> float | None:
        """Seconds from `since` until the master sees every node alive and every blob at
        RF with no copy in flight (None: not within `limit_s`)."""
        try:  # the master may be restarting: wait_for keeps asking
            wait_for(self.c.settled, limit_s, interval=0.1, what="every blob at RF")
        except TimeoutError:
            return None
        return round(time.monotonic() - since, 2)

    def _watch(self, hold_s: float, url: str, ep: Episode) -> None:
        """Hold for `hold_s`, noting whether the master declared the node at `url` dead and
        planned copies of its blobs meanwhile."""
        end = time.monotonic() + hold_s
        ep.notes["declared_dead"] = ep.notes["copies_seen"] = False
        while not self.stop.wait(0.1) and time.monotonic() < end:
            try:
                i = self.c.info()
            except Exception:
                continue
            if any(n["address"] == url and n["state"] == "dead" for n in i["nodes"]):
                ep.notes["declared_dead"] = True
            if i["copies_in_flight"]:
                ep.notes["copies_seen"] = True

    def kill_node(self, f: Fault, ep: Episode) -> None:
        t = time.monotonic()
        self.c.nodes[f.targets[0]].kill9()
        self._watch(f.hold_s, self.c.nodes[f.targets[0]].url, ep)
        self._nodes_back(f.targets, ep, t)

    def kill_two_nodes(self, f: Fault, ep: Episode) -> None:
        t = time.monotonic()
        for i in f.targets:
            self.c.nodes[i].kill9()
        self._hold(f.hold_s)
        self._nodes_back(f.targets, ep, t)

    def kill_holder_during_repair(self, f: Fault, ep: Episode) -> None:
        """Kill one node; as soon as the master has copies of its blobs in flight (or 10 s
        passed), kill a second one: a source or target of those copies, or a holder of
        blobs that just lost their other replica."""
        a, b = f.targets
        t = time.monotonic()
        self.c.nodes[a].kill9()
        ep.notes["repair_seen"] = False

        def seen() -> str | None:
            if self.stop.is_set():
                return "stopped"
            return "seen" if self.c.info()["copies_in_flight"] else None

        with contextlib.suppress(TimeoutError):
            ep.notes["repair_seen"] = wait_for(seen, 10.0, interval=0.05) == "seen"
        self.c.nodes[b].kill9()
        ep.notes["second_after_s"] = round(time.monotonic() - t, 2)
        self._hold(f.hold_s)
        self._nodes_back(f.targets, ep, t)

    def kill_worker(self, f: Fault, ep: Episode) -> None:
        self.restart_worker(f.targets[0])

    # -- disks ---------------------------------------------------------------------------
    def _fill(self, path: str, f: Fault, ep: Episode) -> None:
        ep.notes["filled_mb"] = round(disks.fill(path) / 2**20, 1)
        self._hold(f.hold_s)
        disks.free(path)

    def fill_node_disk(self, f: Fault, ep: Episode) -> None:
        self._fill(self.c.nodes[f.targets[0]].data_dir, f, ep)
        ep.notes["to_rf_s"] = self._time_to_rf(ep.started)

    def fill_master_disk(self, f: Fault, ep: Episode) -> None:
        """Fill the master's disk, hold, free it; then the master must accept writes again
        by itself, or say in /readyz that it needs a restart. A probe enqueue
        (into ``soak#probe``, in the ledger like any other) tells which."""
        path = self.c.master.data_dir
        ep.notes["filled_mb"] = round(disks.fill(path) / 2**20, 1)
        self.probe(ep, "probe_while_full")
        ep.notes["readyz_while_full"] = self.readyz()
        self._hold(f.hold_s)
        disks.free(path)
        t = time.monotonic()
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: self.probe(ep, "probe_after_free"), RESUME_LIMIT_S,
                     interval=0.5, what="writes to resume", fatal=Exception)
        if ep.notes["probe_after_free"] == "ok":
            ep.notes["writes_resume_s"] = round(time.monotonic() - t, 2)
            return
        ready = ep.notes["readyz_when_stuck"] = self.readyz()
        if ready == 200:
            self.findings.append(
                f"master refuses writes {RESUME_LIMIT_S:g} s after its disk was freed "
                f"({ep.notes['probe_after_free']}) while /readyz answers 200")
        self.log(f"master still refuses writes after its disk was freed (/readyz {ready}): "
                 "restarting it, as an operator would")
        ep.notes["restarted_by_harness"] = True
        self.c.master.kill9()
        self.c.master.launch()
        self.c.master.wait_ready()

    def probe(self, ep: Episode, note: str) -> bool:
        """One enqueue into ``soak#probe``, written to the ledger."""
        self.probes += 1
        pid = f"probe-{self.probes:05d}"
        data = payload_of(pid, 64)
        try:
            with Client(self.c.master_urls, timeout=5.0, retries=1) as cl:
                cl.put(PROBE_QUEUE, data, pid=pid, idempotency_key=pid)
        except SquallError as e:
            self.probe_led.write("put?", q=PROBE_QUEUE, pid=pid, crc=crc(data), n=64,
                                 err=repr(e)[:200])
            ep.notes[note] = repr(e)[:160]
            return False
        self.probe_led.write("put", q=PROBE_QUEUE, pid=pid, crc=crc(data), n=64)
        ep.notes[note] = "ok"
        return True

    def readyz(self) -> int | None:
        try:
            return httpx.get(self.c.master.url + "/readyz", timeout=5.0).status_code
        except httpx.HTTPError:
            return None

    # -- network -------------------------------------------------------------------------
    def partition_node(self, f: Fault, ep: Episode) -> None:
        assert self.c.net is not None
        name = f"d{f.targets[0]}"
        away = list(self.c.master_names) if f.variant == "master" else \
            [*self.c.master_names, *(f"d{i}" for i in range(NODES) if i != f.targets[0])]
        self.c.net.partition(name, away)
        self._watch(f.hold_s, self.c.nodes[f.targets[0]].url, ep)
        self.c.net.heal(name)
        ep.notes["to_rf_s"] = self._time_to_rf(ep.started)
