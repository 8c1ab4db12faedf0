"""Process-level durability: a real master under concurrent load, killed with SIGKILL at
random moments, again and again, restarted on the same data directory each time.

Worker threads enqueue (unique pids), lease (short and long leases), dequeue (sometimes
moving the task to a second queue in the same atomic update) and renew, and write down
everything that got a 200. A request that failed in transport (the kill) is ambiguous and
counts neither way. After every restart, and in memory after every cycle, the ledger must
agree with the master (docs/design.md, "Invariants"):

1. every acknowledged enqueue is still there (GET 200), unless some dequeue of it was
   acknowledged or ambiguous;
2. an acknowledged dequeue never comes back: GET 404, and no lease of it with a later
   token is ever granted;
3. no two acknowledged leases of one task overlap: a lease is only granted at or after the
   (acknowledged) expiry of the one before it, judged on the server's own clock
   (grant = expires_at - lease_secs); unexpired long leases survive every restart, and a
   lease probe right after the restart never returns them;
4. at the end, everything that is neither dequeued nor validly leased becomes leasable.

The seed is printed (and taken from SQUALL_CRASH_SEED when set) so a failure replays.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.helpers import ADMIN, MasterProcess, lease_seq, wait_for

# kill -9 cycles: 10 in `make test` (each interval and kill moment is random: more cycles
# add draws, not cases); `make soak` runs 50 (SQUALL_CRASH_KILLS)
KILLS = int(os.environ.get("SQUALL_CRASH_KILLS", "10"))
THREADS = 4
GROUP = "crash"
QA, QB = "stage-a", "stage-b"  # tasks are enqueued into A; some dequeues move them to B
SHORT_LEASE = 1.0  # often expires across a restart, so others re-lease the task
LONG_LEASE = 900.0  # outlives the test: must be honoured across every restart
MAX_TARGET_ACKS = 60  # a cycle is killed after 0..MAX_TARGET_ACKS acknowledged requests
TIMEOUT = httpx.Timeout(10.0, connect=2.0)

Key = tuple[str, str]  # (queue, pid)


def ms(secs: float) -> int:
    return int(secs * 1000)


@dataclass(frozen=True)
class Lease:
    queue: str
    pid: str
    token: str  # as the master answered it (opaque; its fencing number is `seq`)
    expires_ms: int
    lease_ms: int
    who: str

    @property
    def key(self) -> Key:
        return (self.queue, self.pid)

    @property
    def seq(self) -> int:
        return lease_seq(self.token)

    @property
    def grant_ms(self) -> int:
        """When the server granted it, on the server's clock (expiry = now + lease_secs)."""
        return self.expires_ms - self.lease_ms

    @property
    def long(self) -> bool:
        return self.lease_ms >= ms(LONG_LEASE)


