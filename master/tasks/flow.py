"""Flow control: per-key concurrency and rate limits, fair leasing across keys, pause.

A task may carry a **key** (a tenant, a customer, a domain: a name, like queue names). A
queue's policy (per queue or group, persisted as policies are, logged as ``("C", "P",
...)``) may say:

- ``key_limit``: at most N tasks of one key leased at once; ``queue_limit``: at most M
  tasks of the queue leased at once (keyed or not);
- ``key_rate``/``key_burst`` and ``rate``/``burst``: token buckets (tasks per second, and
  how many may go at once), per key and per queue, checked when a lease takes a task;
- ``fair``: leases take keys in weighted round-robin (``key_weights``, default 1): a key
  takes ``weight`` tasks in a turn, then goes to the back; each key's own tasks in pid
  order. Keyless tasks take turns as one more key.

A queue, or one key in it, may be **paused** (``("C", "F", group, queue, {"paused",
"keys"})``): leases skip it, enqueues go on; it survives restarts as any configuration.

Where the state lives. Keyed tasks are indexed in LMDB (``keyed``: ready ones per key in pid
order, and leased ones; ``master/storage/index.py``), and **not** in ``ready``, which holds
the keyless tasks only. In memory, per queue with keyed tasks (:class:`QFlow`): per key its
ready and leased counts, a lower bound of its smallest ready pid, and the set of keys a
lease may take from now (*eligible*: ready tasks, below its limit, not paused, not out of
tokens), kept as a sorted list by that bound (pid order) or an insertion-ordered dict (the
fair rotation). The index calls :meth:`Flow.moved` for every state change of a keyed task
(live and on replay), so the counts are exact across workers, expiries, releases and
restarts; :meth:`Flow.rebuild` recounts them from ``keyed`` when the index is (re)loaded.

A lease costs O(log n) per task taken, however many tasks are blocked: it merges the heads
of the eligible keys (and of the keyless stream) through a heap, touching only keys whose
head could come next; blocked keys are not in the eligible set. A key leaves it when it
reaches its limit (an apply of its lease) and comes back when a lease of it ends.

Token buckets are soft state (``rate``/``burst`` are configuration). A bucket that did not
exist yet starts as if it had been drained when the master started: ``min(burst, rate *
seconds since start)`` tokens. So a restart never grants more than ``burst`` above the
rate (it cannot know what was taken just before it), and a key first seen long after the
start starts full, as an idle key would be. A key out of tokens leaves the eligible set
until its next token is due (a heap of due times, looked at by each lease and by the
master's background tick, which wakes parked leases).

Fairness and pid priority: in a fair queue, pid order holds *within* each key; across keys
the rotation decides. A lease's ``max_pid`` bounds every key: fairness among the tasks whose
pid is at most ``max_pid`` (a priority prefix such as ``"1~"`` takes, fairly, only the pids
of band ``1``). A fair lease visits at most ``4 * max_tasks + 64`` keys.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import lmdb
from sortedcontainers import SortedList

from squall.master.storage.records import AVAILABLE, LEASED, QueueRec, key_hash, qprefix

if TYPE_CHECKING:
    from squall.master.storage.index import Index

FAIR_VISITS_FACTOR, FAIR_VISITS_MIN = 4, 64
FLOW_FIELDS = ("key_limit", "queue_limit", "key_rate", "key_burst", "rate", "burst", "fair",
               "key_weights")


class Bucket:
    """A token bucket: `rate` tokens a second, at most `burst` held."""

    __slots__ = ("burst", "rate", "t", "tokens")

    def __init__(self, rate: float, burst: float, tokens: float, now_ms: int) -> None:
        self.rate, self.burst, self.tokens, self.t = rate, burst, tokens, now_ms

    def level(self, now_ms: int) -> float:
        if now_ms > self.t:
            self.tokens = min(self.burst, self.tokens + (now_ms - self.t) * self.rate / 1000)
            self.t = now_ms
        return self.tokens

    def next_ms(self, now_ms: int) -> int:
        """When the next whole token is there."""
        missing = 1 - self.level(now_ms)
        return now_ms + max(1, math.ceil(missing * 1000 / self.rate))


class KeyState:
    __slots__ = ("bucket", "key", "lb", "leased", "listed", "ready")

    def __init__(self, key: str) -> None:
        self.key = key
        self.ready = 0
        self.leased = 0
        self.lb = b""  # <= the smallest pidkey of its ready tasks
        self.listed = False  # in the eligible set
        self.bucket: Bucket | None = None


class QFlow:
    """One queue generation's keys and its flow configuration (see the module doc)."""

    def __init__(self, qid: int, gen: int) -> None:
        self.qid, self.gen = qid, gen
        self.keys: dict[str, KeyState] = {}
        self.ready_total = 0  # ready keyed tasks
        self.version = -1  # Index.conf_version this configuration was read at
        self.key_limit: int | None = None
        self.queue_limit: int | None = None
        self.key_rate: tuple[float, float] | None = None  # (rate, burst)
        self.rate: tuple[float, float] | None = None
        self.fair = False
        self.weights: dict[str, int] = {}
        self.paused = False
        self.paused_keys: frozenset[str] = frozenset()
        self.bucket: Bucket | None = None  # the queue's
        self.sorted: SortedList = SortedList()  # (lb, key) of eligible keys (pid order)
        self.ring: dict[str, None] = {}  # eligible keys (fair), the front's turn first
        self.turn_used = 0  # tasks the ring's front key took in its current turn
        self.cooling: list[tuple[int, str]] = []  # (next token due ms, key) heap
        self.cool: dict[str, int] = {}
        # ready keyed tasks a lease may not take now, kept as keys change (O(1) to read):
        # of keys that are paused, and of other keys out of the eligible set
        self.paused_ready = 0
        self.held_ready = 0

    def _count(self, ks: KeyState, sign: int) -> None:
        if ks.key in self.paused_keys:
            self.paused_ready += sign * ks.ready
        elif not ks.listed:
            self.held_ready += sign * ks.ready

    @property
    def configured(self) -> bool:
        """Anything that changes how a lease picks tasks."""
        return bool(self.key_limit or self.queue_limit or self.key_rate or self.rate
                    or self.fair or self.paused or self.paused_keys)

    def eligible(self, ks: KeyState) -> bool:
        return (ks.ready > 0 and (self.key_limit is None or ks.leased < self.key_limit)
                and ks.key not in self.paused_keys and ks.key not in self.cool)

    def relist(self, ks: KeyState, old_lb: bytes | None = None, counted: bool = True
               ) -> None:
        """Put `ks` in or out of the eligible set (`old_lb`: its bound when listed;
        `counted`: its part of the held counts is in them, else the caller took it out)."""
        if counted:
            self._count(ks, -1)
        self._relist(ks, old_lb)
        self._count(ks, +1)

    def _relist(self, ks: KeyState, old_lb: bytes | None) -> None:
        want = self.eligible(ks)
        if self.fair:
            if want and not ks.listed:
                self.ring[ks.key] = None
            elif not want and ks.listed:
                del self.ring[ks.key]
        else:
            if ks.listed and (not want or (old_lb is not None and old_lb != ks.lb)):
                self.sorted.remove((ks.lb if old_lb is None else old_lb, ks.key))
                ks.listed = False
            if want and not ks.listed:
                self.sorted.add((ks.lb, ks.key))
        ks.listed = want

    def relist_all(self) -> None:
        self.sorted.clear()
        self.ring.clear()
        self.turn_used = 0
        if self.fair:
            self.ring[""] = None  # the keyless tasks take turns as one key
        self.paused_ready = self.held_ready = 0
        for ks in self.keys.values():
            ks.listed = False
            self.relist(ks, counted=False)

    def uncool(self, now_ms: int) -> int:
        """Keys whose next token came due go back to the eligible set; how many."""
        n = 0
        while self.cooling and self.cooling[0][0] <= now_ms:
            _, k = heapq.heappop(self.cooling)
            if self.cool.pop(k, None) is not None:
                n += 1
                ks = self.keys.get(k)
                if ks is not None:
                    self.relist(ks)
        return n

    def cool_down(self, ks: KeyState, until_ms: int) -> None:
        self.cool[ks.key] = until_ms
        heapq.heappush(self.cooling, (until_ms, ks.key))
        self.relist(ks)


