"""The leader's side of the quorum log: a new unique epoch, recovery of the unfinished
tail, and every WAL group appended to all journals in parallel, durable once a majority
(this member included) has fsynced it.

The protocol is HDFS's QuorumJournalManager, reduced to one growing log:

1. **A new unique epoch** (``createNewUniqueEpoch``): read every journal's state, take
   the highest promised epoch + 1 and have a majority promise it (a journal promises only
   an epoch above every one it promised before, so two candidates never hold the same).
2. **Recovery**: among the journals that promised, the one with the highest (accepted
   epoch, last ticket) holds every group that was ever acknowledged (acknowledged = on a
   majority of journals with that accepted epoch; any majority meets it). This member's
   log is made equal to it, then every journal that promised is brought level
   (``Journal.sync``: equal records are kept, differing ones cut), a majority at least.
3. **Epoch start**: the first group of the epoch is the caller's epoch-start record,
   appended like any group. Only then does the member serve.
4. **Appends**: a group goes to every in-sync journal at once (one ordered sender per
   journal) and returns once a majority including this member has it durable. A journal
   that failed, lagged or answered out of sync is caught up in the background from this
   member's log, chunk by chunk, and counts again once level.

No majority in time raises :class:`QuorumLost` (the group may still surface on the next
leader: the outcome is unknown to the caller), a journal that promised a higher epoch
raises :class:`Fenced`; after either the log refuses every append and the member steps
down (a new leadership recovers with a new epoch). Both are :class:`WALFailed`, so the
group commit refuses the batch exactly as when the local disk fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any, Protocol

from squall.master.ha.journal import Journal, Record, Refused
from squall.master.storage.wal import WALFailed

log = logging.getLogger("squall.master.ha")
CHUNK_RECORDS = 2000
CHUNK_BYTES = 4 << 20
GRACE_S = 0.25  # how long recovery waits for the rest once a majority answered
INLINE_APPEND_BYTES = 1 << 20  # an append up to this size is written on the event loop
MAX_QUEUED = 64  # groups queued to one slow journal before it is caught up instead


def written_inline(records: list[Record]) -> bool:
    """Whether a journal append of `records` is written on the event loop (a group of up
    to INLINE_APPEND_BYTES: its write and fdatasync cost less than two thread hops)."""
    return sum(len(b) for _, b in records) <= INLINE_APPEND_BYTES


class QuorumLost(WALFailed):
    """No majority of journals acknowledged in time."""


class Fenced(QuorumLost):
    """A journal promised a higher epoch: another member leads (or tries to)."""


class Unreachable(Exception):
    """A journal call failed in transport (timeout, connection refused, 5xx)."""


class JournalClient(Protocol):
    url: str

    async def call(self, method: str, args: dict[str, Any]) -> Any:
        """Call `method` of the member's journal; raises Refused or Unreachable."""
        ...


class LocalClient:
    """This member's own journal, called on a worker thread (its WAL write blocks), but
    an append of up to INLINE_APPEND_BYTES on the loop: the leader issues it after the
    other journals' appends are on the wire, and a thread would only add two hops (and a
    runnable thread more on a busy machine) to every group's wait."""

    def __init__(self, journal: Journal, threaded: bool = True) -> None:
        self.url, self.journal, self.threaded = journal.member, journal, threaded

    async def call(self, method: str, args: dict[str, Any]) -> Any:
        fn = getattr(self.journal, method)
        if not self.threaded or (method == "append" and written_inline(args["records"])):
            return fn(**args)
        return await asyncio.to_thread(fn, **args)


