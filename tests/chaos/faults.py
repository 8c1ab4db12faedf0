"""The seeded fault schedule and the hands that carry it out.

:func:`plan` draws the whole schedule from one seed before anything starts: which fault,
when, against which server, for how long. The same seed gives the same schedule (the
load's interleaving around it is the machine's). Faults run one after another; each one
is an *episode* with a start, a fault, a hold time and a repair, written to the episode
log with its timings.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import subprocess
import sys
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
from tests.helpers import ADMIN, wait_for

KINDS = ("kill_master", "kill_node", "kill_two_nodes", "kill_holder_during_repair",
         "kill_worker", "fill_node_disk", "fill_master_disk", "partition_node")
NEEDS_ROOT = ("fill_node_disk", "fill_master_disk", "partition_node")
# a master set (`--masters 3`): the leader killed (-9) and restarted as a standby instead
# of the master; the master's disk is not filled (a set member's journal is another test)
SET_KINDS = {"kill_master": "kill_leader", "fill_master_disk": None}
# faults only a master set has (added to its schedule by default; see the methods)
SET_ONLY_KINDS = ("stop_leader", "partition_leader_elector", "partition_leader_journals",
                  "wipe_standby")
SET_NEEDS_ROOT = ("partition_leader_elector", "partition_leader_journals")
SET_WAIT_S = 180.0  # how long a master-set episode waits for a leader, a role, a catch-up
PROBE_QUEUE = "soak#probe"
RESUME_LIMIT_S = 20.0


@dataclass
class Fault:
    gap_s: float  # pause after the previous episode ended (or after the load started)
    kind: str
    targets: list[int]  # data node numbers, a worker slot, or wipe_standby's standby rank
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
        hold = rng.uniform(0.3, 3.0) if kind in ("kill_leader", "wipe_standby") else \
            rng.uniform(0.0, 2.0) if kind == "stop_leader" else \
            rng.uniform(1.0, 4.0) if kind.startswith("partition_leader") else {
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
                   "kill_worker": [rng.randrange(workers)]}.get(kind, [])
        if kind == "wipe_standby":  # the leader's first or second standby (by member order)
            targets = [rng.randrange(2)]
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
        the old leader restarted until it is a standby in sync again."""
        old = self.c.wait_leader()
        t = time.monotonic()
        self.c.masters[old].kill9()
        new = self.c.wait_leader(not_=old)
        ep.notes["failover_s"] = round(time.monotonic() - t, 2)
        ep.notes["new_leader"] = self.c.master_names[new]
        self._hold(f.hold_s)
        t = time.monotonic()
        self.c.masters[old].launch()
        self._back_as_standby(old, ep, t)
        ep.notes["restart_s"] = ep.notes.pop("standby_again_s")

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

    # -- a master set's own faults ---------------------------------------------------------
    def _member(self, i: int) -> str:
        return self.c.master_names[i]

    def _epoch(self, i: int) -> int:
        return int((self.c.leader_view(i) or {}).get("epoch") or 0)

    def _until(self, cond: Callable[[], Any], what: str) -> None:
        wait_for(cond, SET_WAIT_S, interval=0.1, what=what)

    def _new_leader(self, old: int, epoch: int, t: float, ep: Episode) -> int:
        """Wait for a member other than `old` to lead; note the failover time, and a
        finding unless its epoch is above `epoch` (the deposed leader's)."""
        new = self.c.wait_leader(SET_WAIT_S, not_=old)
        ep.notes["failover_s"] = round(time.monotonic() - t, 2)
        ep.notes["new_leader"] = self._member(new)
        got = self._epoch(new)
        ep.notes["epochs"] = [epoch, got]
        if got <= epoch:
            self.findings.append(f"{ep.fault.kind}: {self._member(new)} leads in epoch "
                                 f"{got}, not above the deposed leader's {epoch}")
        return new

    def _back_as_standby(self, i: int, ep: Episode, t: float) -> None:
        """The episode's repair: member `i` a standby again, its journal in sync in the
        leader's view (the next episode starts from a whole set)."""
        def healed() -> bool:
            lead = self.c.leader()
            if lead is None or lead == i or self.c.role(i) != "standby":
                return False
            return bool((self.c.journal_view(lead, i) or {}).get("in_sync"))

        self._until(healed, f"{self._member(i)} a standby in sync again")
        ep.notes["standby_again_s"] = round(time.monotonic() - t, 2)

    def stop_leader(self, f: Fault, ep: Episode) -> None:
        """SIGSTOP the leader until another member leads (its elector lease ran out), hold,
        then SIGCONT. A put sent to the stopped leader (it waits in its socket and is
        served once it runs again) must be refused: a resumed leader acknowledges nothing;
        the probe ledger holds its outcome (a refused put must never be delivered). The
        leader must step down by itself."""
        old = self.c.wait_leader(SET_WAIT_S)
        epoch = self._epoch(old)
        s = self.c.masters[old]
        s.signal(signal.SIGSTOP)
        t = time.monotonic()
        late: http.client.HTTPConnection | None = None
        pid = ""
        try:
            self._new_leader(old, epoch, t, ep)
            self._hold(f.hold_s)
            self.probes += 1
            pid = f"late-{self.probes:05d}"
            late = self._send_put(s.url, pid)  # connected and sent: the kernel queues it
        finally:
            s.signal(signal.SIGCONT)
        ep.notes["stopped_s"] = round(time.monotonic() - t, 2)
        if late is not None:
            self._late_outcome(late, pid, ep)
        t = time.monotonic()
        self._back_as_standby(old, ep, t)

    def _send_put(self, url: str, pid: str) -> http.client.HTTPConnection | None:
        """An enqueue of `pid` (no payload) into the probe queue, sent to `url` only (no
        client that would follow a standby's answer to the leader); its answer is read
        later. None if it could not be sent (its outcome is then unknown)."""
        host, port = url.removeprefix("http://").rsplit(":", 1)
        group, queue = PROBE_QUEUE.split("#")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            conn.request("POST", f"/v1/groups/{group}/queues/{queue}/tasks",
                         json.dumps({"tasks": [{"pid": pid}]}).encode(),
                         {**ADMIN, "Content-Type": "application/json"})
        except OSError as e:
            conn.close()
            self.probe_led.write("put?", q=PROBE_QUEUE, pid=pid, crc=crc(b""), n=0,
                                 err=repr(e)[:200])
            return None
        return conn

    def _late_outcome(self, conn: http.client.HTTPConnection, pid: str, ep: Episode) -> None:
        try:
            r = conn.getresponse()
            status, body = r.status, r.read()[:300]
        except OSError as e:
            status, body = 0, repr(e).encode()
        finally:
            conn.close()
        ep.notes["late_put"] = status or body.decode(errors="replace")
        if 200 <= status < 300:
            self.probe_led.write("put", q=PROBE_QUEUE, pid=pid, crc=crc(b""), n=0)
            self.findings.append(f"stop_leader: the leader acknowledged a put ({pid}) after "
                                 f"it resumed: {status} {body!r}")
        elif status and status not in (500, 502, 504):  # refused: nothing was applied
            self.probe_led.write("put-", q=PROBE_QUEUE, pid=pid, crc=crc(b""), n=0,
                                 err=f"{status} {body!r}"[:200])
        else:
            self.probe_led.write("put?", q=PROBE_QUEUE, pid=pid, crc=crc(b""), n=0,
                                 err=f"{status} {body!r}"[:200])

    def _partition_leader(self, f: Fault, ep: Episode, away: Callable[[int], list[str]]
                          ) -> None:
        """Cut the leader off from the hosts `away(leader)` only (clients, workers and data
        nodes still reach it): another member must lead in a higher epoch and the cut-off
        leader step down by itself; hold, heal, until it is a standby again."""
        assert self.c.net is not None
        old = self.c.wait_leader(SET_WAIT_S)
        epoch = self._epoch(old)
        name = self._member(old)
        self.c.net.partition(name, away(old))
        t = time.monotonic()
        try:
            self._new_leader(old, epoch, t, ep)
            self._until(lambda: self.c.role(old) not in ("leader", "candidate"),
                        f"{name} stepping down")
            ep.notes["step_down_s"] = round(time.monotonic() - t, 2)
            self._hold(f.hold_s)
        finally:
            self.c.net.heal(name)
        self._back_as_standby(old, ep, time.monotonic())

    def partition_leader_elector(self, f: Fault, ep: Episode) -> None:
        """The leader cut off from the elector (etcd, in its own namespace) only: its
        lease runs out by its own clock, it refuses writes and steps down."""
        self._partition_leader(f, ep, lambda _i: ["e"])

    def partition_leader_journals(self, f: Fault, ep: Episode) -> None:
        """The leader cut off from the other members (their journals) only: its next group
        (or heartbeat append) finds no majority, it steps down (quorum lost or fenced)."""
        self._partition_leader(f, ep, lambda i: [n for j, n in enumerate(self.c.master_names)
                                                 if j != i])

    def wipe_standby(self, f: Fault, ep: Episode) -> None:
        """SIGKILL a standby, wipe its data folder, hold, restart it: the leader must report
        its journal unformatted (it never counts toward a majority) until it is re-added
        with `squall master members add` and caught up (in sync), as an operator would."""
        lead = self.c.wait_leader(SET_WAIT_S)
        standbys = [i for i in range(len(self.c.masters)) if i != lead]
        victim = standbys[f.targets[0] % len(standbys)]
        s = self.c.masters[victim]
        ep.notes["wiped"] = s.name
        s.kill9()
        shutil.rmtree(os.path.join(s.data_dir, "data"))
        self._hold(f.hold_s)
        s.launch()
        t = time.monotonic()

        def view() -> dict[str, Any] | None:
            lead = self.c.leader()
            return None if lead is None else self.c.journal_view(lead, victim)

        def unformatted() -> bool:
            v = view()
            return v is not None and "unformatted" in str(v.get("status"))

        self._until(unformatted, f"the leader reporting {s.name} unformatted")
        ep.notes["unformatted_after_s"] = round(time.monotonic() - t, 2)
        with contextlib.suppress(TimeoutError):  # it stays out until re-added
            wait_for(lambda: (view() or {}).get("in_sync"), 2.0, interval=0.2)
            self.findings.append(f"wipe_standby: {s.name}'s wiped journal counted as in "
                                 f"sync before it was re-added: {view()}")
        t = time.monotonic()
        squall = os.path.join(os.path.dirname(sys.executable), "squall")
        tries: list[str] = []

        def readd() -> bool:
            lead = self.c.wait_leader(SET_WAIT_S)
            r = subprocess.run([squall, "master", "members", "add", s.url, "--master",
                                self.c.masters[lead].url], capture_output=True, text=True,
                               timeout=200)
            tries.append(f"{r.returncode}: {(r.stdout + r.stderr).strip()[-200:]}")
            return r.returncode == 0

        self._until(readd, f"`squall master members add {s.url}` to succeed")
        ep.notes["readd_tries"] = len(tries)

        def in_sync() -> bool:
            lead = self.c.leader()
            v = None if lead is None else self.c.journal_view(lead, victim)
            return bool(v and v.get("in_sync"))

        self._until(in_sync, f"{s.name} re-added and in sync")
        ep.notes["caught_up_s"] = round(time.monotonic() - t, 2)
        self._back_as_standby(victim, ep, t)
