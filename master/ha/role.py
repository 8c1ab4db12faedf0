"""A member's role in a master set: standby, candidate or leader, and the loop that moves
it between them.

- **Standby** (the start): serves only ``/healthz``, ``/readyz``, ``GET /v1/leader`` and
  the journal calls (every other route answers 503 naming the leader). Its journal takes
  the leader's groups; each time the committed ticket advances the records up to it are
  applied to the member's own index (warm: a promotion replays only what was in flight).
- **Candidate**: every ``lease_secs / 3`` the loop asks the elector; once it holds the
  lease the member recovers the log (:meth:`QuorumLog.recover`: a new unique epoch, the
  unfinished tail, the epoch-start record on a majority), applies what its index lacks
  and starts serving.
- **Leader**: its group commit writes through :class:`MasterSet` (the one seam,
  ``append_group``; decision 0024). It holds the elector's lease until ``t0 + lease_secs *
  (1 - SKEW)`` by its monotonic clock, ``t0`` taken before the renewal call; past that,
  or once its log was fenced or lost its majority, it refuses writes and steps down.

The epoch-start record raises the lease-token sequence to ``epoch << 40``: every lease
token names its epoch in its fencing number, and a deposed leader's tokens (numbers of an
older epoch, never committed) open to nothing the new leader holds.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgpack

from squall.common.server.metrics import Hist
from squall.common.transport.aio import Pool
from squall.master.ha.elector import Elector, make_elector
from squall.master.ha.journal import FileMeta, Journal, Record, Refused
from squall.master.ha.members import (
    HttpJournalClient,
    decode_args,
    members_in_index,
    members_op,
)
from squall.master.ha.quorum import (
    Fenced,
    JournalClient,
    LocalClient,
    QuorumLog,
    QuorumLost,
    written_inline,
)
from squall.master.storage.ops import replay
from squall.master.storage.wal import WAL

if TYPE_CHECKING:
    from squall.master.service import Master

log = logging.getLogger("squall.master.ha")
SKEW = 0.2  # the share of the lease a leader gives up for clock-rate differences
EPOCH_SHIFT = 40  # lease-token numbers of epoch e start at e << EPOCH_SHIFT
JOURNAL_METHODS = frozenset({"state", "format", "new_epoch", "append", "sync", "read"})
APPLY_CHUNK = 5000
APPLY_DELAY_S = 0.02  # a standby applies committed records at most this often


@dataclass
class SetSettings:
    me: str  # this member's advertised base URL
    members: list[str]  # the set at bootstrap (later: what the log says)
    elector: str = ""  # elector spec; "" = static:<first member>
    journal_timeout_s: float = 3.0
    lease_secs: float | None = None  # else the elector's
    # the WAL a leader keeps for lagging members, at most (then they need a volume copy)
    max_wal_kept_bytes: int = 4 << 30


class WalLog:
    """A journal's records: the member's own WAL, with the records written lately kept in
    memory too (a standby applies them, a leader catches journals up from them; reading
    them back from the segment files would read the whole segment each time)."""

    CACHE_BYTES = 64 << 20

    def __init__(self, wal: WAL) -> None:
        self.wal = wal
        self._recent: deque[Record] = deque()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def last_ticket(self) -> int:
        return self.wal.last_ticket

    @property
    def floor(self) -> int:
        return self.wal.floor

    def write(self, records: list[Record]) -> None:
        self.wal.write_group(records)
        with self._lock:
            self._recent.extend(records)
            self._bytes += sum(len(b) for _, b in records)
            while self._bytes > self.CACHE_BYTES and len(self._recent) > 1:
                self._bytes -= len(self._recent.popleft()[1])

    def read_after(self, after: int, max_records: int, max_bytes: int) -> list[Record]:
        with self._lock:
            if self._recent and self._recent[0][0] <= after + 1:
                out: list[Record] = []
                size = 0
                i = bisect.bisect_right(self._recent, after, key=lambda r: r[0])
                for r in itertools.islice(self._recent, i, None):
                    if len(out) >= max_records or (out and size + len(r[1]) > max_bytes):
                        break
                    out.append(r)
                    size += len(r[1])
                return out
        return self.wal.read_after(after, max_records, max_bytes)

    def truncate_after(self, ticket: int) -> None:
        self.wal.truncate_after(ticket)
        with self._lock:
            while self._recent and self._recent[-1][0] > ticket:
                self._bytes -= len(self._recent.pop()[1])


def epoch_start(epoch: int) -> bytes:
    """The first record of an epoch: lease-token numbers move into the epoch's range."""
    return msgpack.packb([("M", epoch << EPOCH_SHIFT, 0)])