class QuorumLog:
    """One leadership's log (build a new one for every attempt to lead)."""

    def __init__(self, me: str, clients: dict[str, JournalClient], members: list[str],
                 *, timeout: float = 5.0, chunk_records: int = CHUNK_RECORDS,
                 chunk_bytes: int = CHUNK_BYTES, background: bool = True) -> None:
        if me not in members:
            raise ValueError(f"{me} is not a member of {members}")
        self.me, self.clients, self.members = me, clients, list(members)
        self.timeout, self.chunk_records, self.chunk_bytes = timeout, chunk_records, chunk_bytes
        self.cluster: str | None = None
        self.epoch = 0
        self.last = 0  # this member's last ticket (== the log's end while it leads)
        self.committed = 0  # durable on a majority
        self.in_sync: set[str] = set()
        self.match: dict[str, int] = {}  # a journal's last ticket, as last heard
        # a journal's incarnation (made by its format) as promised or read: passed with
        # every call, so a journal wiped and re-formatted since refuses them
        self.incarnation: dict[str, str] = {}
        self.failed: str | None = None  # why appends are refused (then step down)
        self.fenced = False
        self._gate = asyncio.Lock()  # one append (or a catch-up's last step) at a time
        self._peer: dict[str, asyncio.Lock] = {m: asyncio.Lock() for m in members}
        self._queued: dict[str, int] = {m: 0 for m in members}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._catching: dict[str, asyncio.Task[None]] = {}
        self.closed = False
        # False: lagging journals are caught up only by calls to catch_up_step (the model
        # test drives them, so no timer decides how far a catch-up got)
        self.background = background
        # metrics
        # metrics hooks: one journal's append (secs), a group's wait for its majority
        self.on_append: Callable[[float], None] | None = None
        self.on_quorum_wait: Callable[[float], None] | None = None
        self.groups = 0
        self.status: dict[str, str] = {}  # member -> "in sync" / why not

    @property
    def majority(self) -> int:
        return len(self.members) // 2 + 1

    # -- calls -----------------------------------------------------------------------------
    async def _call(self, m: str, method: str, **args: Any) -> Any:
        client = self.clients.get(m)
        if client is None:
            raise Unreachable(f"no client for {m}")
        try:
            async with asyncio.timeout(self.timeout):  # no task of its own, as wait_for
                return await client.call(method, args)
        except (Refused, Unreachable):
            raise
        except (TimeoutError, OSError) as e:
            raise Unreachable(f"{m}: {method} failed ({type(e).__name__}: {e})") from e

    async def _gather(self, members: list[str], method: str, **args: Any
                      ) -> dict[str, Any]:
        """Call `method` on each member: member -> answer or the exception. Returns once
        all answered, or a short grace after a majority answered (a stopped member must
        not hold a recovery up for a whole timeout)."""
        tasks = {asyncio.ensure_future(self._call(m, method, **args)): m for m in members}
        out: dict[str, Any] = {}
        pending = set(tasks)
        grace_until: float | None = None
        try:
            while pending:
                left = None if grace_until is None else grace_until - time.monotonic()
                if left is not None and left <= 0:
                    break
                done, pending = await asyncio.wait(pending, timeout=left,
                                                   return_when=asyncio.FIRST_COMPLETED)
                for t in done:
                    exc = t.exception()
                    out[tasks[t]] = exc if exc is not None else t.result()
                answered = sum(1 for v in out.values() if isinstance(v, dict))
                if grace_until is None and answered >= self.majority:
                    grace_until = time.monotonic() + GRACE_S
        finally:
            for t in pending:
                t.cancel()
                out[tasks[t]] = Unreachable(f"{tasks[t]}: no answer to {method} while a "
                                            "majority did")
        for o in out.values():
            if isinstance(o, BaseException) and not isinstance(o, Exception):
                raise o
        # in the members' order, not the order tasks finished in (a set of tasks iterates
        # by their ids): what follows calls the journals in this order
        return {m: out[m] for m in members}

    # -- leadership ------------------------------------------------------------------------
    async def recover(self, epoch_start: Callable[[int], bytes],
                      bootstrap: Callable[[], list[Record]] | None = None) -> int:
        """Become the writer: a new unique epoch promised by a majority, the unfinished
        tail recovered and levelled on a majority, the epoch-start record durable on a
        majority. Returns the epoch. Raises QuorumLost/Fenced (try again later).
        `bootstrap`: when every member answers unformatted, format them all into a new
        cluster and append these records after the epoch start (the initial membership)."""
        try:
            return await self._recover(epoch_start, bootstrap)
        except Refused as e:
            if e.kind == "fenced":
                raise Fenced(f"recovery of epoch {self.epoch} fenced: {e}") from e
            raise QuorumLost(f"recovery of epoch {self.epoch} failed: {e}") from e
        except Unreachable as e:
            raise QuorumLost(f"recovery of epoch {self.epoch} failed: {e}") from e

    async def _recover(self, epoch_start: Callable[[int], bytes],
                       bootstrap: Callable[[], list[Record]] | None) -> int:
        ok, boot = await self._formatted(bootstrap)
        promised = await self._promise(ok)
        epoch = self.epoch
        src = max(promised, key=lambda m: (promised[m]["accepted"], promised[m]["last"],
                                           m == self.me))
        log.info("epoch %d: promised by %s; recovering from %s (accepted %d, last %d)",
                 epoch, sorted(promised), src, promised[src]["accepted"], promised[src]["last"])
        if src != self.me:
            await self._copy(src, promised[self.me], promised[src])
        me = await self._call(self.me, "state")
        self.last = me["last"]
        self.committed = max(int(a["committed"]) for a in promised.values())
        self.committed = min(self.committed, self.last)
        if src == self.me:  # make this log a prefix of itself in this epoch (accepted)
            await self._call(self.me, "sync", cluster=self.cluster, epoch=epoch,
                             base=self.last, records=[], committed=self.committed, final=True,
                             **self._inc(self.me))
        self.in_sync = {self.me}
        self.match[self.me] = self.last
        others = [m for m in promised if m != self.me]
        results = await asyncio.gather(*(self._level(m, promised[m]) for m in others),
                                       return_exceptions=True)
        for m, r in zip(others, results, strict=True):
            if r is True:
                self.in_sync.add(m)
            else:
                self.status[m] = f"recovery sync failed: {r}"
        if len(self.in_sync) < self.majority:
            raise QuorumLost(f"levelled {len(self.in_sync)} journals after recovery; a "
                             f"majority is {self.majority}")
        await self.append([(self.last + 1, epoch_start(epoch)), *_after(boot, self.last + 1)])
        for m in self.members:
            if m not in self.in_sync:
                self._catch_up_later(m)
        return epoch

    async def _formatted(self, bootstrap: Callable[[], list[Record]] | None
                         ) -> tuple[dict[str, Any], list[Record]]:
        """The states of the journals formatted into this cluster (a majority), after a
        bootstrap when every member was unformatted; and the bootstrap's records."""
        states = await self._gather(self.members, "state")
        mine = states[self.me]
        if isinstance(mine, BaseException):
            raise QuorumLost(f"this member's own journal failed: {mine}")
        boot: list[Record] = []
        if not mine["formatted"]:
            if any(isinstance(s, dict) and s["formatted"] for s in states.values()):
                raise QuorumLost("this member's journal is unformatted (new or wiped disk) "
                                 "and other members are formatted: it cannot lead until an "
                                 "operator re-adds it (squall master members add)")
            if not all(isinstance(s, dict) for s in states.values()):
                raise QuorumLost("a new master set is formed once every member answers "
                                 "(all are unformatted)")
            await self._bootstrap(states)
            if bootstrap is not None:
                boot = bootstrap()
            states = await self._gather(self.members, "state")
            if not isinstance(states[self.me], dict):
                raise QuorumLost(f"this member's own journal failed: {states[self.me]}")
        self.cluster = states[self.me]["cluster"]
        if states[self.me].get("joining") is not None:
            raise QuorumLost("this member's journal was re-added and is not caught up yet: "
                             "it cannot lead until a leader has caught it up")
        # a joining journal (re-added, not caught up) promises nothing: it does not count
        ok = {m: s for m, s in states.items()
              if isinstance(s, dict) and s["formatted"] and s["cluster"] == self.cluster
              and s.get("joining") is None}
        for m, s in states.items():
            if m not in ok:
                self.status[m] = _why(s, self.cluster)
        if len(ok) < self.majority:
            raise QuorumLost(f"only {len(ok)} of {len(self.members)} journals answered "
                             f"formatted and caught up; a majority is {self.majority}")
        return ok, boot

    async def _promise(self, ok: dict[str, Any]) -> dict[str, Any]:
        """createNewUniqueEpoch: max promised + 1, promised by a majority incl. this one."""
        epoch = max(int(s["promised"]) for s in ok.values()) + 1
        answers = await self._gather(list(ok), "new_epoch", cluster=self.cluster, epoch=epoch)
        promised = {m: a for m, a in answers.items() if isinstance(a, dict)}
        fenced = [a for a in answers.values() if isinstance(a, Refused) and a.kind == "fenced"]
        if len(promised) < self.majority or self.me not in promised:
            why = (f"epoch {epoch} was promised by {len(promised)} journals "
                   f"({', '.join(sorted(promised)) or 'none'}); a majority is {self.majority}")
            raise Fenced(why) if fenced else QuorumLost(why)
        self.epoch = epoch
        for m, a in promised.items():
            self.incarnation[m] = a.get("incarnation") or ""
        return promised

    def _inc(self, m: str) -> dict[str, str]:
        """The `incarnation` argument for a call to `m` (none for a journal formatted
        before incarnations existed: such a member may run a version without them)."""
        inc = self.incarnation.get(m, "")
        return {"incarnation": inc} if inc else {}

    async def _bootstrap(self, states: dict[str, Any]) -> None:
        cluster = uuid.uuid4().hex
        log.info("bootstrapping a new master set %s: %s", cluster, self.members)
        answers = await self._gather(self.members, "format", cluster=cluster, epoch=0)
        bad = {m: a for m, a in answers.items() if not isinstance(a, dict)}
        if bad:
            raise QuorumLost(f"could not format every member: {bad}")

    async def _copy(self, src: str, mine: dict[str, Any], theirs: dict[str, Any]) -> None:
        """Make this member's log equal `src`'s (recovery)."""
        cur = _base(mine)
        if cur < int(theirs["floor"]):
            raise QuorumLost(f"{src} no longer holds the records after ticket {cur} that "
                             "this member lacks: restore this member from a snapshot of a "
                             "standby's volume")
        while True:
            recs = await self._call(src, "read", after=cur, max_records=self.chunk_records,
                                    max_bytes=self.chunk_bytes, **self._inc(src))
            recs = [(int(t), bytes(b)) for t, b in recs]
            final = not recs
            await self._call(self.me, "sync", cluster=self.cluster, epoch=self.epoch,
                             base=cur, records=recs, committed=0, final=final,
                             **self._inc(self.me))
            if final:
                return
            cur = recs[-1][0]

    async def _level(self, m: str, st: dict[str, Any]) -> bool:
        """Bring journal `m` level with this member's log; True when done. Raises
        Unreachable when this log no longer holds the records `m` lacks (a checkpoint
        dropped them): `m` must be restored from a copy of a standby's volume."""
        cur = int(st["last"]) if st["accepted"] == self.epoch else _base(st)
        while True:
            recs = await self._call(self.me, "read", after=cur,
                                    max_records=self.chunk_records,
                                    max_bytes=self.chunk_bytes)
            # only what the log acknowledged: a group in flight travels with its append
            recs = [(int(t), bytes(b)) for t, b in recs if int(t) <= self.last]
            if (recs[0][0] if recs else self.last + 1) != cur + 1 and cur < self.last:
                # never a log with a hole: the records after `cur` were checkpointed away
                raise Unreachable(f"{m} lacks the records after ticket {cur}, which this "
                                  "member's log no longer holds: copy a standby's volume to "
                                  "it, then re-add it (docs/master.md, \"Master set\")")
            end = recs[-1][0] if recs else cur
            final = end >= self.last
            got = await self._call(m, "sync", cluster=self.cluster, epoch=self.epoch,
                                   base=cur, records=recs, committed=self.committed,
                                   final=final, leader=self.me, **self._inc(m))
            # what is known equal to this log (the journal may hold more, not compared yet):
            # the leader's checkpoints keep the records after it
            self.match[m] = min(int(got["last"]), end)
            if final:
                return bool(got["accepted"] == self.epoch and got["last"] == self.last)
            cur = end

    # -- appends -----------------------------------------------------------------------------
    def refusal(self) -> str | None:
        return self.failed

    async def append(self, records: list[Record]) -> None:
        """Make `records` (tickets above the log's end) durable on a majority including
        this member. Empty: a heartbeat carrying the committed ticket to the standbys."""
        async with self._gate:
            await self._append(records)

    async def _append(self, records: list[Record]) -> None:
        """`append`, holding the gate."""
        if self.failed is not None:
            raise (Fenced if self.fenced else QuorumLost)(self.failed)
        prev, last = self.last, (records[-1][0] if records else self.last)
        committed = self.committed
        t0 = time.monotonic()
        # the other journals' appends first: on the wire before this member's own write
        order = sorted(self.in_sync, key=lambda m: m == self.me)
        sends = {m: asyncio.ensure_future(self._send(m, prev, records, committed))
                 for m in order}
        for s in sends.values():
            self._tasks.add(s)
            s.add_done_callback(self._tasks.discard)
        acks: set[str] = set()
        errors: dict[str, str] = {}
        pending = set(sends.values())
        deadline = t0 + self.timeout
        by_task = {t: m for m, t in sends.items()}
        while pending and not (self.me in acks and len(acks) >= self.majority):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            done, pending = await asyncio.wait(pending, timeout=left,
                                               return_when=asyncio.FIRST_COMPLETED)
            for t in done:
                m = by_task[t]
                exc = t.exception()
                if exc is None and t.result():
                    acks.add(m)
                else:
                    errors[m] = str(exc) if exc else "dropped"
            if self.me in errors or len(self.members) - len(errors) < self.majority:
                break
        if self.on_quorum_wait is not None and records:
            self.on_quorum_wait(time.monotonic() - t0)
        if self.me in acks and len(acks) >= self.majority:
            self.last = last
            self.committed = max(self.committed, last)
            self.groups += 1
            return
        why = (f"group {prev + 1}..{last} of epoch {self.epoch} reached "
               f"{len(acks)} of {len(self.members)} journals in "
               f"{time.monotonic() - t0:.1f}s; a majority is {self.majority}"
               + (f" ({'; '.join(f'{m}: {e}' for m, e in sorted(errors.items()))})"
                  if errors else ""))
        self.failed = why if not self.fenced else f"fenced: {why}"
        raise (Fenced if self.fenced else QuorumLost)(self.failed)

    async def _send(self, m: str, prev: int, records: list[Record], committed: int) -> bool:
        if self._queued[m] >= MAX_QUEUED and m != self.me:
            self._drop(m, "too far behind")
            return False
        self._queued[m] += 1
        try:
            async with self._peer[m]:
                if m not in self.in_sync:
                    return False
                t0 = time.monotonic()
                try:
                    got = await self._call(m, "append", cluster=self.cluster, epoch=self.epoch,
                                           prev=prev, records=records, committed=committed,
                                           leader=self.me, **self._inc(m))
                except Refused as e:
                    if e.kind == "fenced":
                        self.fenced = True
                        self.failed = f"fenced by {m}: {e.detail}"
                    self._drop(m, str(e))
                    raise
                except Unreachable as e:
                    self._drop(m, str(e))
                    raise
                if records and self.on_append is not None:
                    self.on_append(time.monotonic() - t0)
                self.match[m] = int(got["last"])
                return True
        finally:
            self._queued[m] -= 1

    def _drop(self, m: str, why: str) -> None:
        if m == self.me:
            self.failed = self.failed or f"this member's journal failed: {why}"
            return
        if m in self.in_sync:
            log.warning("journal %s fell out of sync: %s", m, why)
        self.in_sync.discard(m)
        self.status[m] = why
        self._catch_up_later(m)

    def _catch_up_later(self, m: str) -> None:
        if (self.closed or not self.background or m == self.me or m in self._catching
                or m not in self.members):
            return
        task = asyncio.ensure_future(self._catch_up(m))
        self._catching[m] = task
        task.add_done_callback(lambda _t: self._catching.pop(m, None))

    async def _catch_up(self, m: str) -> None:
        """Bring a lagging journal level in the background, then count it again."""
        pause = 0.1
        while not self.closed and self.failed is None and m in self.members:
            try:
                if await self.catch_up_step(m):
                    return
            except (Refused, Unreachable):
                if self.fenced:
                    return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("catching up journal %s failed: %s", m, e)
                self.status[m] = f"catch-up failed: {e}"
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)

    async def catch_up_step(self, m: str) -> bool:
        """One attempt to bring journal `m` level (a re-added, joining one included: the
        leader confirms its epoch first, see _join); True once it counts again. Raises
        Refused or Unreachable (a fenced refusal also fails this log), QuorumLost or
        Fenced when that confirmation failed (this log refuses appends from then on)."""
        if m == self.me or m in self.in_sync:
            return m in self.in_sync
        try:
            st = await self._call(m, "state")
            if not st["formatted"] or st["cluster"] != self.cluster:
                self.status[m] = _why(st, self.cluster)
                return False
            self.incarnation[m] = st.get("incarnation") or ""  # a re-added one: its new one
            if st["last"] < self.last - 1:  # the bulk, without holding appends
                await self._level(m, st)
                st = await self._call(m, "state")
            async with self._gate:  # the end, with no append in flight
                if await self._level(m, st):
                    if not await self._join(m):
                        return False
                    self.in_sync.add(m)
                    self.status[m] = "in sync"
                    log.info("journal %s is in sync again at ticket %d", m, self.last)
                    return True
            return False
        except (Refused, Unreachable) as e:
            self.status[m] = str(e)
            if isinstance(e, Refused) and e.kind == "fenced":
                self.fenced, self.failed = True, f"fenced by {m}: {e.detail}"
            raise

    async def _join(self, m: str) -> bool:
        """A levelled journal that is joining (re-added) counts only once this leader has
        confirmed its epoch on a majority of the other journals (an empty append to the
        in-sync set, which lacks `m`): a deposed leader fails here, so it never makes a
        wiped journal count (the wipe erased the promises it had made to a newer one).
        Then `join` ends its joining. Holding the gate."""
        st = await self._call(m, "state")
        if st.get("joining") is None:
            return True
        await self._append([])
        got = await self._call(m, "append", cluster=self.cluster, epoch=self.epoch,
                               prev=self.last, records=[], committed=self.committed,
                               leader=self.me, **self._inc(m), join=True)
        self.match[m] = int(got["last"])
        return got.get("joining") is None

    # -- membership --------------------------------------------------------------------------
    def set_members(self, members: list[str], clients: dict[str, JournalClient]) -> None:
        """A committed membership change (one member added or removed)."""
        self.clients.update(clients)
        for m in members:
            self._peer.setdefault(m, asyncio.Lock())
            self._queued.setdefault(m, 0)
        for m in self.members:
            if m not in members:
                self.in_sync.discard(m)
                t = self._catching.pop(m, None)
                if t is not None:
                    t.cancel()
        self.members = list(members)
        for m in members:
            if m not in self.in_sync:
                self._catch_up_later(m)

    async def format_member(self, m: str) -> dict[str, Any]:
        """Format a new (unformatted) journal into this cluster, before it is added (or
        re-added): it is *joining* until caught up to this log's committed ticket, and
        promises no epoch before (its empty log must not count toward a recovery)."""
        self.in_sync.discard(m)  # an empty log: it counts once caught up
        out: dict[str, Any] = await self._call(m, "format", cluster=self.cluster,
                                               epoch=self.epoch, until=self.committed)
        self.status[m] = _why(out, self.cluster)
        return out

    async def close(self) -> None:
        self.closed = True
        for t in [*self._catching.values(), *self._tasks]:
            t.cancel()
        for t in [*self._catching.values(), *self._tasks]:
            with contextlib.suppress(BaseException):
                await t

    def view(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "last": self.last, "committed": self.committed,
                "members": {m: {"in_sync": m in self.in_sync, "last": self.match.get(m),
                                "lag": (self.last - self.match[m]) if m in self.match
                                else None,
                                "status": "in sync" if m in self.in_sync
                                else self.status.get(m, "unknown")}
                            for m in self.members}}


def _why(state: Any, cluster: str | None) -> str:
    if not isinstance(state, dict):
        return f"unreachable: {state}"
    if state.get("copy_of"):
        return f"unformatted (a copy of {state['copy_of']}'s volume): re-add it"
    if not state["formatted"]:
        return "unformatted (new or wiped disk): re-add it"
    if state["cluster"] != cluster:
        return f"foreign (cluster {state['cluster']})"
    if state.get("joining") is not None:
        return f"joining (re-added, not caught up to ticket {state['joining']} yet)"
    return "formatted"


def _base(state: dict[str, Any]) -> int:
    """The ticket up to which a journal's log is known to be every leader's: its committed
    ticket, or its log's floor if higher (records are checkpointed away only once the
    member's index applied them, and an index applies only committed records; the
    committed ticket a journal read back after a restart can be older)."""
    return max(int(state["committed"]), min(int(state.get("floor", 0)), int(state["last"])))


def _after(records: list[Record], ticket: int) -> list[Record]:
    """`records`' bodies renumbered after `ticket`."""
    return [(ticket + 1 + i, b) for i, (_, b) in enumerate(records)]
