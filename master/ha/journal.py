"""A member's journal: the member-side half of the quorum log, and its RPC handlers.

Every member of a master set keeps a journal: its own WAL (the records, opaque bytes with
increasing tickets) plus a small fsynced *meta* file::

    <data_dir>/journal.json  {"cluster": id, "promised": epoch, "accepted": epoch,
                              "committed": ticket, "joining": ticket or null,
                              "incarnation": id, "member": url}

- ``promised``: the highest epoch this journal promised (``new_epoch``). It refuses
  ``append`` and ``sync`` from any lower epoch ("fenced"): a deposed leader's next group
  fails here, whatever the elector believes.
- ``accepted``: the epoch of the last leader whose log this journal's log is a prefix of
  (set by ``sync``, the only call that can truncate). Recovery compares journals by
  (accepted, last ticket) — HDFS's lastWriterEpoch, then the longest log.
- ``committed``: the highest ticket a leader told this journal is durable on a majority
  (never beyond its own last ticket). A standby applies records up to it to its index.

A journal without a meta file (a new or wiped disk) or with another cluster's id answers
"unformatted" / "foreign" to every call but ``state`` and never counts toward a quorum
until an operator re-adds it (``format`` from the leader), then it is caught up.

- ``joining``: set by a re-add (``format(..., until=<the leader's committed ticket>)``)
  and persisted. A joining journal's log is empty while records up to that ticket are
  acknowledged, so it refuses to promise (``new_epoch`` answers "joining"): it counts
  toward no recovery majority and is never a recovery source. Only an ``append`` with
  ``join=True`` clears it, once this log is a prefix of that leader's log (accepted == the
  leader's epoch) reaching the ticket; the leader sends it after it confirmed its epoch on
  a majority of the *other* journals (a deposed leader cannot, so it cannot make a wiped
  journal count: Kafka KIP-853, a wiped voter must not vote its way back).
- ``incarnation``: a random id made by ``format``. A wipe loses the journal's promises
  with its disk, so a leader that got a promise (or a state) from an earlier incarnation
  passes that id with ``append``, ``sync`` and ``read``, and a re-formatted journal refuses
  them ("out_of_sync"): a promise from a wiped disk is never acted on.
- ``member``: whose journal this is. A volume restored from a copy of another member's
  answers "unformatted" (a copy of that member's) like a wiped one: the promises and the
  log in it are the other member's, not this one's. Re-added (``format`` with ``until``)
  it keeps its log and index (committed records are every member's), and is *joining*
  until the leader has levelled it: a member is caught up from a copy when the leader's
  checkpoints dropped the records an empty log would need.

The handlers are plain methods serialized by one lock (a WAL write blocks: call them from a
worker thread). They raise :class:`Refused` with a kind the leader acts on.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

Record = tuple[int, bytes]


class Refused(Exception):
    """A journal refused a call. kind: ``fenced`` (a higher epoch was promised),
    ``out_of_sync`` (the append does not follow its log), ``unformatted``, ``foreign``,
    ``joining`` (re-added, not caught up yet: it promises no epoch)."""

    def __init__(self, kind: str, detail: str, state: dict[str, Any] | None = None) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail, self.state = kind, detail, state or {}


class Log(Protocol):
    """Where a journal's records live: the member's WAL (:class:`WalLog`) or memory."""

    @property
    def last_ticket(self) -> int: ...

    @property
    def floor(self) -> int:
        """Records with tickets <= floor may have been dropped (checkpoints)."""
        ...

    def write(self, records: list[Record]) -> None:
        """Append and make durable (all or nothing on failure, as a WAL group)."""
        ...

    def read_after(self, after: int, max_records: int, max_bytes: int) -> list[Record]: ...

    def truncate_after(self, ticket: int) -> None:
        """Drop every record with a ticket > `ticket`, durably."""
        ...


class Meta(Protocol):
    def load(self) -> dict[str, Any] | None: ...

    def save(self, meta: dict[str, Any]) -> None: ...


class FileMeta:
    """journal.json, replaced atomically and fsynced (file and directory)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def load(self) -> dict[str, Any] | None:
        try:
            with open(self.path, "rb") as f:
                out: dict[str, Any] = json.loads(f.read())
                return out
        except FileNotFoundError:
            return None

    def save(self, meta: dict[str, Any]) -> None:
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, json.dumps(meta, sort_keys=True).encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        dfd = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