@dataclass
class Ledger:
    """What the master acknowledged (200), and what is ambiguous. Shared by all threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    enqueued: dict[Key, int] = field(default_factory=dict)  # acked enqueue -> cycle
    dequeued: dict[Key, int] = field(default_factory=dict)  # acked dequeue -> its seq
    maybe_dequeued: set[Key] = field(default_factory=set)  # acked or ambiguous dequeue
    gone_404: list[Key] = field(default_factory=list)  # dequeues answered "no such task"
    leases: list[Lease] = field(default_factory=list)
    renewed: dict[tuple[Key, str], int] = field(default_factory=dict)  # (key, token) -> exp
    ambiguous_long_leases: int = 0  # long-lease requests without an answer: max tasks held
    errors: list[str] = field(default_factory=list)  # unexpected statuses (never a 5xx)
    acks: int = 0
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def ack(self, what: str) -> None:
        self.acks += 1
        self.counts[what] += 1

    def expiry_ms(self, lease: Lease) -> int:
        """The latest acknowledged expiry of one lease (renewals only ever extend it)."""
        return max(lease.expires_ms, self.renewed.get((lease.key, lease.token), 0))


@dataclass
class Holding:
    lease: Lease
    plan: str  # "ack" (dequeue soon), "move" (dequeue + enqueue into B), "hold", "drop"


class Worker:
    """One load thread's state; it survives restarts (held leases carry over)."""

    def __init__(self, wid: int, ledger: Ledger, seed: int) -> None:
        self.wid, self.ledger = wid, ledger
        self.rng = random.Random(seed)
        self.seq = 0
        self.held: list[Holding] = []

    def new_pid(self, cycle: int) -> str:
        self.seq += 1
        return f"c{cycle:03d}-w{self.wid}-{self.seq:06d}"

    def run(self, url: str, cycle: int, stop: threading.Event) -> None:
        with httpx.Client(base_url=url, timeout=TIMEOUT, headers=ADMIN) as c:
            while not stop.is_set():
                try:
                    self.step(c, cycle)
                except httpx.TransportError:
                    # the master is being killed (or is dead): this request is ambiguous
                    stop.wait(0.02)
                except Exception as e:  # a bad answer: report it, end this thread
                    with self.ledger.lock:
                        self.ledger.errors.append(f"w{self.wid}: {e!r}")
                    return

    # -- one random operation ----------------------------------------------------------
    def step(self, c: httpx.Client, cycle: int) -> None:
        due = [h for h in self.held if h.plan in ("ack", "move")]
        r = self.rng.random()
        if due and r < 0.45:
            self.dequeue(c, cycle, self.rng.sample(due, min(len(due), self.rng.randint(1, 3))))
        elif r < 0.65:
            self.enqueue(c, cycle)
        elif r < 0.95 or not self.held:
            self.lease(c, self.rng.choice((QA, QA, QB)))
        else:
            self.renew(c)

    def enqueue(self, c: httpx.Client, cycle: int) -> None:
        tasks = [{"pid": self.new_pid(cycle)} if self.rng.random() < 0.9 else {}
                 for _ in range(self.rng.randint(1, 5))]
        r = c.post(f"/v1/groups/{GROUP}/queues/{QA}/tasks", json={"tasks": tasks})
        if not self.expect(r, "enqueue", 200):
            return
        res = r.json()["enqueued"]
        with self.ledger.lock:
            for sent, got in zip(tasks, res, strict=True):
                if got["collapsed"] or ("pid" in sent and got["pid"] != sent["pid"]):
                    # unique pids never collapse; nor may a master-assigned (FIFO) pid reuse
                    # one assigned before a crash
                    self.ledger.errors.append(f"enqueue of a new pid answered {got}")
                self.ledger.enqueued[(QA, got["pid"])] = cycle
            self.ledger.ack("enqueue")

    def lease(self, c: httpx.Client, queue: str) -> None:
        long = self.rng.random() < 0.2
        secs = LONG_LEASE if long else SHORT_LEASE
        n = self.rng.randint(1, 6)
        try:
            r = c.post(f"/v1/groups/{GROUP}/queues/{queue}/lease",
                       json={"max_tasks": n, "lease_secs": secs, "worker": f"w{self.wid}"})
        except httpx.TransportError:
            if long:
                with self.ledger.lock:
                    self.ledger.ambiguous_long_leases += n
            raise
        if not self.expect(r, "lease", 200):
            return
        got = [Lease(t["queue"], t["pid"], t["token"], round(t["expires_at"] * 1000), ms(secs),
                     f"w{self.wid}") for t in r.json()["tasks"]]
        with self.ledger.lock:
            self.ledger.leases.extend(got)
            self.ledger.ack("lease")
        for lease in got:
            if long:
                plan = self.rng.choice(("hold", "hold", "ack"))
            else:
                plan = self.rng.choice(("ack", "ack", "move", "drop")) if queue == QA else \
                    self.rng.choice(("ack", "drop"))
            if plan != "drop":  # "drop": a crashed worker; the lease just expires
                self.held.append(Holding(lease, plan))

    def dequeue(self, c: httpx.Client, cycle: int, batch: list[Holding]) -> None:
        for h in batch:
            self.held.remove(h)
        self.dequeue_batch(c, cycle, batch)

    def dequeue_batch(self, c: httpx.Client, cycle: int, batch: list[Holding]) -> None:
        body: dict[str, list[dict[str, Any]]] = {
            "dequeue": [{"queue": h.lease.queue, "pid": h.lease.pid, "token": h.lease.token}
                        for h in batch],
            "enqueue": [{"queue": QB, "pid": self.new_pid(cycle)}
                        for h in batch if h.plan == "move"],
        }
        keys = [h.lease.key for h in batch]
        try:
            r = c.post(f"/v1/groups/{GROUP}/update", json=body)
        except httpx.TransportError:
            with self.ledger.lock:
                self.ledger.maybe_dequeued.update(keys)
            raise
        if r.status_code in (404, 409) and len(batch) > 1:
            # one stale item fails the whole update (all or nothing): retry them one by one
            for h in batch:
                self.dequeue_batch(c, cycle, [h])
            return
        if r.status_code in (404, 409):
            # the lease expired and someone else leased (and maybe dequeued) the task
            with self.ledger.lock:
                if r.status_code == 404:
                    self.ledger.gone_404.append(keys[0])
                if r.status_code == 409 and r.json()["error"]["code"] != "lease_lost":
                    self.ledger.errors.append(f"409 without lease_lost: {r.text}")
            return
        if not self.expect(r, "update", 200):
            return
        with self.ledger.lock:
            for h in batch:
                self.ledger.dequeued[h.lease.key] = h.lease.seq
                self.ledger.maybe_dequeued.add(h.lease.key)
            for e in r.json()["enqueued"]:
                if e["collapsed"]:
                    self.ledger.errors.append(f"a moved task collapsed: {e}")
                self.ledger.enqueued[(QB, e["pid"])] = cycle
            self.ledger.ack("dequeue")

    def renew(self, c: httpx.Client) -> None:
        longs = [h for h in self.held if h.lease.long]
        if not longs:
            return
        h = self.rng.choice(longs)
        item = {"queue": h.lease.queue, "pid": h.lease.pid, "token": h.lease.token,
                "lease_secs": LONG_LEASE}
        r = c.post(f"/v1/groups/{GROUP}/update", json={"renew": [item]})
        if not self.expect(r, "renew", 200):
            return
        [res] = r.json()["renewed"]
        with self.ledger.lock:
            k = (h.lease.key, h.lease.token)
            self.ledger.renewed[k] = max(self.ledger.renewed.get(k, 0),
                                         round(res["expires_at"] * 1000))
            self.ledger.ack("renew")

    def expect(self, r: httpx.Response, what: str, status: int) -> bool:
        if r.status_code == status:
            return True
        with self.ledger.lock:
            self.ledger.errors.append(f"{what}: {r.status_code} {r.text[:300]}")
        return False


