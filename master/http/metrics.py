"""The master's Prometheus metrics (``GET /metrics``), read at scrape time from counters the
master keeps anyway; nothing here walks all queues (see :mod:`squall.master.telemetry`).

Per-queue series (``squall_queue_*``) carry labels ``group`` and ``queue`` for the
``METRIC_QUEUES`` (50) largest queues of the last telemetry pass; every other queue is
summed into one series with ``group="", queue="__other__"``, so a scrape has at most 51
series per per-queue metric whatever the number of queues. Counters (``*_total``) are
process-wide and only grow (deleting a queue does not lower them); they restart at zero
with the process, as Prometheus counters do, except ``squall_tasks_enqueued_total`` and
``squall_tasks_completed_total``, which the index keeps across restarts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from squall.common.server import runtime
from squall.common.server.metrics import (
    Hist,
    HttpStats,
    build_info,
    hist_text,
    histogram,
    label_set,
    value_text,
)
from squall.master.telemetry import METRIC_QUEUES, Telemetry

if TYPE_CHECKING:
    from squall.master.service import Master

EVENTS = {  # Meters.counts kind -> counter name and help (enqueued, completed: the index's)
    "lease": ("squall_tasks_leased", "leases granted"),
    "release": ("squall_tasks_released", "leased tasks released (given back)"),
    "expire": ("squall_leases_expired", "leases that expired (the sweeper made the task "
               "available again)"),
    "dead_letter": ("squall_tasks_dead_lettered", "tasks moved to a dead-letter queue"),
    "cancel": ("squall_tasks_cancelled", "queued tasks cancelled by pid"),
}


QUEUE_SERIES = (  # row key, series name, type, help
    ("available", "squall_queue_available", "gauge", "available tasks of a queue"),
    ("leased", "squall_queue_leased", "gauge", "leased tasks of a queue"),
    ("delayed", "squall_queue_delayed", "gauge", "delayed tasks of a queue"),
    ("paused", "squall_queue_paused", "gauge",
     "available tasks of a queue held by a pause (the queue's or a key's)"),
    ("blocked", "squall_queue_blocked", "gauge",
     "available tasks of a queue held by a concurrency or rate limit (more workers would "
     "not take them: scale on available - paused - blocked)"),
    ("oldest_age_secs", "squall_queue_oldest_age_seconds", "gauge",
     "age of the oldest available task (queue latency)"),
    ("dead_letters", "squall_queue_dead_letters", "gauge",
     "tasks in the queue's dead-letter queue"),
    ("completed", "squall_queue_completed_total", "counter",
     "tasks dequeued from a queue (since it was created)"),
)


class WalTimes:
    """Latency of the WAL writer's writes and fdatasyncs (fed by the writer thread)."""

    def __init__(self) -> None:
        self.write = Hist()
        self.sync = Hist()
        self.frames = Hist((1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000))

    def __call__(self, write_s: float, sync_s: float, frames: int) -> None:
        self.write.observe(write_s)
        self.sync.observe(sync_s)
        self.frames.observe(frames)