@dataclass
class State:
    member: str
    formatted: bool
    cluster: str | None
    promised: int
    accepted: int
    last: int
    committed: int
    floor: int
    joining: int | None = None
    incarnation: str | None = None
    copy_of: str | None = None

    def wire(self) -> dict[str, Any]:
        return dict(self.__dict__)  # flat: what asdict gives, without its deep copy


MAX_SYNC_RECORDS = 20000


class Journal:
    """The member-side journal. `on_committed(ticket)` is called (under no lock) when the
    committed ticket advanced: a standby applies its log up to there."""

    def __init__(self, member: str, log: Log, meta: Meta,
                 on_committed: Callable[[int], None] | None = None) -> None:
        self.member, self.log, self.meta_store = member, log, meta
        self.on_committed = on_committed
        self._lock = threading.Lock()
        m = meta.load() or {}
        self.cluster: str | None = m.get("cluster")
        self.promised = int(m.get("promised", 0))
        self.accepted = int(m.get("accepted", 0))
        self.committed = min(int(m.get("committed", 0)), log.last_ticket)
        joining = m.get("joining")
        self.joining: int | None = None if joining is None else int(joining)
        self.incarnation: str | None = m.get("incarnation")
        # a volume copied from another member (a restore): it must not answer with that
        # member's promises and log, which this member never gave (a majority counting
        # them could miss a record this member's own lost disk held); it counts once
        # re-added by a leader and caught up, like a wiped one
        owner = m.get("member")
        self.copy_of: str | None = (owner if isinstance(owner, str) and owner != member
                                    and self.cluster is not None else None)
        self.appends = 0
        self.writer: str | None = None  # the leader whose groups this journal takes now

    # -- helpers -------------------------------------------------------------------------
    def _save(self) -> None:
        self.meta_store.save({"member": self.copy_of or self.member,
                              "cluster": self.cluster, "promised": self.promised,
                              "accepted": self.accepted, "committed": self.committed,
                              "joining": self.joining, "incarnation": self.incarnation})

    def _state(self) -> State:
        return State(self.member, self.cluster is not None and self.copy_of is None,
                     self.cluster, self.promised, self.accepted, self.log.last_ticket,
                     self.committed, self.log.floor, self.joining, self.incarnation,
                     self.copy_of)

    def _joined(self, epoch: int) -> bool:
        """Clear `joining` once this log is the leader's (of `epoch`) up to the ticket."""
        if (self.joining is not None and self.accepted == epoch
                and self.log.last_ticket >= self.joining):
            self.joining = None
            return True
        return False

    def _check(self, cluster: str, epoch: int, incarnation: str = "") -> None:
        if self.cluster is None:
            raise Refused("unformatted", f"journal of {self.member} is unformatted (new or "
                          "wiped disk): re-add it with `squall master members add`",
                          self._state().wire())
        if self.copy_of is not None:
            raise Refused("unformatted", f"journal of {self.member} is a copy of "
                          f"{self.copy_of}'s volume: re-add it with `squall master members "
                          "add`", self._state().wire())
        if cluster != self.cluster:
            raise Refused("foreign", f"journal of {self.member} belongs to cluster "
                          f"{self.cluster}, not {cluster}", self._state().wire())
        if incarnation and incarnation != self.incarnation:
            raise Refused("out_of_sync", f"journal of {self.member} was re-formatted (a "
                          "wiped disk re-added) since this leader heard from it",
                          self._state().wire())
        if epoch < self.promised:
            raise Refused("fenced", f"epoch {epoch} is below the promised epoch "
                          f"{self.promised}", self._state().wire())

    def _advance(self, committed: int) -> bool:
        c = min(committed, self.log.last_ticket)
        if c > self.committed:
            self.committed = c
            return True
        return False

    def _notify(self, advanced: bool) -> None:
        if advanced and self.on_committed is not None:
            self.on_committed(self.committed)

    # -- RPC handlers --------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        with self._lock:
            return self._state().wire()

    def format(self, cluster: str, epoch: int, *, adopt: bool = False,
               until: int | None = None) -> dict[str, Any]:
        """Make this (unformatted: new or wiped) journal a member of `cluster`: at
        bootstrap, or when an operator re-adds it. A journal of another cluster is never
        re-formatted here: wipe its volume first (its index holds that cluster's state).
        `adopt`: the bootstrapping leader's own log may hold records (a single master's
        volume becoming the first member); they become the set's log. `until`: a re-add
        by a leader, whose committed ticket it is: the journal is *joining* (promises no
        epoch) until a leader caught it up to there."""
        with self._lock:
            if self.copy_of is not None and self.cluster == cluster and until is not None:
                # a copy of another member's volume, re-added: its log is this set's up to
                # its committed ticket (committed records are every member's) and is
                # levelled with the leader's before it counts
                self.copy_of, self.accepted = None, 0
                self.promised = max(self.promised, epoch)
                self.incarnation = uuid.uuid4().hex
                self.joining = max(0, int(until))
                self._save()
                return self._state().wire()
            if self.copy_of is not None and self.cluster == cluster:
                raise Refused("unformatted", f"journal of {self.member} is a copy of "
                              f"{self.copy_of}'s volume: a leader re-adds it",
                              self._state().wire())
            if self.cluster == cluster:
                return self._state().wire()
            if self.cluster is not None:
                raise Refused("foreign", f"journal of {self.member} belongs to cluster "
                              f"{self.cluster}; wipe its volume to re-add it",
                              self._state().wire())
            if self.log.last_ticket > self.log.floor and not adopt:
                raise Refused("foreign", f"journal of {self.member} is unformatted but its "
                              "log holds records; wipe its volume to re-add it",
                              self._state().wire())
            self.cluster, self.promised = cluster, max(self.promised, epoch)
            self.accepted = 0
            self.incarnation = uuid.uuid4().hex
            self.joining = None if until is None else max(0, int(until))
            self._save()
            return self._state().wire()

    def new_epoch(self, cluster: str, epoch: int) -> dict[str, Any]:
        """Promise `epoch` (strictly above every epoch promised before)."""
        with self._lock:
            self._check(cluster, epoch)
            if self.joining is not None:
                raise Refused("joining", f"journal of {self.member} was re-added and is not "
                              f"caught up to ticket {self.joining} yet: it promises no "
                              "epoch", self._state().wire())
            if epoch <= self.promised:
                raise Refused("fenced", f"epoch {epoch} was not above the promised "
                              f"{self.promised}", self._state().wire())
            self.promised = epoch
            self.writer = None  # a new epoch: its leader is not known yet
            self._save()
            return self._state().wire()

    def append(self, cluster: str, epoch: int, prev: int, records: list[Record],
               committed: int, leader: str = "", incarnation: str = "",
               join: bool = False) -> dict[str, Any]:
        """A leader's group, following ticket `prev`. Empty `records`: a heartbeat that
        only carries the committed ticket. `join`: the leader confirmed its epoch on a
        majority of the other journals: a joining journal caught up to its ticket counts
        from now on."""
        with self._lock:
            self._check(cluster, epoch, incarnation)
            if self.accepted != epoch or self.log.last_ticket != prev:
                raise Refused("out_of_sync", f"journal of {self.member} is at ticket "
                              f"{self.log.last_ticket} of epoch {self.accepted}, the group "
                              f"follows {prev} of epoch {epoch}", self._state().wire())
            if records:
                self.log.write(records)
                self.appends += 1
            self.writer = leader or None
            if join and self._joined(epoch):
                self._save()
            # not saved here: a committed ticket read back lower after a restart only makes
            # the next sync compare more records and the standby apply later (two fsyncs
            # per group saved); promises and accepted epochs are always saved
            advanced = self._advance(committed)
            out = self._state().wire()
        self._notify(advanced)
        return out

    def sync(self, cluster: str, epoch: int, base: int, records: list[Record],
             committed: int, final: bool, leader: str = "",
             incarnation: str = "") -> dict[str, Any]:
        """Make this log equal the leader's: `records` are the leader's records after
        `base`, `final` says they end its log. Records equal to the leader's are kept (a
        record acknowledged by a majority is never cut, not even for a moment); the first
        that differs and all after it are cut, then the rest written. Once this log is a
        prefix of the leader's (everything compared), accepted = epoch. `base` must be a
        ticket up to which the log is the leader's (this journal's committed ticket, or
        the end of an earlier sync of this epoch)."""
        if len(records) > MAX_SYNC_RECORDS:
            raise ValueError(f"a sync carries at most {MAX_SYNC_RECORDS} records")
        with self._lock:
            self._check(cluster, epoch, incarnation)
            if base > self.log.last_ticket or base < self.log.floor:
                raise Refused("out_of_sync", f"journal of {self.member} holds tickets "
                              f"{self.log.floor + 1}..{self.log.last_ticket}, the sync "
                              f"starts after {base}", self._state().wire())
            if epoch > self.promised:
                self.promised = epoch
            mine = self.log.read_after(base, len(records) + 1, 1 << 62)
            same = 0
            while same < len(mine) and same < len(records) and mine[same] == records[same]:
                same += 1
            keep = records[same - 1][0] if same else base
            end = records[-1][0] if records else base  # the leader's log is known to here
            if same < len(records):
                if self.log.last_ticket > keep:  # differs from the leader's: not committed
                    self.log.truncate_after(keep)
                self.log.write(records[same:])
            elif final and self.log.last_ticket > end:
                self.log.truncate_after(end)  # past the leader's end: never committed
            if self.log.last_ticket == end:  # a prefix of the leader's log, all compared
                self.accepted = epoch
            self.writer = leader or None
            self.committed = min(self.committed, self.log.last_ticket)
            self._advance(min(committed, end))
            self._save()
            out = self._state().wire()
        self._notify(True)
        return out

    def read(self, after: int, max_records: int = 5000,
             max_bytes: int = 8 << 20, incarnation: str = "") -> list[Record]:
        """Records after `after` (for recovery and catch-up)."""
        with self._lock:
            if self.cluster is None or self.copy_of is not None:
                copy = f" (a copy of {self.copy_of}'s volume)" if self.copy_of else ""
                raise Refused("unformatted", f"journal of {self.member} is unformatted"
                              + copy, self._state().wire())
            if incarnation and incarnation != self.incarnation:
                raise Refused("out_of_sync", f"journal of {self.member} was re-formatted "
                              "since this leader heard from it", self._state().wire())
            return self.log.read_after(after, max_records, max_bytes)


class MemLog:
    """An in-memory :class:`Log` (tests and the model): `write` may be told to tear."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.floor = 0

    @property
    def last_ticket(self) -> int:
        return self.records[-1][0] if self.records else self.floor

    def write(self, records: list[Record]) -> None:
        last = self.last_ticket
        for t, _ in records:
            if t <= last:
                raise ValueError(f"ticket {t} does not increase past {last}")
            last = t
        self.records.extend(records)

    def read_after(self, after: int, max_records: int, max_bytes: int) -> list[Record]:
        out: list[Record] = []
        size = 0
        for r in self.records:
            if r[0] > after:
                if len(out) >= max_records or (out and size + len(r[1]) > max_bytes):
                    break
                out.append(r)
                size += len(r[1])
        return out

    def truncate_after(self, ticket: int) -> None:
        self.records = [r for r in self.records if r[0] <= ticket]


class MemMeta:
    def __init__(self) -> None:
        self.saved: dict[str, Any] | None = None

    def load(self) -> dict[str, Any] | None:
        return dict(self.saved) if self.saved is not None else None

    def save(self, meta: dict[str, Any]) -> None:
        self.saved = dict(meta)