# -- the checks ----------------------------------------------------------------------------
def check_ledger(led: Ledger) -> None:
    """Invariants 2 and 3 over every acknowledged lease so far (no I/O)."""
    with led.lock:
        leases = list(led.leases)
        dequeued = dict(led.dequeued)
        gone = list(led.gone_404)
        maybe = set(led.maybe_dequeued)
    seen: dict[str, Lease] = {}
    for x in leases:
        assert x.token not in seen, f"lease token {x.token} was handed out twice: " \
                                    f"{seen[x.token]} and {x}"
        seen[x.token] = x
    by_key: dict[Key, list[Lease]] = defaultdict(list)
    for x in leases:
        by_key[x.key].append(x)
    for key, ls in by_key.items():
        ls.sort(key=lambda x: x.seq)
        for a, b in itertools.pairwise(ls):
            assert b.grant_ms >= led.expiry_ms(a), (
                f"{key}: lease {b.token} by {b.who} granted at {b.grant_ms} while lease "
                f"{a.token} by {a.who} was valid until {led.expiry_ms(a)}")
        if key in dequeued:
            later = [x.token for x in ls if x.seq > dequeued[key]]
            assert not later, f"{key} was leased again ({later}) after its acknowledged " \
                              f"dequeue with token {dequeued[key]}"
    for key in gone:
        # a task can only be gone if some dequeue of it was acknowledged or ambiguous
        assert key in maybe, f"{key} vanished: a dequeue found no task, yet nobody dequeued it"


def live_long_leases(led: Ledger, margin_ms: int = 60_000) -> dict[Key, int]:
    """Tasks under an acknowledged long lease that is valid for at least `margin_ms` more,
    and not (maybe) dequeued: key -> expiry."""
    now = ms(time.time())
    out: dict[Key, int] = {}
    with led.lock:
        for x in led.leases:
            if x.long and x.key not in led.maybe_dequeued:
                exp = led.expiry_ms(x)
                if exp > now + margin_ms:
                    out[x.key] = max(out.get(x.key, 0), exp)
    return out


