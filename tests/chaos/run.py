"""Run the chaos soak: ``python -m tests.chaos.run --seed N --seconds S [--report FILE]``.

Phases: start the cluster and the load; carry out the seeded fault schedule (the swarm of
128 clients joins in the middle); stop the faults and the producers, repair everything,
wait for the cluster to settle; check every queued blob is back at RF; drain the queues
with fresh workers; check the ledger and the master's counters. Exit code 0 only when
every check holds. As root it re-executes itself inside ``unshare --mount --net`` so its
namespaces and tmpfs mounts are private and vanish with it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import httpx

from squall.client import Client, NotFound
from tests.chaos import disks, netns
from tests.chaos.cluster import CHECKPOINT_S, RF, SoakCluster, etcd_binary
from tests.chaos.faults import (
    KINDS,
    NEEDS_ROOT,
    SET_KINDS,
    SET_NEEDS_ROOT,
    SET_ONLY_KINDS,
    Faults,
    plan,
)
from tests.chaos.ledger import check, read_all
from tests.chaos.load import ALL_QUEUES, Producers, Workers
from tests.chaos.report import write_report
from tests.helpers import ADMIN, wait_for

RF_SAMPLE = 600  # blobs whose holders are counted node by node at the end
SET_KEEP_LOG_S = 86400.0  # a master set's checkpoint interval when a standby is wiped


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.run", description=__doc__)
    p.add_argument("--seed", type=int, default=None, help="replay this seed")
    p.add_argument("--seconds", type=float, default=60.0, help="length of the fault window")
    p.add_argument("--producers", type=int, default=4)
    p.add_argument("--rate", type=float, default=60.0, help="tasks per second, all producers")
    p.add_argument("--max-tasks", type=int, default=200_000)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--swarm-clients", type=int, default=128)
    p.add_argument("--swarm-seconds", type=float, default=15.0)
    p.add_argument("--kinds", default=None, help="fault kinds, comma-separated (default: "
                   "all; a master set's add " + ",".join(SET_ONLY_KINDS) + ")")
    p.add_argument("--masters", type=int, default=1, choices=(1, 3, 5),
                   help="a master set of this many members: kill_master kills the leader "
                   "(kill_leader), fill_master_disk is left out")
    p.add_argument("--elector", default="auto", choices=("auto", "file", "etcd"),
                   help="a master set's elector: a lease file, or an etcd in a namespace of "
                   "its own (partition_leader_elector needs it); auto: etcd when that fault "
                   "is wanted and an `etcd` binary and namespaces are there, else the file")
    p.add_argument("--checkpoint-s", type=float, default=None,
                   help="the masters' checkpoint interval (default 5 s; a master set's is a "
                   "day when wipe_standby is scheduled: a wiped member is re-added from the "
                   "leader's log)")
    p.add_argument("--dir", default=None, help="work folder (default: a new temp folder)")
    p.add_argument("--report", default=None, help="write the figures (markdown) here")
    p.add_argument("--json", default=None, help="write the summary (JSON) here")
    p.add_argument("--no-netns", action="store_true", help="all on 127.0.0.1, no partitions "
                   "or disk faults")
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse(argv)
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1, 2**31)
    if not a.inside and not a.no_netns:
        why = netns.possible()
        if why is None:  # become the same process inside private namespaces (signals reach it)
            sys.stdout.flush()
            os.execvp("unshare", ["unshare", "--mount", "--net", "--propagation", "private",
                                  "--", sys.executable, "-m", "tests.chaos.run", *argv,
                                  "--seed", str(a.seed), "--inside"])
        print(f"soak: no network namespaces ({why}); running on 127.0.0.1 without "
              f"partitions and disk faults", flush=True)
        a.no_netns = True
    return Soak(a).run()


class Soak:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.t_start = time.monotonic()
        if a.kinds is None:
            a.kinds = ",".join((*KINDS, *SET_ONLY_KINDS) if a.masters > 1 else KINDS)
        kinds = tuple(k for k in a.kinds.split(",") if k)
        unknown = set(kinds) - set(KINDS) - (
            {"kill_leader", *SET_ONLY_KINDS} if a.masters > 1 else set())
        if unknown:
            raise SystemExit(f"unknown fault kinds: {sorted(unknown)}"
                             + (" (a master set's own need --masters 3)"
                                if set(unknown) & set(SET_ONLY_KINDS) else ""))
        self.skipped: dict[str, str] = {}  # fault kind -> why it does not run here
        if a.no_netns:
            for k in kinds:
                if k in NEEDS_ROOT or k in SET_NEEDS_ROOT:
                    self.skipped[k] = "needs network namespaces and tmpfs (root)"
        if a.masters > 1:
            kinds = tuple(dict.fromkeys(v for v in (SET_KINDS.get(k, k) for k in kinds) if v))
            self.elector = a.elector
            if self.elector == "auto":
                self.elector = "etcd" if ("partition_leader_elector" in kinds
                                          and etcd_binary() and not a.no_netns) else "file"
            if self.elector == "etcd" and etcd_binary() is None:
                raise SystemExit("--elector etcd needs the `etcd` binary (make etcd)")
            if "partition_leader_elector" in kinds and "partition_leader_elector" not in \
                    self.skipped and self.elector != "etcd":
                self.skipped["partition_leader_elector"] = (
                    "no `etcd` binary (make etcd): the file elector is a file, with no "
                    "network path to cut" if etcd_binary() is None else
                    "the file elector is a file, with no network path to cut (--elector "
                    "etcd)")
        else:
            self.elector = ""
        kinds = tuple(k for k in kinds if k not in self.skipped)
        self.kinds = kinds
        # a wiped member is re-added from the leader's log, which must still hold every
        # record: checkpoints drop segments (docs/master.md, "Limits": a member re-added
        # after that is restored from a copy of a standby's volume instead)
        self.checkpoint_s = a.checkpoint_s or (SET_KEEP_LOG_S if "wipe_standby" in kinds
                                               else CHECKPOINT_S)
        self.dir = a.dir or tempfile.mkdtemp(prefix="squall-soak-")
        self.ledger_dir = os.path.join(self.dir, "ledger")
        os.makedirs(self.ledger_dir, exist_ok=True)
        self.lines: list[str] = []
        self.failures: list[str] = []
        self.summary: dict[str, Any] = {"seed": a.seed, "dir": self.dir,
                                        "netns": not a.no_netns, "masters": a.masters,
                                        "elector": self.elector, "kinds": list(kinds),
                                        "checkpoint_s": self.checkpoint_s,
                                        "skipped_kinds": self.skipped}

    def log(self, msg: str) -> None:
        line = f"[soak {time.monotonic() - self.t_start:7.1f}s] {msg}"
        self.lines.append(line)
        print(line, flush=True)

    def replay(self) -> str:
        a = self.a
        return (f"python -m tests.chaos.run --seed {a.seed} --seconds {a.seconds:g} "
                f"--kinds {','.join(self.kinds)} --producers {a.producers} --rate {a.rate:g} "
                f"--workers {a.workers} --swarm-clients {a.swarm_clients} "
                f"--swarm-seconds {a.swarm_seconds:g}" + (" --no-netns" if a.no_netns else "")
                + (f" --masters {a.masters} --elector {self.elector}" if a.masters > 1
                   else "") + (f" --checkpoint-s {a.checkpoint_s:g}" if a.checkpoint_s
                               else ""))

    def run(self) -> int:
        a = self.a
        schedule = plan(a.seed, self.kinds, a.workers)
        self.summary["replay"] = self.replay()
        self.log(f"SEED {a.seed}  replay: {self.summary['replay']}")
        for k, why in self.skipped.items():
            self.log(f"fault kind {k} skipped: {why}")
        if a.masters > 1:
            self.log(f"a master set of {a.masters}, elected by {self.elector}; checkpoints "
                     f"every {self.checkpoint_s:g}s")
        self.log(f"work folder {self.dir}; the fault sequence starts:")
        for f in schedule[:12]:
            self.log(f"  after {f.gap_s:4.2f}s {f.kind} {f.targets} hold {f.hold_s}s "
                     f"{f.variant}")
        for sig in (signal.SIGTERM, signal.SIGINT):  # stop cleanly: servers, mounts, netns
            signal.signal(sig, self._interrupted)
        c = SoakCluster(self.dir, use_netns=not a.no_netns, masters=a.masters,
                        elector=self.elector or "file", checkpoint_s=self.checkpoint_s)
        workers: Workers | None = None
        try:
            c.start()
            self.log(f"cluster up: master {c.master.url}, nodes "
                     f"{', '.join(n.url for n in c.nodes)}")
            workers = Workers(c.master_urls, self.ledger_dir, self.dir, a.workers, a.seed)
            workers.start()
            self.chaos(c, workers, schedule)
            self.settle(c, workers)
            self.drain(c)
            self.verify(c)
        except (Exception, KeyboardInterrupt) as e:
            self.failures.append(f"the soak itself failed: {e!r}")
            self.log(f"ERROR {e!r}")
        finally:
            if workers is not None:
                workers.stop(5.0)
            c.close()
        self.summary["failures"] = self.failures
        self.summary["seconds_total"] = round(time.monotonic() - self.t_start, 1)
        self.summary["load_average"] = os.getloadavg()
        if a.json:
            with open(a.json, "w") as out:
                json.dump(self.summary, out, indent=1, default=str)
        if a.report:
            write_report(a.report, self.summary)
        for msg in self.failures:
            self.log(f"FAIL {msg}")
        self.log(f"{'FAILED' if self.failures else 'PASSED'} seed {a.seed}")
        return 1 if self.failures else 0

    def _interrupted(self, signum: int, _frame: Any) -> None:
        self.log(f"signal {signum}: stopping")
        raise KeyboardInterrupt

    # -- phase 1: load and faults ---------------------------------------------------------
    def chaos(self, c: SoakCluster, workers: Workers, schedule: list[Any]) -> None:
        a = self.a
        producers = Producers(c.master_urls, self.ledger_dir, a.producers, a.rate, a.seed,
                              a.max_tasks)
        stop = threading.Event()
        faults = Faults(c, workers.kill_and_restart, stop, self.log, self.ledger_dir)
        t0 = time.monotonic()
        producers.start()
        ft = threading.Thread(target=faults.run, args=(schedule, a.seconds), name="faults",
                              daemon=True)
        ft.start()
        swarm_at = t0 + a.seconds * random.Random(a.seed).uniform(0.3, 0.5)
        swarm: subprocess.Popen[str] | None = None
        while ft.is_alive() or time.monotonic() < t0 + a.seconds:
            if swarm is None and a.swarm_clients and time.monotonic() >= swarm_at:
                self.log(f"swarm: {a.swarm_clients} clients for {a.swarm_seconds:g}s")
                swarm = subprocess.Popen(
                    [sys.executable, "-m", "tests.chaos.swarm", c.master_urls,
                     os.path.join(self.ledger_dir, "swarm.jsonl"), str(a.seed),
                     str(a.swarm_seconds), str(a.swarm_clients)],
                    stdout=subprocess.PIPE, text=True)
            ft.join(0.2)
            if time.monotonic() > t0 + a.seconds + 600:  # an episode hung: say so, move on
                self.failures.append("a fault episode did not finish within 10 minutes")
                stop.set()
                ft.join(60)
                break
        if swarm is not None:
            out, _ = swarm.communicate(timeout=a.swarm_seconds + 300)
            lines = out.strip().splitlines()
            self.summary["swarm"] = json.loads(lines[-1]) if lines else {"error": "no output"}
            if swarm.returncode:
                self.failures.append(f"the swarm exited {swarm.returncode}")
        producers.join()
        self.failures += faults.findings
        self.summary["episodes"] = [e.row() for e in faults.episodes]
        self.summary["worker_kills"] = workers.kills
        self.summary["producer_errors"] = producers.errors[:20]
        if producers.errors:
            self.failures.append(f"producers hit non-squall errors: {producers.errors[:3]}")
        self.log(f"faults over: {len(faults.episodes)} episodes; producers acked "
                 f"{producers.acked}, ambiguous {producers.ambiguous}")

    # -- phase 2: repair, settle, check replication -------------------------------------
    def settle(self, c: SoakCluster, workers: Workers) -> None:
        if c.net is not None:
            c.net.heal_all()
        for s in c.servers:
            if c.tmpfs:
                disks.free(s.data_dir)
            if not s.up:
                self.log(f"restarting {s.name}, found down after the faults")
                s.launch()
        c.wait_ready()
        codes = workers.stop(30.0)
        self.log(f"workers stopped (exit codes {codes})")
        t = time.monotonic()
        try:
            wait_for(c.settled, 180, interval=0.25, what="cluster settled at RF")
        except TimeoutError:
            self.failures.append(f"cluster not settled 180 s after the faults: {c.info()}")
        self.summary["settle_s"] = round(time.monotonic() - t, 1)
        blobs = self.queued_blobs(c)
        sample = random.Random(self.a.seed).sample(blobs, min(RF_SAMPLE, len(blobs)))
        bad = [b for b in sample if c.holders(b) != RF]
        if bad:  # trimming extra copies and late repairs: give them a bounded while
            def at_rf() -> bool:
                bad[:] = [b for b in bad if c.holders(b) != RF]
                return not bad

            with contextlib.suppress(TimeoutError):
                wait_for(at_rf, 60, interval=1.0, what="the sample at RF", fatal=Exception)
        self.summary["rf_check"] = {"queued_blobs": len(blobs), "checked": len(sample),
                                    "not_at_rf": len(bad)}
        if bad:
            self.failures.append(f"{len(bad)} of {len(sample)} checked blobs not at RF "
                                 f"{RF}: e.g. {[(b, c.holders(b)) for b in bad[:5]]}")
        self.log(f"settled in {self.summary['settle_s']}s; {len(sample)} of {len(blobs)} "
                 f"queued blobs checked, {len(bad)} not at RF")

    def queued_blobs(self, c: SoakCluster) -> list[str]:
        out = []
        with Client(c.master_urls, timeout=30.0) as cl:
            for q in ALL_QUEUES:
                try:
                    out += [t.payload.blob_id for t in cl.iter_tasks(q) if t.payload]
                except NotFound:
                    continue
        return out

    # -- phase 3: drain -------------------------------------------------------------------
    def drain(self, c: SoakCluster) -> None:
        w = Workers(c.master_urls, self.ledger_dir, self.dir, 3, self.a.seed + 7)
        w.generation = [1000] * 3  # distinct ledger file names from the chaos workers
        t = time.monotonic()
        w.start()
        try:
            wait_for(lambda: self.remaining(c) == 0, 240, interval=0.5, what="queues drained")
        except TimeoutError:
            self.failures.append(f"queues not drained in 240 s: {self.remaining(c)} left")
        finally:
            w.stop(30.0)
        self.summary["drain_s"] = round(time.monotonic() - t, 1)
        self.log(f"drained in {self.summary['drain_s']}s")

    def remaining(self, c: SoakCluster) -> int:
        n = 0
        with Client(c.master_urls, timeout=10.0) as cl:
            for q in ALL_QUEUES:
                try:
                    n += cl.stats(q).total  # type: ignore[union-attr]
                except NotFound:
                    continue  # never created (e.g. no swarm)
        return n

    # -- phase 4: the ledger against the master ------------------------------------------
    def verify(self, c: SoakCluster) -> None:
        v, exists = check(read_all(self.ledger_dir))
        self.failures += v.failures()
        counters: dict[str, Any] = {}
        with Client(c.master_urls, timeout=10.0) as cl:
            for q in ALL_QUEUES:
                want = sum(1 for k in exists if k[0] == q)
                try:
                    s = cl.stats(q)
                except Exception as e:
                    if want:
                        self.failures.append(f"stats of {q}: {e!r}")
                    continue
                counters[q] = {"completed": s.completed, "enqueued_total": s.enqueued_total,
                               "ledger_tasks": want, "left": s.total}
                for name in ("completed", "enqueued_total"):
                    if getattr(s, name) != want:
                        self.failures.append(f"{q}: master's {name} {getattr(s, name)} != "
                                             f"ledger's {want} tasks")
        for name in ("squall_tasks_completed_total", "squall_tasks_enqueued_total"):
            metric = counters[name] = self.metric(c, name)
            if metric is None and name == "squall_tasks_enqueued_total":
                continue  # a master that does not export this counter
            if metric != v.tasks:
                self.failures.append(f"{name} {metric} != ledger's {v.tasks} tasks")
        self.summary["ledger"] = {k: val for k, val in vars(v).items()
                                  if not isinstance(val, list)}
        self.summary["ledger"].update({k: len(val) for k, val in vars(v).items()
                                       if isinstance(val, list)})
        self.summary["counters"] = counters
        self.log(f"ledger: {self.summary['ledger']}")
        self.log(f"counters: {counters}")

    @staticmethod
    def metric(c: SoakCluster, name: str) -> float | None:
        text = httpx.get(c.master.url + "/metrics", timeout=10.0, headers=ADMIN).text
        m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
        return float(m.group(1)) if m else None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