@dataclass
class Counters:
    failovers: int = 0  # times this member became leader
    step_downs: int = 0
    refused_groups: int = 0
    reasons: list[str] = field(default_factory=list)


class MasterSet:
    """This member's part in the set; the group commit's log while it leads."""

    def __init__(self, master: Master, settings: SetSettings, key: bytes) -> None:
        self.master, self.settings, self.key = master, settings, key
        self.me = settings.me
        self.members = members_in_index(master.index) or list(settings.members)
        if self.me not in self.members:
            log.warning("%s is not in the set %s: it stays a standby until added",
                        self.me, self.members)
        self.journal = Journal(self.me, WalLog(master.wal),
                               FileMeta(os.path.join(master.settings.data_dir,
                                                     "journal.json")),
                               on_committed=self._on_committed)
        self.elector: Elector = make_elector(settings.elector or f"static:{self.members[0]}")
        if settings.lease_secs:
            self.elector.lease_secs = settings.lease_secs
        self.lease_secs = self.elector.lease_secs
        self.pool = Pool(idle_s=30.0)
        self.role = "standby"
        self._elected: str | None = None  # who the elector names (a hint)
        self.ql: QuorumLog | None = None
        self.lease_until = 0.0
        self.counters = Counters()
        self.append_hist, self.quorum_hist = Hist(), Hist()  # metrics (seconds)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._checkpoints: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closed = False
        self._stepping_down = False
        self._hold_until = 0.0  # after a step-down: do not try to lead before this
        self._given_up: list[str] = []  # lagging members the WAL is no longer kept for
        self.last_group_at = 0.0
        self._apply_lock = threading.Lock()
        self._apply_target = 0
        self._apply_scheduled = False
        master.commit.wal = self  # type: ignore[assignment]  # the seam (decision 0024)

    # -- the group commit's log (GroupCommit.wal) ----------------------------------------
    @property
    def last_ticket(self) -> int:
        ql = self.ql
        return ql.last if (ql is not None and self.role == "leader") else \
            self.master.wal.last_ticket

    def failure(self) -> str | None:
        """Why writes are refused now, or None (leader, lease held, log healthy)."""
        if self.role != "leader" or self.ql is None:
            return self.standby_reason()
        if self.ql.failed is not None:
            return f"this master stepped down: {self.ql.failed}"
        if time.monotonic() > self.lease_until:
            return "this master's leadership lease ran out: it is stepping down"
        return self.master.wal.failure()

    @property
    def leader(self) -> str | None:
        """The leader as this member knows it: the writer of its journal's current epoch
        (authoritative), else the elector's holder (a hint)."""
        if self.role == "leader":
            return self.me
        w = self.journal.writer
        if w is not None and w != self.me:
            return w
        return self._elected if self._elected != self.me else None

    def serving(self) -> bool:
        """Leads, holds its lease and its log is not failed: may answer anything. A leader
        paused past its lease answers nothing (reads, heartbeats) until it stepped down."""
        ql = self.ql
        return (self.role == "leader" and ql is not None and ql.failed is None
                and time.monotonic() <= self.lease_until)

    async def confirm(self) -> int:
        """This member still leads at its epoch: an empty append taken by a majority of
        journals (they refuse a lower epoch). Returns the epoch; QuorumLost or Fenced
        otherwise (and the member steps down). Called before a heartbeat answer hands out
        delete commands, so a deposed leader's stale view deletes nothing."""
        ql = self.ql
        if ql is None or not self.serving():
            raise QuorumLost(self.failure() or "not the leader")
        try:
            await ql.append([])
        except QuorumLost:
            self._poke()
            raise
        return ql.epoch

    def standby_reason(self) -> str:
        return (f"standby of {self.leader or 'an unknown leader'} "
                f"(lag {self.lag()} records)")

    async def append_group(self, records: list[tuple[int, bytes]]) -> None:
        """The group commit's log (on the loop): durable on a majority, or QuorumLost /
        Fenced (a quorum append that cannot finish in time fails the log: step down)."""
        why = self.failure()
        ql = self.ql
        if why is not None or ql is None:
            self.counters.refused_groups += 1
            raise QuorumLost(why or "not the leader")
        try:
            async with asyncio.timeout(self.settings.journal_timeout_s * 2 + 1):
                await ql.append(records)
        except TimeoutError:
            ql.failed = ql.failed or "the quorum append did not finish in time"
            self._poke()
            raise QuorumLost(ql.failed) from None
        except QuorumLost:
            self.counters.refused_groups += 1
            self._poke()
            raise
        self.last_group_at = time.monotonic()

    def _poke(self) -> None:
        loop = self.loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._wake.set)

    # -- the standby's side --------------------------------------------------------------
    def lag(self) -> int:
        return max(0, self.journal.committed - self.master.index.applied) + \
            max(0, self.journal.log.last_ticket - self.journal.committed)

    def _on_committed(self, committed: int) -> None:
        """A journal call advanced the committed ticket (a worker thread): apply up to it
        soon, at most one index commit per APPLY_DELAY_S (each one fsyncs the index)."""
        if self.role == "leader" or self._closed:
            return
        with self._apply_lock:
            self._apply_target = max(self._apply_target, committed)
            if self._apply_scheduled:
                return
            self._apply_scheduled = True
        loop = self.loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.call_later, APPLY_DELAY_S, self._submit_apply)

    def _submit_apply(self) -> None:
        with self._apply_lock:
            self._apply_scheduled = False
            target = self._apply_target
        if self.role == "leader" or self._closed:
            return
        with contextlib.suppress(RuntimeError):
            self.master.commit._thread.submit(self._apply, target)

    def _apply(self, upto: int) -> int:
        """On the commit thread: apply the log's records up to `upto` to the index."""
        m = self.master
        commit = m.commit
        txn, commit._spare = commit._spare, None
        if txn is not None:
            txn.abort()
        n = 0
        while m.index.applied < upto:
            recs = self.journal.log.read_after(m.index.applied, APPLY_CHUNK, 64 << 20)
            recs = [r for r in recs if r[0] <= upto]
            if not recs:
                break
            with m.index.begin_write() as txn:
                replay(m.index, txn, [(t, msgpack.unpackb(b)) for t, b in recs])
            m.index.freed_pending.clear()
            n += len(recs)
        commit.committed_ticket = max(commit.committed_ticket, m.index.applied)
        members = members_in_index(m.index)
        if members is not None and members != self.members:
            self.members = members
            if self.ql is not None:
                self.ql.set_members(members, self._clients(members))
        return n

    def droppable(self) -> int:
        """The highest ticket a checkpoint may drop from this member's WAL: what the index
        holds, and (on the leader) what every formatted member's journal already has, so
        a lagging member is caught up from the log (an unformatted one is not waited for:
        re-adding it after that needs a copy of a standby's volume)."""
        applied = upto = self.master.index.applied
        ql = self.ql
        if ql is not None and self.role == "leader":
            lagging = []
            for m in ql.members:
                if m != self.me and not ql.status.get(m, "").startswith(("unformatted",
                                                                          "foreign")):
                    if ql.match.get(m, 0) < applied:
                        lagging.append(m)
                    upto = min(upto, ql.match.get(m, 0))
            if upto < applied and self.master.wal.disk_bytes() > self.settings.max_wal_kept_bytes:
                if lagging != self._given_up:
                    log.warning("the WAL kept for lagging member(s) %s passed %d MiB: it is "
                                "no longer kept; they need a copy of a standby's volume if "
                                "they lack the records dropped now", lagging,
                                self.settings.max_wal_kept_bytes >> 20)
                self._given_up = lagging
                return applied
            self._given_up = []
        return upto

    async def _standby_checkpoints(self) -> None:
        """A standby's checkpoint: sync the index, drop the WAL segments it covers."""
        s = self.master.settings
        while not self._closed:
            await asyncio.sleep(s.checkpoint_interval_s)
            if self.role == "leader":
                continue
            try:
                self.master.wal.request_roll()
                await asyncio.to_thread(self.master._checkpoint_through,
                                        self.master.index.applied)
            except Exception:
                log.exception("standby checkpoint failed")

    # -- journal calls from other members ------------------------------------------------
    async def rpc(self, method: str, args: dict[str, Any]) -> Any:
        if method not in JOURNAL_METHODS:
            raise KeyError(method)
        fn = getattr(self.journal, method)
        args = decode_args(method, args)
        if method == "append" and self.role != "leader" and written_inline(args.get("records", [])):
            # a standby's loop serves little else: a small group is written and synced
            # right here (two thread hops fewer on every group's round trip)
            return fn(**args)
        return await asyncio.to_thread(fn, **args)

    def _clients(self, members: list[str]) -> dict[str, JournalClient]:
        out: dict[str, JournalClient] = {}
        for m in members:
            if m == self.me:
                out[m] = LocalClient(self.journal)
            else:
                out[m] = HttpJournalClient(m, self.me, self.key, self.pool,
                                           self.settings.journal_timeout_s)
        return out

    # -- the role loop -------------------------------------------------------------------
    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(self._run(), name="master-set")
        self._checkpoints = asyncio.create_task(self._standby_checkpoints(),
                                                name="standby-checkpoints")

    async def _run(self) -> None:
        while not self._closed:
            period = self.lease_secs / 3
            try:
                await self._round()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("master set: role round failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), period)

    async def _round(self) -> None:
        t0 = time.monotonic()
        may_lead = self.me in self.members and t0 >= self._hold_until
        held = False
        if self.role == "leader" or may_lead:
            try:
                held = await asyncio.wait_for(self.elector.try_acquire(self.me),
                                              self.lease_secs / 3)
            except (TimeoutError, OSError):
                held = False
        if held:
            self.lease_until = t0 + self.lease_secs * (1 - SKEW)
        if self.role == "leader":
            ql = self.ql
            assert ql is not None
            if ql.failed is not None:
                await self.step_down(ql.failed)
            elif time.monotonic() > self.lease_until:
                await self.step_down("the leadership lease ran out")
            elif time.monotonic() - self.last_group_at > self.lease_secs / 3:
                try:  # a heartbeat: carries the committed ticket to the standbys
                    await ql.append([])
                except QuorumLost as e:
                    await self.step_down(str(e))
            return
        if held:
            await self._try_lead()
        else:
            with contextlib.suppress(Exception):
                self._elected = await asyncio.wait_for(self.elector.holder(),
                                                       self.lease_secs / 3)

    async def _try_lead(self) -> None:
        self.role = "candidate"
        ql = QuorumLog(self.me, self._clients(self.members), self.members,
                       timeout=self.settings.journal_timeout_s)
        ql.on_append, ql.on_quorum_wait = self.append_hist.observe, self.quorum_hist.observe
        members = list(self.members)
        try:
            epoch = await ql.recover(
                epoch_start, bootstrap=lambda: [(0, msgpack.packb([members_op(members)]))])
            loop = asyncio.get_running_loop()
            self.ql = ql
            await loop.run_in_executor(self.master.commit._thread, self._apply, ql.last)
        except (QuorumLost, Refused) as e:
            log.warning("could not lead: %s", e)
            self.counters.reasons = [*self.counters.reasons[-9:], str(e)]
            self.role, self.ql = "standby", None
            await ql.close()
            await self.elector.release(self.me)
            self._hold_until = time.monotonic() + self.lease_secs / 3
            return
        if time.monotonic() > self.lease_until - self.lease_secs / 3:  # renew it first
            t0 = time.monotonic()
            with contextlib.suppress(TimeoutError, OSError):
                if await asyncio.wait_for(self.elector.try_acquire(self.me),
                                          self.lease_secs / 3):
                    self.lease_until = t0 + self.lease_secs * (1 - SKEW)
        if time.monotonic() > self.lease_until:
            log.warning("recovered epoch %d after the lease ran out: standing down", epoch)
            self.role, self.ql = "standby", None
            await ql.close()
            return
        self.role = "leader"
        self.last_group_at = time.monotonic()
        self.counters.failovers += 1
        self.master.start()
        log.info("leading the master set in epoch %d at ticket %d (members %s)", epoch,
                 ql.last, self.members)

    async def step_down(self, reason: str) -> None:
        """Stop writing (maintenance, a fenced or lost log, a lease run out); become a
        standby. Requests in flight are refused; the set elects another leader."""
        if self.role != "leader" or self._stepping_down:
            return
        self._stepping_down = True
        try:
            log.warning("stepping down: %s", reason)
            ql = self.ql
            if ql is not None and ql.failed is None:
                ql.failed = f"stepped down: {reason}"
            self.role = "standby"
            self._elected = None
            self.counters.step_downs += 1
            for t in self.master._tasks:
                t.cancel()
            for t in self.master._tasks:
                with contextlib.suppress(BaseException):
                    await t
            self.master._tasks = []
            with contextlib.suppress(Exception):
                await self.master.commit.settled()
            if ql is not None:
                await ql.close()
            self.ql = None
            await self.elector.release(self.me)
            self._hold_until = time.monotonic() + self.lease_secs
        finally:
            self._stepping_down = False

    async def close(self) -> None:
        self._closed = True
        for task in (self._task, self._checkpoints):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if self.ql is not None:
            await self.ql.close()
        if self.role == "leader":
            await self.elector.release(self.me)
        await self.elector.close()
        self.pool.close()

    # -- membership (an operator's commands) ---------------------------------------------
    async def _log_members(self, members: list[str]) -> None:
        from squall.master.storage.ops import apply

        def work(txn: Any, ticket: int) -> tuple[bytes, None]:
            return apply(self.master.index, txn, [members_op(members)], ticket), None

        await self.master.commit.run(work)

    async def add_member(self, url: str) -> dict[str, Any]:
        """Format a new (or wiped) member's journal, catch it up, then log the new set."""
        from squall.master.ha.members import parse_members

        (url,) = parse_members(url) or [""]
        ql = self.ql
        if ql is None:
            raise ValueError("not the leader")
        if url in self.members:
            if ql.status.get(url, "").startswith("unformatted"):
                await ql.format_member(url)  # a wiped member comes back: re-add it
                ql._catch_up_later(url)
                return {"members": self.members, "re-added": url}
            raise ValueError(f"{url} is already a member")
        old = list(self.members)
        try:
            await ql.format_member(url)
        except Exception as e:
            raise ValueError(f"could not format {url}'s journal: {e}") from e
        new = [*old, url]
        ql.set_members(new, self._clients(new))
        deadline = time.monotonic() + 120
        while url not in ql.in_sync and time.monotonic() < deadline and ql.failed is None:
            await asyncio.sleep(0.1)
        if url not in ql.in_sync:
            ql.set_members(old, {})
            raise ValueError(f"{url} did not catch up: {ql.status.get(url)}")
        await self._log_members(new)
        self.members = new
        return {"members": new, "added": url}

    async def remove_member(self, url: str) -> dict[str, Any]:
        ql = self.ql
        if ql is None:
            raise ValueError("not the leader")
        if url not in self.members:
            raise ValueError(f"{url} is not a member")
        if url == self.me:
            raise ValueError("the leader cannot remove itself: step down first")
        if len(self.members) <= 1:
            raise ValueError("the last member cannot be removed")
        new = [m for m in self.members if m != url]
        await self._log_members(new)
        ql.set_members(new, self._clients(new))
        self.members = new
        return {"members": new, "removed": url}

    # -- views ---------------------------------------------------------------------------
    def epoch(self) -> int:
        return self.ql.epoch if self.ql is not None else self.journal.promised

    def leader_view(self) -> dict[str, Any]:
        return {"leader": self.me if self.role == "leader" else self.leader,
                "epoch": self.ql.epoch if self.ql is not None else self.journal.promised,
                "me": self.me, "role": self.role, "elector": self.elector.kind}

    def view(self) -> dict[str, Any]:
        out = {**self.leader_view(), "members": self.members,
               "lease_secs": self.lease_secs, "failovers": self.counters.failovers,
               "step_downs": self.counters.step_downs,
               "journal": self.journal.state()}
        if self.ql is not None and self.role == "leader":
            out["log"] = self.ql.view()
        else:
            out["lag"] = self.lag()
        return out

    def ready(self) -> str | None:
        return self.failure()


__all__ = ["Fenced", "MasterSet", "SetSettings"]