def list_queue(c: httpx.Client, queue: str) -> dict[Key, dict[str, Any]]:
    """Every task of a queue, from the paged task listing."""
    out: dict[Key, dict[str, Any]] = {}
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": 1000, **({"after": after} if after else {})}
        r = c.get(f"/v1/groups/{GROUP}/queues/{queue}/tasks", params=params)
        if r.status_code == 404:  # the queue has never held a task
            return out
        assert r.status_code == 200, r.text
        page = r.json()
        out.update({(queue, t["pid"]): t for t in page["tasks"]})
        after = page.get("next")
        if not after:
            return out


def check_master(url: str, led: Ledger, rng: random.Random) -> int:
    """After a restart: invariants 1-3 against the master itself, over the whole task
    listing, plus single-task lookups of a sample. Returns how many tasks were checked."""
    with led.lock:
        present = [k for k in led.enqueued if k not in led.maybe_dequeued]
        absent = list(led.dequeued)
    held = live_long_leases(led)
    with httpx.Client(base_url=url, timeout=TIMEOUT, headers=ADMIN) as c:
        listed = {**list_queue(c, QA), **list_queue(c, QB)}
        lost = [k for k in present if k not in listed]
        assert not lost, f"{len(lost)} acknowledged enqueues lost, e.g. {lost[:5]}"
        back = [k for k in absent if k in listed]
        assert not back, f"{len(back)} acknowledged dequeues came back, e.g. {back[:5]}"
        for key, exp in held.items():
            info = listed[key]
            assert info["state"] == "leased", f"{key} lost its long lease: {info}"
            assert round(info["expires_at"] * 1000) >= exp, (key, exp, info)
        # the single-task lookup agrees
        for key in rng.sample(present, min(len(present), 50)) + \
                rng.sample(absent, min(len(absent), 50)):
            r = c.get(f"/v1/groups/{GROUP}/queues/{key[0]}/tasks/{key[1]}")
            assert r.status_code == (404 if key in led.dequeued else 200), (key, r.text)

    # a lease probe right after the restart must not return a validly leased task, nor a
    # dequeued one; it then releases what it got, so the load finds it available again
    with httpx.Client(base_url=url, timeout=TIMEOUT, headers=ADMIN) as c:
        for q in (QA, QB):
            r = c.post(f"/v1/groups/{GROUP}/queues/{q}/lease",
                       json={"max_tasks": 1000, "lease_secs": SHORT_LEASE, "worker": "probe"})
            assert r.status_code == 200, r.text
            got = r.json()["tasks"]
            stolen = [t["pid"] for t in got if (q, t["pid"]) in held]
            assert not stolen, f"leased again while under a valid long lease: {stolen}"
            undead = [t["pid"] for t in got if (q, t["pid"]) in led.dequeued]
            assert not undead, f"leased again after an acknowledged dequeue: {undead}"
            for i in range(0, len(got), 500):
                release = [{"queue": q, "pid": t["pid"], "token": t["token"]}
                           for t in got[i:i + 500]]
                r = c.post(f"/v1/groups/{GROUP}/update", json={"release": release})
                assert r.status_code == 200, r.text
    return len(present) + len(absent)


def drain_check(url: str, led: Ledger) -> None:
    """Invariant 4: every task that is neither dequeued nor validly leased becomes
    leasable, once the short leases run out (waited for, not slept)."""
    with led.lock:
        expected = {k for k in led.enqueued if k not in led.maybe_dequeued}
    held = live_long_leases(led, margin_ms=0)
    expected -= set(held)
    collected: set[Key] = set()
    mystery: dict[Key, dict[str, Any]] = {}
    with httpx.Client(base_url=url, timeout=TIMEOUT, headers=ADMIN) as c:

        def drained() -> bool:
            for q in (QA, QB):
                r = c.post(f"/v1/groups/{GROUP}/queues/{q}/lease",
                           json={"max_tasks": 1000, "lease_secs": LONG_LEASE,
                                 "worker": "drain"})
                assert r.status_code == 200, r.text
                for t in r.json()["tasks"]:
                    key = (t["queue"], t["pid"])
                    assert key not in held, f"{key} leased under a valid long lease"
                    assert key not in led.dequeued, f"{key} leased after its dequeue"
                    collected.add(key)
            missing = expected - collected
            # a long lease whose answer was lost in a kill legitimately hides its tasks
            mystery.clear()
            for key in missing:
                info = c.get(f"/v1/groups/{GROUP}/queues/{key[0]}/tasks/{key[1]}").json()
                if info.get("state") != "leased" or info["expires_at"] < time.time() + 60:
                    return False
                mystery[key] = info
            return True

        try:
            wait_for(drained, timeout=30, interval=0.1, what="every free task to be leasable")
        except TimeoutError:
            missing = sorted(expected - collected - set(mystery))
            infos = {k: c.get(f"/v1/groups/{GROUP}/queues/{k[0]}/tasks/{k[1]}").text
                     for k in missing[:10]}
            raise AssertionError(f"{len(missing)} tasks never became leasable: {infos}") from None
    assert len(mystery) <= led.ambiguous_long_leases, (
        f"{len(mystery)} tasks under long leases nobody acknowledged, more than the "
        f"{led.ambiguous_long_leases} that unanswered long-lease requests could explain")