class MasterMetrics:
    def __init__(self, m: Master, telemetry: Telemetry, http: HttpStats, wal: WalTimes
                 ) -> None:
        self.m, self.t, self.http, self.wal = m, telemetry, http, wal

    def collect(self) -> Iterator[Metric | str]:
        yield build_info("squall_master")
        yield from self._tasks()
        yield from self._queues()
        yield from self._wal()
        if self.m.ha is not None:
            yield from self._master_set()
        yield from self._cluster()
        yield from self.http.collect("squall_master")
        yield runtime.metric()

    def _tasks(self) -> Iterator[Metric]:
        m, s = self.m, self.t.current()
        g = GaugeMetricFamily("squall_tasks", "tasks by state (all queues, as of the last "
                              "telemetry pass)", labels=["state"])
        for state in ("available", "leased", "delayed"):
            g.add_metric([state], getattr(s, state))
        yield g
        yield GaugeMetricFamily("squall_queues", "queues holding tasks", value=s.holding)
        yield GaugeMetricFamily("squall_queue_records", "queue records, empty ones included",
                                value=s.queues)
        yield GaugeMetricFamily("squall_dead_letters", "tasks in dead-letter queues",
                                value=s.dead_letters)
        yield GaugeMetricFamily("squall_telemetry_age_seconds", "age of the last pass over "
                                "all queues", value=max(0.0, time.time() - s.at))
        yield CounterMetricFamily("squall_tasks_enqueued", "tasks enqueued (ever: kept in the "
                                  "index, so neither queue deletion nor a restart lowers it)",
                                  value=m.index.enqueued_total)
        yield CounterMetricFamily("squall_tasks_completed", "tasks dequeued (ever, as above)",
                                  value=m.index.completed_total)
        for kind, (name, doc) in EVENTS.items():
            yield CounterMetricFamily(name, doc, value=m.meters.counts.get(kind, 0))
        yield CounterMetricFamily("squall_tasks_reaped", "tasks of deleted queues reaped",
                                  value=m.reaped)
        yield GaugeMetricFamily("squall_lease_waiting", "leases parked waiting for a task "
                                "(wait_secs)", value=m.waiters.total)
        yield CounterMetricFamily("squall_lease_waits_refused", "waiting leases refused by "
                                  "the per-queue or total bound", value=m.waiters.refused)
        yield CounterMetricFamily("squall_lease_wait_attempts", "leases tried by parked "
                                  "requests once woken (about one per task they lease: a "
                                  "notification wakes as many as there are tasks)",
                                  value=m.waiters.attempts)

    def _queues(self) -> Iterator[str]:
        """Per-queue series as text: one escaped label set per queue, shared by its six
        series (a scrape stays cheap with the 50 labelled queues)."""
        s = self.t.snapshot
        rows = self.t.rows[:METRIC_QUEUES]  # precomputed, at most 1 s old
        labels = [label_set(group=r["queue"].split("#", 1)[0],
                            queue=r["queue"].split("#", 1)[1]) for r in rows]
        other = label_set(group="", queue="__other__")
        held = dict(zip(("paused", "blocked"), self.m.flow_totals(), strict=True))
        for key, name, typ, doc in QUEUE_SERIES:
            lines = [f"# HELP {name} {doc}\n# TYPE {name} {typ}\n"]
            lines += [f"{name}{lab} {value_text(r[key] or 0.0)}\n"
                      for lab, r in zip(labels, rows, strict=True)]
            if key in ("available", "leased", "delayed", "completed"):
                rest = max(0, getattr(s, key) - sum(r[key] for r in rows))
                lines.append(f"{name}{other} {value_text(rest)}\n")
            elif key in held:
                rest = max(0, held[key] - sum(r.get(key, 0) for r in rows))
                lines.append(f"{name}{other} {value_text(rest)}\n")
            yield "".join(lines)

    def _wal(self) -> Iterator[Metric | str]:
        w = self.m.wal
        yield CounterMetricFamily("squall_wal_records", "WAL records written", value=w.records)
        yield CounterMetricFamily("squall_wal_syncs", "WAL fdatasync calls", value=w.syncs)
        yield GaugeMetricFamily("squall_wal_ticket", "last WAL ticket", value=w.last_ticket)
        yield CounterMetricFamily("squall_wal_failures", "WAL writes or syncs that failed",
                                  value=w.failures)
        yield GaugeMetricFamily("squall_wal_healthy", "1 while the WAL accepts writes",
                                value=0 if self.m.ready() else 1)
        yield CounterMetricFamily("squall_checkpoints", "checkpoints", value=self.m.checkpoints)
        yield histogram("squall_wal_write_seconds", "time of one WAL write() of a group "
                        "of records", self.wal.write)
        yield histogram("squall_wal_fsync_seconds", "time of one WAL fdatasync",
                        self.wal.sync)
        yield histogram("squall_wal_group_records", "records per WAL group commit",
                        self.wal.frames)

    def _master_set(self) -> Iterator[Metric | str]:
        ha = self.m.ha
        yield GaugeMetricFamily("squall_master_leader", "1 while this member leads its "
                                "master set", value=1 if ha.role == "leader" else 0)
        yield GaugeMetricFamily("squall_master_epoch", "the master set's epoch as this "
                                "member knows it", value=ha.leader_view()["epoch"])
        yield GaugeMetricFamily("squall_master_lag_records", "records this member's index "
                                "is behind its journal (a standby)", value=ha.lag())
        yield CounterMetricFamily("squall_master_failovers", "times this member became the "
                                  "leader", value=ha.counters.failovers)
        yield CounterMetricFamily("squall_master_step_downs", "times this member stopped "
                                  "leading", value=ha.counters.step_downs)
        yield CounterMetricFamily("squall_master_refused_groups", "WAL groups refused: no "
                                  "majority, fenced, or not the leader",
                                  value=ha.counters.refused_groups)
        yield histogram("squall_journal_append_seconds", "one journal's append of a group "
                        "(the leader's calls, its own journal included)", ha.append_hist)
        yield histogram("squall_quorum_wait_seconds", "a group's wait until a majority "
                        "of journals had it durable", ha.quorum_hist)

    def _cluster(self) -> Iterator[Metric | str]:
        info = self.m.cluster.info()
        g = GaugeMetricFamily("squall_datanodes", "data nodes by state", labels=["state"])
        states: dict[str, int] = {"alive": 0, "suspect": 0, "dead": 0}
        for n in info["nodes"]:
            states[n["state"]] = states.get(n["state"], 0) + 1
        for st, n in sorted(states.items()):
            g.add_metric([st], n)
        yield g
        yield GaugeMetricFamily("squall_blobs", "payload blobs known", value=info["blobs"])
        yield GaugeMetricFamily("squall_blobs_under_replicated", "blobs with fewer live "
                                "copies than the replication factor",
                                value=info["under_replicated"])
        yield GaugeMetricFamily("squall_blobs_lost", "blobs no live data node holds",
                                value=info["lost"])
        yield GaugeMetricFamily("squall_copies_in_flight", "re-replication copies ordered "
                                "and not yet reported", value=info["copies_in_flight"])
        repair = self.m.cluster.repair
        yield GaugeMetricFamily("squall_blob_copy_bytes_in_flight", "bytes of re-replication "
                                "copies running", value=repair.in_flight()[1])
        yield CounterMetricFamily("squall_blob_copies", "re-replication copies finished since "
                                  "start", value=repair.copies_done)
        yield CounterMetricFamily("squall_blob_copy_bytes", "bytes re-replicated since start",
                                  value=repair.bytes_done)
        yield CounterMetricFamily("squall_blob_scan_passes", "passes of the scan for "
                                  "referenced blobs no live node reports",
                                  value=self.m.cluster.scan.passes)
        # the master's view of each node, named apart from what each node exports itself
        # (squall_datanode_used_bytes): a sum over both must not count a node twice
        cap = GaugeMetricFamily("squall_cluster_node_capacity_bytes", "capacity of each data "
                                "node as its last heartbeat reported it", labels=["node"])
        used = GaugeMetricFamily("squall_cluster_node_used_bytes", "bytes stored on each data "
                                 "node as its last heartbeat reported it", labels=["node"])
        for n in info["nodes"]:
            cap.add_metric([n["node_id"]], n["capacity_bytes"])
            used.add_metric([n["node_id"]], n["used_bytes"])
        yield cap
        yield used
        yield hist_text("squall_master_cluster_work_seconds", "event-loop time of one piece "
                        "of cluster work (kind: a heartbeat's block report and commands, or "
                        "a tick or slice of repair and GC); requests wait behind it",
                        [({"kind": k}, h) for k, h in self.m.cluster.work.hists.items()])


def wal_error(m: Master) -> str | None:
    """Why the WAL refuses appends right now (the master cannot log changes), or None."""
    return m.wal.failure()
