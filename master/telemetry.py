"""What operators see, computed cheaply: a paced scan of every queue, the busiest queues, and
an hour of history for the dashboard and ``/metrics``.

With 100,000 queues one pass over them costs ~100 ms of Python, far over the 10 ms a
scrape or a dashboard refresh may take on the event loop. So nothing reads every queue on
a request: :class:`Telemetry` scans the queue table ``SCAN_SLICE`` queues at a time (one
slice every ``SCAN_PAUSE_S``, a few ms each, resuming after the last key it saw, so
queues created or deleted meanwhile are fine) and publishes a :class:`Snapshot` when a
pass completes: totals, queue counts, the ``TOP_QUEUES`` largest queues, and the
dead-letter queues holding tasks (``TOP_DEAD`` at most). Requests read the last snapshot,
and re-read the *live* counters of the few queues they show. Totals lag by at most one
pass (about ``len(queues) / SCAN_SLICE * SCAN_PAUSE_S``: 5 s for 100,000 queues).

At most every ``ROWS_INTERVAL_S`` (1 s) the rows of the listed queues (live counters,
rates, oldest age, dead letters) are recomputed in one read transaction, so a dashboard
refresh or a scrape only serialises them: its cost does not grow with the number of
queues, nor with the number of people watching.

Every ``HISTORY_INTERVAL_S`` a point is added to an in-memory ring of ``HISTORY_POINTS``
(one hour): totals, rates and cluster health, plus depth and rates of the
``HISTORY_QUEUES`` largest queues. The history restarts empty with the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

from squall.common.wire.names import join_queue, split_queue
from squall.master.storage.records import LEASED, Task, task_key
from squall.master.tasks import policies

if TYPE_CHECKING:
    from squall.master.service import Master
    from squall.master.storage.records import QueueRec

log = logging.getLogger("squall.master")
TOP_QUEUES = 100  # queues the dashboard lists (sortable); /metrics labels the first 50
METRIC_QUEUES = 50  # per-queue metric series: the 50 largest queues, the rest as "other"
TOP_DEAD = 50
REASONS = 20  # dead-letter queues shown with the last error of their first task
ROWS_INTERVAL_S = 1.0  # how often the listed queues' rows are recomputed
SCAN_SLICE = 1000
SCAN_PAUSE_S = 0.05
HISTORY_INTERVAL_S = 5.0
HISTORY_POINTS = 720  # one hour at 5 s
HISTORY_QUEUES = 20
WORKER_READS = 1000  # task records read per refresh for the workers view, at most
WORKERS = 200  # workers listed, most tasks first


@dataclass
class Snapshot:
    at: float = 0.0  # wall time the pass ended (0: no pass yet)
    scan_secs: float = 0.0  # wall time one pass took
    queues: int = 0  # queue records (including empty ones)
    holding: int = 0  # queues holding tasks
    available: int = 0
    leased: int = 0
    delayed: int = 0
    completed: int = 0
    dead_letters: int = 0  # tasks in dead-letter queues
    top: list[tuple[str, str]] = field(default_factory=list)  # largest first
    dead: list[tuple[str, str]] = field(default_factory=list)  # dead-letter queues, largest


class _Pass:
    """One scan in progress."""

    def __init__(self, dlq_names: set[tuple[str, str]]) -> None:
        self.started = time.time()
        self.s = Snapshot()
        self.top: list[tuple[int, tuple[str, str]]] = []
        self.dead: list[tuple[int, tuple[str, str]]] = []
        self.dlq_names = dlq_names
        self.after: tuple[str, str] | None = None

    def add(self, q: QueueRec) -> None:
        s = self.s
        size = q.size
        s.queues += 1
        s.available += q.available
        s.leased += q.leased
        s.delayed += q.delayed
        s.completed += q.completed
        if not size:
            return
        s.holding += 1
        key = (q.group, q.name)
        if len(self.top) < TOP_QUEUES:
            heapq.heappush(self.top, (size, key))
        elif size > self.top[0][0]:
            heapq.heapreplace(self.top, (size, key))
        if q.name.endswith(policies.DEAD_SUFFIX) or key in self.dlq_names:
            s.dead_letters += size
            if len(self.dead) < TOP_DEAD:
                heapq.heappush(self.dead, (size, key))
            elif size > self.dead[0][0]:
                heapq.heapreplace(self.dead, (size, key))

    def finish(self) -> Snapshot:
        s = self.s
        s.at = time.time()
        s.scan_secs = s.at - self.started
        s.top = [k for _, k in sorted(self.top, reverse=True)]
        s.dead = [k for _, k in sorted(self.dead, reverse=True)]
        return s


def is_dead_letter_queue(m: Master, group: str, name: str) -> bool:
    return name.endswith(policies.DEAD_SUFFIX) or (group, name) in _dlq_names(m)


def _dlq_names(m: Master) -> set[tuple[str, str]]:
    """Queues some policy names as its dead-letter queue (policies are few)."""
    return {(g, str(p["dead_letter_queue"])) for (g, _), p in m.index.policies.items()
            if p and p.get("dead_letter_queue")}


class Telemetry:
    def __init__(self, m: Master) -> None:
        self.m = m
        self.snapshot = Snapshot()
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_POINTS)
        self.queue_history: dict[str, deque[list[float]]] = {}
        self._pass: _Pass | None = None
        self._task: asyncio.Task[None] | None = None
        self._next_point = 0.0
        self.rows: list[dict[str, Any]] = []
        self.dead_rows: list[dict[str, Any]] = []
        self.rows_at = 0.0
        self.workers: list[dict[str, Any]] = []  # who holds what (refresh_rows)
        self.paced = False  # start() ran: reads use the snapshot, never scan

    # -- the paced scan ------------------------------------------------------------------
    def scan_slice(self) -> bool:
        """Scan the next slice of queues; True when that completed a pass."""
        queues = self.m.index.queues
        p = self._pass
        if p is None:
            p = self._pass = _Pass(_dlq_names(self.m))
        keys = list(islice(queues.irange(minimum=p.after, inclusive=(False, False)),
                           SCAN_SLICE)) if p.after else list(islice(queues.keys(), SCAN_SLICE))
        for k in keys:
            q = queues.get(k)
            if q is not None:
                p.add(q)
        if keys:
            p.after = keys[-1]
        if len(keys) < SCAN_SLICE:
            self.snapshot = p.finish()
            self._pass = None
            return True
        return False

    def scan_all(self) -> Snapshot:
        """A whole pass at once (tests, and the first snapshot at start)."""
        self._pass = None
        while not self.scan_slice():
            pass
        return self.snapshot

    async def _loop(self) -> None:
        while True:
            try:
                self.scan_slice()
                now = time.time()  # one more step at most per turn: never a long hold
                if now - self.rows_at >= ROWS_INTERVAL_S:
                    self.refresh_rows(now)
                elif now >= self._next_point:
                    self._next_point = now + HISTORY_INTERVAL_S
                    self.add_point(now)
            except Exception:  # never let the loop die; the next pass starts over
                log.exception("telemetry pass failed")
                self._pass = None
            await asyncio.sleep(SCAN_PAUSE_S)

    def start(self) -> None:
        self.paced = True
        self.scan_all()
        self.refresh_rows(time.time())
        self.add_point(time.time())
        self._next_point = time.time() + HISTORY_INTERVAL_S
        self._task = asyncio.create_task(self._loop(), name="telemetry")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- reads ---------------------------------------------------------------------------
    def current(self) -> Snapshot:
        """The last snapshot; without the background loop (tests on an injected clock) a
        fresh pass on every read."""
        if not self.paced:
            self.scan_all()
            self.refresh_rows(time.time())
        return self.snapshot

    def queue_row(self, key: tuple[str, str], now: float, txn: Any = None
                  ) -> dict[str, Any] | None:
        """Live counters, 1-minute rates and oldest available age of one queue (None if it
        is gone); `txn`: a read transaction to reuse (else one is opened)."""
        m = self.m
        q = m.index.queues.get(key)
        if q is None:
            return None
        meter = m.meters.queues.get(key)
        r = [meter.rates[k][0].at(now) if meter is not None else 0.0
             for k in ("enqueue", "lease", "dequeue")]
        age = None
        if q.available:
            if txn is None:
                with m.index.env.begin() as t:
                    ms = m.index.oldest_available_ms(t, q)
            else:
                ms = m.index.oldest_available_ms(txn, q)
            age = round(max(0.0, now - ms / 1000), 3) if ms is not None else None
        paused, blocked = m.engine.flow.held_back(q)
        return {"queue": join_queue(*key), "available": q.available, "leased": q.leased,
                "delayed": q.delayed, "paused": paused, "blocked": blocked,
                "queue_paused": bool((m.index.pauses.get(key) or {}).get("paused")),
                "total": q.size,
                "completed": q.completed,
                "enqueued_total": q.enqueued_total, "oldest_age_secs": age,
                "enqueue_1m": round(r[0], 3), "lease_1m": round(r[1], 3),
                "dequeue_1m": round(r[2], 3)}

    def refresh_rows(self, now: float) -> None:
        """Precompute what the dashboard and a scrape list: rows of the largest queues (with
        whether each is a dead-letter queue and how many dead letters it has), and of the
        dead-letter queues with the last error of their first task. Runs in the background
        at most every ``ROWS_INTERVAL_S``, one read transaction for all."""
        m, s = self.m, self.snapshot
        dlqs = _dlq_names(m)
        rows, dead = [], []
        with m.index.env.begin() as txn:
            for key in s.top[:TOP_QUEUES]:
                row = self.queue_row(key, now, txn)
                q = m.index.queues.get(key)
                if row is None or q is None:
                    continue
                row["dead_letter_queue"] = (key[1].endswith(policies.DEAD_SUFFIX)
                                            or key in dlqs)
                dq = m.index.queues.get((key[0], policies.dead_letter_queue(
                    m.engine.policy(q), key[1])))
                row["dead_letters"] = dq.size if dq is not None else 0
                rows.append(row)
            for i, key in enumerate(s.dead):
                row = self.queue_row(key, now, txn)
                q = m.index.queues.get(key)
                if row is None or q is None:
                    continue
                row["reasons"] = ([{"pid": t.pid, "error": (t.error or "")[:300],
                                    "origin": t.origin, "attempts": t.attempts}
                                   for t in m.index.iter_tasks(txn, q, b"", 1)]
                                  if i < REASONS else [])
                dead.append(row)
            workers = self._workers(txn, rows)
        self.rows, self.dead_rows, self.rows_at = rows, dead, now
        self.workers = workers

    def _workers(self, txn: Any, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Who holds what, since when: the live leases among each listed queue's recent
        leases (its meter keeps the last 32 pids), grouped by worker and address. A sample:
        at most ``WORKER_READS`` task reads, from the largest queues down."""
        m = self.m
        by: dict[tuple[str, str], dict[str, Any]] = {}
        reads = 0
        now_ms = m.clock.now() * 1000  # the clock leases are stamped with
        for row in rows:
            if not row["leased"] or reads >= WORKER_READS:
                continue
            key = split_queue(row["queue"])
            q, meter = m.index.queues.get(key), m.meters.queues.get(key)
            if q is None or meter is None:
                continue
            for pid in set(list(meter.recent_leases)[-(WORKER_READS - reads):]):
                reads += 1
                # read past Index.get_task: it leaves hints for the open write batch
                raw = txn.get(task_key(q.qid, q.gen, pid.encode()), None, m.index.tasks)
                t = Task.unpack(raw) if raw is not None else None
                if t is None or t.pid != pid or t.state != LEASED or t.expiry_ms <= now_ms:
                    continue
                at = t.leased_ms / 1000
                w = by.setdefault((t.worker, t.worker_addr), {
                    "worker": t.worker, "address": t.worker_addr, "tasks": 0, "queues": {},
                    "since": at, "last_lease": at, "oldest": None})
                w["tasks"] += 1
                w["queues"][row["queue"]] = w["queues"].get(row["queue"], 0) + 1
                w["last_lease"] = max(w["last_lease"], at)
                if w["oldest"] is None or at < w["since"]:
                    w["since"] = at
                    w["oldest"] = {"queue": row["queue"], "pid": t.pid,
                                   "expires_at": t.expiry_ms / 1000}
        out = sorted(by.values(), key=lambda w: (-w["tasks"], w["worker"]))[:WORKERS]
        for w in out:
            w["queues"] = [{"queue": k, "tasks": n} for k, n in
                           sorted(w["queues"].items(), key=lambda kv: -kv[1])]
        return out

    def add_point(self, now: float) -> None:
        m, s = self.m, self.snapshot
        r = m.meters.total.snapshot(now)
        info = m.cluster.info()
        states: dict[str, int] = {}
        for n in info["nodes"]:
            states[n["state"]] = states.get(n["state"], 0) + 1
        self.history.append({
            "t": round(now, 3), "available": s.available, "leased": s.leased,
            "delayed": s.delayed, "dead_letters": s.dead_letters,
            "enqueue": r["enqueue_1m"], "lease": r["lease_1m"], "dequeue": r["dequeue_1m"],
            "under_replicated": info["under_replicated"], "lost": info["lost"],
            "nodes_alive": states.get("alive", 0),
            "nodes_down": sum(v for k, v in states.items() if k != "alive")})
        keep = set()
        for row in self.rows[:HISTORY_QUEUES]:
            name = row["queue"]
            keep.add(name)
            ring = self.queue_history.setdefault(name, deque(maxlen=HISTORY_POINTS))
            ring.append([round(now, 3), row["available"], row["leased"], row["delayed"],
                         row["oldest_age_secs"] or 0.0, row["enqueue_1m"], row["lease_1m"],
                         row["dequeue_1m"]])
        # bounded: rings of queues that left the top are dropped once there are too many
        if len(self.queue_history) > 4 * HISTORY_QUEUES:
            for name in [n for n in self.queue_history if n not in keep]:
                del self.queue_history[name]