class Flow:
    """Every queue's :class:`QFlow`, kept exact by the index's hooks."""

    def __init__(self, index: Index, now_ms: Callable[[], int]) -> None:
        self.index = index
        self.now_ms = now_ms  # the master's clock
        self.start_ms = now_ms()  # buckets made later start as if drained then
        self.queues: dict[int, QFlow] = {}
        self.timed: set[int] = set()  # qids with a rate limit: due() looks at these only
        index.on_key = self.moved
        index.on_reload = self.rebuild
        self.rebuild()

    # -- configuration -------------------------------------------------------------------
    def state(self, q: QueueRec, create: bool = True) -> QFlow | None:
        qf = self.queues.get(q.qid)
        if qf is None or qf.gen != q.gen:
            if not create:
                return None
            qf = self.queues[q.qid] = QFlow(q.qid, q.gen)
        if qf.version != self.index.conf_version:
            self._configure(q, qf)
        return qf

    def _configure(self, q: QueueRec, qf: QFlow) -> None:
        from squall.master.tasks.policies import effective

        pol = effective(self.index, q.group, q.name)
        pause = self.index.pauses.get((q.group, q.name)) or {}
        qf.version = self.index.conf_version
        qf.key_limit = pol.get("key_limit")
        qf.queue_limit = pol.get("queue_limit")
        qf.key_rate = _rate(pol, "key_rate", "key_burst")
        qf.rate = _rate(pol, "rate", "burst")
        qf.fair = bool(pol.get("fair"))
        qf.weights = dict(pol.get("key_weights") or {})
        qf.paused = bool(pause.get("paused"))
        qf.paused_keys = frozenset(pause.get("keys") or ())
        if qf.rate is not None or qf.key_rate is not None:
            self.timed.add(q.qid)
        if qf.rate is None:
            qf.bucket = None
        elif qf.bucket is None:
            qf.bucket = self._bucket(*qf.rate)
        else:
            qf.bucket.rate, qf.bucket.burst = qf.rate
        for ks in qf.keys.values():
            if qf.key_rate is None:
                ks.bucket = None
            elif ks.bucket is not None:
                ks.bucket.rate, ks.bucket.burst = qf.key_rate
        qf.relist_all()

    def _bucket(self, rate: float, burst: float) -> Bucket:
        now = self.now_ms()
        return Bucket(rate, burst, min(burst, max(0, now - self.start_ms) * rate / 1000), now)

    # -- the index's hooks -----------------------------------------------------------------
    def moved(self, q: QueueRec, pk: bytes, old_key: str, old: int, new_key: str, new: int
              ) -> None:
        """A task of `q` went from (`old_key`, state `old`) to (`new_key`, `new`); "" and
        -1 stand for no key and absent."""
        qf = self.queues.get(q.qid)
        if qf is None or qf.gen != q.gen or qf.version != self.index.conf_version:
            qf = self.state(q)
            assert qf is not None
        if old_key and old_key == new_key:
            self._moved(qf, old_key, pk, old, new)
            return
        if old_key:
            self._moved(qf, old_key, pk, old, -1)
        if new_key:
            self._moved(qf, new_key, pk, -1, new)

    def _moved(self, qf: QFlow, key: str, pk: bytes, old: int, new: int) -> None:
        ks = qf.keys.get(key)
        if ks is None:
            ks = qf.keys[key] = KeyState(key)
        lb = ks.lb
        qf._count(ks, -1)
        if old == AVAILABLE:
            ks.ready -= 1
            qf.ready_total -= 1
            if pk == ks.lb:  # it was the head: the next one is after it
                ks.lb = pk + b"\x00"
        elif old == LEASED:
            ks.leased -= 1
        if new == AVAILABLE:
            ks.ready += 1
            qf.ready_total += 1
            if ks.ready == 1 or pk < ks.lb:
                ks.lb = pk
        elif new == LEASED:
            ks.leased += 1
        qf.relist(ks, lb if ks.listed else None, counted=False)
        if not ks.ready and not ks.leased and not ks.listed and key not in qf.cool \
                and (ks.bucket is None or ks.bucket.level(self.now_ms()) >= ks.bucket.burst):
            del qf.keys[key]  # an idle key: nothing to remember (a full bucket is a new one)

    def rebuild(self) -> None:
        """Recount every queue's keys from the ``keyed`` index (start, or a reload after a
        refused batch). Buckets are soft state: a reload keeps them."""
        idx = self.index
        old = self.queues
        self.queues = {}
        with idx.env.begin() as txn:
            cur = txn.cursor(db=idx.keyed)
            for k, v in cast(Iterator[tuple[bytes, bytes]], cur):
                q = idx.by_qid.get(int.from_bytes(k[:4], "big"))
                if q is None or q.gen != int.from_bytes(k[4:8], "big"):
                    continue  # a deleted generation, not reaped yet
                was = old.get(q.qid)
                if was is not None and was.gen != q.gen:
                    was = None
                qf = self.queues.get(q.qid)
                if qf is None:
                    qf = self.queues[q.qid] = QFlow(q.qid, q.gen)
                    qf.bucket = was.bucket if was is not None else None
                key = bytes(v).decode()
                ks = qf.keys.get(key)
                if ks is None:
                    ks = qf.keys[key] = KeyState(key)
                    was_ks = was.keys.get(key) if was is not None else None
                    ks.bucket = was_ks.bucket if was_ks is not None else None
                if k[16] == AVAILABLE:
                    if not ks.ready:
                        ks.lb = bytes(k[17:])
                    ks.ready += 1
                    qf.ready_total += 1
                else:
                    ks.leased += 1
        for qid, was in old.items():  # keep queue buckets of queues without keyed tasks
            if qid not in self.queues and was.bucket is not None:
                self.queues[qid] = QFlow(was.qid, was.gen)
                self.queues[qid].bucket = was.bucket

    # -- leasing ---------------------------------------------------------------------------
    def active(self, q: QueueRec) -> QFlow | None:
        """The queue's flow state when a lease must go through :meth:`select` (it has keyed
        tasks or flow configuration), else None: the plain pid-order walk of ``ready``."""
        qf = self.queues.get(q.qid)
        if qf is not None and qf.gen == q.gen:
            qf = self.state(q)
            assert qf is not None
            if qf.keys or qf.configured:
                return qf
            return None
        if (q.group, q.name) in self.index.pauses or _has_flow(self.index, q):
            qf = self.state(q)
            assert qf is not None
            return qf if qf.configured else None
        return None

    def select(self, txn: lmdb.Transaction, q: QueueRec, qf: QFlow, max_key: bytes | None,
               want: int, now_ms: int) -> list[bytes]:
        """Keys (``tasks`` keys) of up to `want` tasks a lease may take now, in the order
        it takes them, within every limit; the lease will take them (a task that is
        dead-lettered instead still used its slot: conservative)."""
        if qf.paused:
            return []
        qf.uncool(now_ms)
        allow = want
        if qf.queue_limit is not None:
            allow = min(allow, qf.queue_limit - q.leased)
        if qf.bucket is not None:
            allow = min(allow, int(qf.bucket.level(now_ms)))
        if allow <= 0:
            return []
        if qf.fair:
            out = self._fair(txn, q, qf, max_key, allow, now_ms)
        else:
            out = self._pid_order(txn, q, qf, max_key, allow, now_ms)
        if qf.bucket is not None:
            qf.bucket.tokens -= len(out)
        return out

    def _take(self, qf: QFlow, ks: KeyState, taken: int, now_ms: int) -> bool:
        """May key `ks` give one more task, `taken` already taken by this lease? Takes a
        token of its bucket; out of tokens, it cools down until its next token."""
        if qf.key_limit is not None and ks.leased + taken >= qf.key_limit:
            return False
        if qf.key_rate is not None:
            b = ks.bucket
            if b is None:
                b = ks.bucket = self._bucket(*qf.key_rate)
            if b.level(now_ms) < 1:
                qf.cool_down(ks, b.next_ms(now_ms))
                return False
            b.tokens -= 1
        return True

    def _pid_order(self, txn: lmdb.Transaction, q: QueueRec, qf: QFlow,
                   max_key: bytes | None, allow: int, now_ms: int) -> list[bytes]:
        """Merge the keyless stream and the eligible keys' heads through a heap."""
        prefix = qprefix(q.qid, q.gen)
        out: list[bytes] = []
        heap: list[tuple[bytes, str, Any, bytes]] = []
        plain = txn.cursor(db=self.index.ready)
        if plain.set_range(prefix):
            _push(heap, plain, prefix, "", max_key)
        listed = iter(qf.sorted)
        pending = [next(listed, None)]
        taken: dict[str, int] = {}
        raise_lb: list[tuple[KeyState, bytes]] = []
        while len(out) < allow:
            self._bring(txn, qf, prefix, heap, listed, pending, max_key, raise_lb)
            if not heap:
                break
            pk, key, c, kp = heapq.heappop(heap)
            more = True
            if key:
                ks = qf.keys[key]
                n = taken.get(key, 0)
                if not self._take(qf, ks, n, now_ms):
                    continue
                taken[key] = n + 1
                more = qf.key_limit is None or ks.leased + n + 1 < qf.key_limit
            out.append(prefix + pk)
            if more and c.next():  # the same key's (or the keyless stream's) next task
                _push(heap, c, kp, key, max_key)
        for ks, pk in raise_lb:  # tighten stale bounds (safe: no smaller pid is ready)
            if ks.listed and pk > ks.lb:
                old = ks.lb
                ks.lb = pk
                qf.relist(ks, old)
        return out

    def _bring(self, txn: lmdb.Transaction, qf: QFlow, prefix: bytes,
               heap: list[tuple[bytes, str, Any, bytes]], listed: Iterator[tuple[bytes, str]],
               pending: list[tuple[bytes, str] | None], max_key: bytes | None,
               raise_lb: list[tuple[KeyState, bytes]]) -> None:
        """Bring into the heap every eligible key whose head may come before the best one
        so far (`pending[0]`: the next key in bound order)."""
        while pending[0] is not None and (not heap or pending[0][0] <= heap[0][0]):
            lb, key = pending[0]
            pending[0] = next(listed, None)
            if max_key is not None and lb > max_key:
                pending[0] = None  # sorted: every later bound is larger
                return
            head = self._head(txn, prefix, key, lb)
            if head is not None:
                if head[0] != lb:  # even above max_key: the next lease skips it at once
                    raise_lb.append((qf.keys[key], head[0]))
                if max_key is None or head[0] <= max_key:
                    heapq.heappush(heap, (head[0], key, head[1], head[2]))

    def _head(self, txn: lmdb.Transaction, prefix: bytes, key: str, lb: bytes
              ) -> tuple[bytes, Any, bytes] | None:
        """(pidkey, cursor on it, entry prefix) of `key`'s first ready task at or after
        `lb`, or None."""
        kp = prefix + key_hash(key) + b"\x00"
        c = txn.cursor(db=self.index.keyed)
        if not c.set_range(kp + lb):
            return None
        k = bytes(c.key())
        if not k.startswith(kp):
            return None
        return k[17:], c, kp

    def _fair(self, txn: lmdb.Transaction, q: QueueRec, qf: QFlow, max_key: bytes | None,
              allow: int, now_ms: int) -> list[bytes]:
        """Weighted round-robin over the ring's first keys, in passes until `allow` tasks
        are taken or no key can give more; the keys whose turns ended go to the back."""
        prefix = qprefix(q.qid, q.gen)
        out: list[bytes] = []
        order = list(itertools.islice(iter(qf.ring),
                                      FAIR_VISITS_FACTOR * allow + FAIR_VISITS_MIN))
        cursors: dict[str, list[Any]] = {}
        taken: dict[str, int] = {}
        dry: set[str] = set()  # keys that can give no more in this lease
        used = qf.turn_used
        stop = len(order)  # ring position the next lease starts at
        progress = True
        while len(out) < allow and progress:
            progress = False
            for i, key in enumerate(order):
                if key in dry:
                    continue
                cur = cursors.get(key) or self._cursor(txn, qf, key, prefix)
                cursors[key] = cur
                weight = qf.weights.get(key, 1)
                got = self._turn(qf, cur, prefix, max_key, taken, key,
                                 min(weight - used, allow - len(out)), now_ms, out)
                used += got
                progress = progress or got > 0
                if used < weight and len(out) >= allow:
                    stop = i  # stopped inside its turn: it stays at the front
                    break
                if used < weight:
                    dry.add(key)
                used = 0
                if len(out) >= allow:
                    stop = i + 1
                    break
        qf.turn_used = used if stop < len(order) else 0
        for key in order[:stop]:  # their turns ended: to the back, in turn order
            if key in qf.ring:
                del qf.ring[key]
                qf.ring[key] = None
        return out

    def _turn(self, qf: QFlow, cur: list[Any], prefix: bytes, max_key: bytes | None,
              taken: dict[str, int], key: str, n: int, now_ms: int, out: list[bytes]
              ) -> int:
        """Take up to `n` tasks of one key from its cursor `cur` ([cursor or None, entry
        prefix, KeyState or None]) into `out`; how many."""
        c, kp, ks = cur
        got = 0
        while got < n and c is not None:
            k = c.key()
            if not k.startswith(kp) or (max_key is not None and k[len(kp):] > max_key):
                break
            t = taken.get(key, 0)
            if ks is not None and not self._take(qf, ks, t, now_ms):
                break
            taken[key] = t + 1
            out.append(prefix + bytes(k[len(kp):]))
            got += 1
            if not c.next():
                cur[0] = c = None
        return got

    def _cursor(self, txn: lmdb.Transaction, qf: QFlow, key: str, prefix: bytes
                ) -> list[Any]:
        """[cursor at the first ready task of `key` ("" for the keyless tasks) or None,
        entry prefix, KeyState or None]."""
        if key:
            ks = qf.keys[key]
            kp = prefix + key_hash(key) + b"\x00"
            c = txn.cursor(db=self.index.keyed)
            return [c if c.set_range(kp + ks.lb) else None, kp, ks]
        c = txn.cursor(db=self.index.ready)
        return [c if c.set_range(prefix) else None, prefix, None]

    # -- what cannot be leased now (stats, metrics, wake-ups) -------------------------------
    def held_back(self, q: QueueRec, now_ms: int | None = None) -> tuple[int, int]:
        """(paused, blocked): available tasks of `q` a lease would not take now because
        the queue or their key is paused, or because a limit (concurrency or rate) holds
        them. O(1)."""
        qf = self.queues.get(q.qid)
        if (qf is None or qf.gen != q.gen) and (q.group, q.name) not in self.index.pauses \
                and not _has_flow(self.index, q):
            return 0, 0
        qf = self.state(q)
        assert qf is not None
        if qf.paused:
            return q.available, 0
        now = self.now_ms() if now_ms is None else now_ms
        qf.uncool(now)
        paused = qf.paused_ready
        if (qf.queue_limit is not None and q.leased >= qf.queue_limit) or (
                qf.bucket is not None and qf.bucket.level(now) < 1):
            return paused, q.available - paused
        return paused, qf.held_ready

    def leasable(self, q: QueueRec) -> int:
        paused, blocked = self.held_back(q)
        return max(0, q.available - paused - blocked)

    def due(self, now_ms: int) -> list[QueueRec]:
        """Queues where a key's or the queue's next token came due since the last look
        (their parked leases should look again)."""
        out = []
        for qid in list(self.timed):
            qf = self.queues.get(qid)
            q = self.index.by_qid.get(qid)
            if qf is None or q is None or q.gen != qf.gen:
                self.timed.discard(qid)
                continue
            if qf.version != self.index.conf_version:
                self.state(q)  # configuration changed: still rate-limited?
                if qf.rate is None and qf.key_rate is None and not qf.cool:
                    self.timed.discard(qid)
                    continue
            if not q.available:
                continue
            if qf.uncool(now_ms) or (qf.bucket is not None and qf.bucket.tokens < 1
                                     and qf.bucket.level(now_ms) >= 1):
                out.append(q)
        return out


def _push(heap: list[tuple[bytes, str, Any, bytes]], c: Any, kp: bytes, key: str,
          max_key: bytes | None) -> None:
    """Push the entry cursor `c` is on, if it is one of `kp`'s and <= max_key."""
    k = c.key()
    if k.startswith(kp) and (max_key is None or k[len(kp):] <= max_key):
        heapq.heappush(heap, (bytes(k[len(kp):]), key, c, kp))


def _rate(pol: dict[str, Any], rate: str, burst: str) -> tuple[float, float] | None:
    r = pol.get(rate)
    if not r:
        return None
    return float(r), float(pol.get(burst) or max(1.0, float(r)))


def _has_flow(index: Index, q: QueueRec) -> bool:
    for key in ((q.group, ""), (q.group, q.name)):
        p = index.policies.get(key)
        if p and any(p.get(f) for f in FLOW_FIELDS):
            return True
    return False