# -- the test ------------------------------------------------------------------------------
@pytest.fixture
def master(tmp_path) -> Iterator[MasterProcess]:  # type: ignore[no-untyped-def]
    m = MasterProcess(str(tmp_path / "master"))
    try:
        yield m
    finally:
        m.stop()


@pytest.mark.timeout(300 + 10 * KILLS)
def test_kill9_under_load(master: MasterProcess) -> None:
    seed = int(os.environ.get("SQUALL_CRASH_SEED") or random.SystemRandom().randrange(1 << 32))
    print(f"\ntest_kill9_under_load: SQUALL_CRASH_SEED={seed}")
    rng = random.Random(seed)  # the kill schedule
    sample_rng = random.Random(seed + 1)  # what to look up one by one
    led = Ledger()
    workers = [Worker(i, led, rng.randrange(1 << 32)) for i in range(THREADS)]
    checked = 0
    spent: dict[str, float] = defaultdict(float)
    t0 = time.monotonic()
    for cycle in range(KILLS):
        # vary the checkpoint interval so that some kills land in or right after one
        interval = rng.choice(("0.1", "0.5", "30"))
        master.env = {"SQUALL_CHECKPOINT_INTERVAL_S": interval}
        t_phase = time.monotonic()
        master.start()
        spent["restart"] += time.monotonic() - t_phase
        t_phase = time.monotonic()
        if cycle:
            checked += check_master(master.url, led, sample_rng)
            check_ledger(led)
        spent["check"] += time.monotonic() - t_phase
        t_phase = time.monotonic()
        stop = threading.Event()
        threads = [threading.Thread(target=w.run, args=(master.url, cycle, stop),
                                    name=f"load-{w.wid}", daemon=True) for w in workers]
        for t in threads:
            t.start()
        # the random moment: after a random number of acknowledged requests
        # (now and then at once: the kill then lands among the first requests)
        target = led.acks + (0 if rng.random() < 0.15 else rng.randint(1, MAX_TARGET_ACKS))
        try:
            wait_for(lambda target=target, threads=threads: led.acks >= target  # type: ignore
                     or not any(t.is_alive() for t in threads),
                     timeout=60, interval=0.005, what=f"{target} acknowledged requests")
        finally:
            master.kill9()
            stop.set()
            for t in threads:
                t.join(30)
        spent["load"] += time.monotonic() - t_phase
        assert not any(t.is_alive() for t in threads), "a load thread hung"
        assert not led.errors, led.errors[:10]
        check_ledger(led)

    master.env = {}
    master.start()
    checked += check_master(master.url, led, sample_rng)
    check_ledger(led)
    drain_check(master.url, led)
    check_ledger(led)
    assert not led.errors, led.errors[:10]
    with led.lock:
        counts = dict(led.counts)
        stats = (len(led.enqueued), len(led.dequeued), len(led.leases))
    print(f"{KILLS} kills in {time.monotonic() - t0:.1f}s; acknowledged: {counts}; "
          f"{stats[0]} tasks enqueued, {stats[1]} dequeued, {stats[2]} leases; "
          f"{checked} task states checked after restarts; seconds spent: "
          f"{ {k: round(v, 1) for k, v in spent.items()} }")
    with open(master.log_path, errors="replace") as f:
        log = f.read()
    assert "Traceback" not in log, log[log.index("Traceback"):][:3000]
    # the load really happened (not a vacuous pass)
    assert counts.get("enqueue", 0) >= KILLS and counts.get("lease", 0) >= KILLS
    assert counts.get("dequeue", 0) >= 5
