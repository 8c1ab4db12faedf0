"""Group commit: one LMDB write transaction per WAL group, committed only once durable.

Every mutating request runs on the event loop thread in a *child* transaction of the open
batch transaction, and adds its WAL record to the batch. The first request of a batch
schedules the batch's flush for the end of the current loop iteration; from then on the
batch is closed (later requests wait for the next one). The flush writes the batch's records
to the WAL as one group on the commit thread, durable once written (one ``fdatasync``; the
group is written whole or truncated away), then commits the batch
transaction (with the index's own ``fdatasync`` when index sync is on, the default), and
then answers the batch's requests; a request run with ``answer_when_durable`` (the HTTP
routes' writes) that logged a record is answered once the WAL group is durable, before that
index commit. Hence:

* **Refused means not applied.** A request that fails validation aborts only its child
  transaction (plans validate before they change anything, in LMDB or in memory). When the
  WAL cannot be written, the whole batch transaction is aborted, the in-memory state is
  reloaded from the last committed index, and every request of the batch is answered 503
  with nothing applied anywhere: index, counters, leases, freed blobs.
* **Visible once durable.** Readers (read transactions) see a change only after its WAL
  record is durable and its batch committed; the next batch begins after that commit.
* **Power-loss safe at one sync per group** (the index's own; docs/master.md, "Power loss").

One dedicated thread begins, commits and aborts batch transactions (LMDB's writer lock
belongs to the thread that began the transaction); the event loop uses a transaction only
between those steps, so no fdatasync blocks it. A flush is one hop to that thread: the WAL
group (:meth:`WAL.write_group`), the index commit, and the *next* batch's transaction,
which waits as a spare for the next request (docs/master.md, "Commit path"). A master
set's log (``append_group``, ``master/ha/role.py``) is awaited on the loop instead, whose
journal calls it is (the leader's own journal write included, after the other members'
appends are sent); the hop then commits only the index (decision 0024).

Disk trouble (a failed WAL write, a failed ``fdatasync``, an index commit failing after a
durable WAL group; :meth:`GroupCommit.catch_up`): docs/master.md, "Refused means not applied".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import lmdb

from squall.common.errors import StatusError, Unavailable
from squall.master.storage.index import Index
from squall.master.storage.lag import IndexLag
from squall.master.storage.wal import WAL, WALFailed

log = logging.getLogger("squall.master")
T = TypeVar("T")
Work = Callable[[lmdb.Transaction, int], tuple[bytes | None, T]]


@dataclass
class _Batch:
    txn: lmdb.Transaction
    done: asyncio.Future[None]
    next_ticket: int
    records: list[tuple[int, bytes]] = field(default_factory=list)
    members: int = 0  # requests waiting for this batch
    dirty: bool = False  # some child transaction committed into it
    closed: bool = False
    aborted: bool = False
    # set once the batch's WAL group is durable, before its index commit (or with `done`)
    durable: asyncio.Future[None] = field(init=False)

    def __post_init__(self) -> None:
        self.durable = self.done.get_loop().create_future()
        self.durable.add_done_callback(_consume)
        self.done.add_done_callback(lambda f: _settle(self.durable, f))


class GroupCommit:
    def __init__(self, index: Index, wal: WAL,
                 reapply: Callable[[list[tuple[int, bytes]]], None]) -> None:
        self.index, self.wal = index, wal
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="index-commit")
        self._open: _Batch | None = None
        self._spare: lmdb.Transaction | None = None  # begun by the last flush, for the next
        self._flushing: _Batch | None = None  # handed to the commit thread, not back yet
        self._flushes: set[asyncio.Future[None]] = set()
        self._closed = False
        self._closing: asyncio.Future[None] | None = None
        self.committed_ticket = index.applied
        self.batches = 0
        self.aborted_batches = 0
        self.lag = IndexLag(index, reapply)  # after an index commit failed (master/storage/lag.py)

    @property
    def stalled(self) -> str | None:
        """Why requests are refused while the index is behind the WAL, or None."""
        return self.lag.reason

    # -- the request side ----------------------------------------------------------------
    async def run(self, work: Work[T], pre: Callable[[lmdb.Transaction], Any] | None = None,
                  *, logged_only: bool = False, answer_when_durable: bool = False
                  ) -> tuple[int, T]:
        """Apply `work(txn, ticket) -> (WAL body or None, value)` in the current batch and
        return (ticket, value) once the batch is durable; ticket is 0 when nothing was
        logged. `pre(txn)` (e.g. a sweep) runs first in its own child transaction, so a
        refused `work` cannot take it back; it returns how many changes it made.
        `logged_only`: `work` changes the index only when it returns a WAL body (a plan
        applied), so a batch of such requests that logged nothing (an empty lease) is
        answered without a commit, and its transaction serves the next batch.
        `answer_when_durable`: when `work` logged a record, return once the WAL group is
        durable, while the index commit runs (index reads wait in `settled`; the HTTP routes'
        writes); else once the index is committed too (tools, tests). Why: docs/master.md."""
        batch = await self._current()
        batch.members += 1
        try:
            if pre is not None:
                self._child(batch, lambda txn, _t: (None, pre(txn)), clean=lambda v: not v)
            ticket, (body, value) = self._child(
                batch, work, clean=(lambda _v: True) if logged_only else None)
            if body is not None:  # handed to the WAL as one group when the batch closes
                batch.records.append((ticket, body))
                batch.next_ticket = ticket + 1
            # a request that logged a record may be answered once it is durable
            early = body is not None and answer_when_durable
            await asyncio.shield(batch.durable if early else batch.done)
        finally:
            batch.members -= 1
            if not (batch.members or batch.dirty or batch.closed or batch.aborted):
                self._discard(batch)  # opened by a refused request alone: nothing to commit
        return (ticket if body is not None else 0), value

    def _child(self, batch: _Batch, work: Work[T], clean: Callable[[T], bool] | None = None
               ) -> tuple[int, tuple[bytes | None, T]]:
        """Run `work` in a child transaction of the batch. `clean(value)`, when given, says
        whether a run that logged nothing left the index unchanged."""
        ticket = batch.next_ticket
        self.index.hints.clear()  # hints are valid within one (child) transaction
        child = self.index.env.begin(write=True, parent=batch.txn)
        try:
            out = work(child, ticket)
        except StatusError:
            child.abort()  # validation failed before anything changed
            raise
        except BaseException as e:
            child.abort()
            self._abort(batch, e)  # in-memory state may be half-changed: drop the batch
            if isinstance(e, lmdb.Error):
                raise Unavailable(f"index write failed ({e}); nothing was applied, "
                                  "retry later") from e
            raise
        child.commit()
        if out[0] is not None or clean is None or not clean(out[1]):
            batch.dirty = True
        return ticket, out

    async def _current(self) -> _Batch:
        while True:
            # checked again after every wait: the flush waited for may have failed, and a
            # request planned on an index that lacks acknowledged records would undo them
            self.refuse_if_unhealthy()
            b = self._open
            if b is not None and not b.closed and not b.aborted:
                return b
            if self._closing is not None:
                await asyncio.shield(self._closing)
                continue
            loop = asyncio.get_running_loop()
            b = _Batch(self._take_txn(), loop.create_future(), self.wal.last_ticket + 1)
            b.done.add_done_callback(_consume)
            self._open = b
            loop.call_soon(self._schedule_flush, b)
            return b

    # -- the flush -------------------------------------------------------------------------
    def _schedule_flush(self, b: _Batch) -> None:
        task = asyncio.ensure_future(self._flush(b))
        self._flushes.add(task)  # held while it runs (the loop keeps only weak references)
        task.add_done_callback(self._flushes.discard)

    async def _flush(self, b: _Batch) -> None:
        if b.closed or b.aborted:  # committed by run_sync, or dropped
            return
        b.closed = True
        loop = asyncio.get_running_loop()
        closing = self._closing = loop.create_future()
        try:
            if not (b.dirty or b.records):  # nothing changed: no commit, no thread hop
                self._keep_as_spare(b)
                if not b.done.done():
                    b.done.set_result(None)
                return
            try:
                replicated = getattr(self.wal, "append_group", None)
                if replicated is not None and b.records:
                    # a master set's log: durable on a majority, from the loop (its sends
                    # are the loop's; one thread hop fewer each way than from the commit
                    # thread), then only the index commit on the commit thread
                    self._flushing = b
                    await replicated(b.records)
                    _settle(b.durable, None)
                    await loop.run_in_executor(self._thread, self._persist, b, False)
                else:
                    persisted = loop.run_in_executor(self._thread, self._persist, b)
                    self._flushing = b
                    await persisted
            except WALFailed as e:  # nothing of the batch is durable: refuse it all
                self._abort(b, e)
                return
            except lmdb.Error as e:
                self._commit_failed(b, e)
            else:
                if b.records:
                    self.committed_ticket = b.records[-1][0]
            self.batches += 1
            self._committed()
            if not b.done.done():
                b.done.set_result(None)
        finally:
            self._flushing = None
            self._closing = None
            closing.set_result(None)

    def _persist(self, b: _Batch, write: bool = True) -> None:
        """On the commit thread: the batch's WAL group (one write, one fdatasync; it fails
        or succeeds whole; `write` False: the log made it durable already), then the index
        commit, then the next batch's transaction."""
        if b.records and write:
            self.wal.write_group(b.records)  # WALFailed: the transaction is still open
            # durable: answer who may be answered now (see `run`); the index
            # commit below runs while their answers travel
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody to answer
                b.durable.get_loop().call_soon_threadsafe(_settle, b.durable, None)
        self._commit_txn(b.txn)
        try:
            self._spare = self.index.env.begin(write=True)
        except lmdb.Error as e:  # the next batch begins its own (and reports the trouble)
            log.warning("could not begin the next index transaction ahead: %s", e)

    def _take_txn(self) -> lmdb.Transaction:
        """The write transaction for a new batch: the spare one, or one begun now."""
        txn, self._spare = self._spare, None
        if txn is None:
            return self._thread.submit(self.index.begin_write).result()
        self.index.hints.clear()  # what begin_write does on the loop's side
        return txn

    def _keep_as_spare(self, b: _Batch) -> None:
        """A batch that changed nothing: its (clean) transaction begins the next batch."""
        if self._spare is None:
            self._spare = b.txn
        else:
            self._thread.submit(b.txn.abort).result()

    def _drop_spare(self, also: lmdb.Transaction | None = None) -> None:
        """Abort the spare transaction (and `also`), on its thread, after whatever runs
        there now (a flush in progress may be about to begin one). Aborting a transaction
        already committed has no effect."""
        def drop() -> None:
            txn, self._spare = self._spare, None
            for t in (txn, also):
                if t is not None:
                    t.abort()
        self._thread.submit(drop).result()

    @staticmethod
    def _commit_txn(txn: lmdb.Transaction) -> None:  # an attribute, for injected failures
        txn.commit()

    def _commit_failed(self, b: _Batch, e: lmdb.Error) -> None:
        """The batch is durable in the WAL but its index commit failed (e.g. a full disk).
        Its requests are acknowledged (a restart replays them). The index is behind the
        log: refuse writes until :meth:`catch_up` applies the records again."""
        if self._closed:  # the index is closed: a restart replays what the WAL holds
            if not b.records:  # nothing logged: refuse it
                b.done.set_exception(Unavailable("the master stopped; nothing was applied, "
                                                 "retry"))
            return
        self.index.freed_pending.clear()
        self.index.reload()
        if not b.records:  # nothing logged, nothing acknowledged yet: refuse it all
            log.warning("index commit failed, nothing was applied: %s", e)
            b.done.set_exception(Unavailable(f"index write failed ({e}); nothing was "
                                             "applied, retry later"))
            return
        self.lag.fell_behind(b.records, e)

    async def catch_up(self) -> bool:
        """Apply records whose index commit failed again (master/storage/lag.py). Returns whether
        the index is whole again."""
        if not self.lag.records:
            return True
        self._drop_spare()  # the replay begins its own write transaction on that thread
        last = await self.lag.catch_up(self._thread)
        if last is None:
            return False
        self.committed_ticket = max(self.committed_ticket, last)
        return True

    def _abort(self, b: _Batch, e: BaseException) -> None:
        """Roll the whole batch back: LMDB, in-memory state, pending frees; refuse its
        requests."""
        if b.aborted:
            return
        b.aborted = True
        self.aborted_batches += 1
        if self._closed:  # close() aborted the transaction on its thread; the index is closed
            if not b.done.done():
                b.done.set_exception(self._refusal(e))
            return
        self._thread.submit(b.txn.abort).result()
        self.index.freed_pending.clear()
        self.index.reload()
        if self._open is b:
            self._open = None
        log.error("refused a batch of changes, nothing applied: %s", e)
        if not b.done.done():
            b.done.set_exception(self._refusal(e))

    def _discard(self, b: _Batch) -> None:
        b.aborted = True  # its only request was refused: the transaction is unchanged
        self._keep_as_spare(b)
        if self._open is b:
            self._open = None

    def _refusal(self, e: BaseException) -> Unavailable:
        if isinstance(e, WALFailed):
            return Unavailable(f"{e}; nothing was applied, retry later")
        return Unavailable(f"write failed ({e}); nothing was applied, retry later")

    # -- health and synchronous use --------------------------------------------------------
    def refuse_if_unhealthy(self) -> None:
        if self.stalled is not None:
            raise Unavailable(self.stalled)
        reason = self.wal.failure()
        if reason is not None:
            raise Unavailable(f"{reason}; nothing was applied, retry later")

    async def settled(self) -> None:
        """Wait until no index commit is in flight: a request is answered as soon as its
        WAL record is durable, while its batch's index commit may still run. Reads of the
        index wait here first, so whoever got an answer reads what it wrote. While the index
        is behind the WAL (a failed index commit), they are refused as writes are: it lacks
        acknowledged records."""
        closing = self._closing  # flushes run one at a time: an answered one is this one
        if closing is not None:
            await asyncio.shield(closing)
        if self.stalled is not None:
            raise Unavailable(f"{self.stalled}; reads wait for it too, retry")

    def busy(self) -> bool:
        return (self._open is not None and not self._open.closed) or self._closing is not None

    def run_sync(self, fn: Callable[[lmdb.Transaction], T]) -> T:
        """Unlogged (derived) work in its own committed transaction, outside any batch:
        for tests and start-up, called while the event loop is not running. From the loop,
        while batches may be in flight, use :meth:`run` instead."""
        b = self._open
        if b is not None and not b.closed and not b.aborted and not b.members:
            # a batch nobody waits for (its requests were refused) whose flush is still
            # scheduled: commit it now, it holds at most unlogged derived changes
            assert not b.records
            b.closed = True
            self._thread.submit(self._commit_txn, b.txn).result()
            self._committed()
            if not b.done.done():
                b.done.set_result(None)
        if self._closing is not None and not (self._open and not self._open.closed):
            # a flush whose requests were answered once durable may still be committing
            # the index: the commit thread runs in order, so this waits for it
            self._thread.submit(int).result()
        elif self.busy():
            raise RuntimeError("a batch is in flight: use GroupCommit.run from the loop "
                               f"({self._open!r:.300}, closing={self._closing!r})")
        txn = self._take_txn()
        try:
            out = fn(txn)
        except BaseException:
            self._thread.submit(txn.abort).result()
            self.index.freed_pending.clear()
            self.index.reload()
            raise
        self._thread.submit(self._commit_txn, txn).result()
        self._committed()
        return out

    def _committed(self) -> None:
        self.index.freed.extend(self.index.freed_pending)
        self.index.freed_pending.clear()

    def close(self) -> None:
        """Stop; a batch still open (nobody waits for it) is dropped, as a crash would. No
        write transaction outlives this (one would keep the index from closing): the spare
        and the transaction of a flush still on the commit thread are aborted there, after
        that flush (a flush that failed leaves its transaction open, and the loop that
        would abort it may be the caller, waiting here)."""
        self._closed = True
        b = self._open
        if b is not None and not b.closed and not b.aborted:
            b.aborted = True
            self._thread.submit(b.txn.abort).result()
            self.index.freed_pending.clear()
        flushing = self._flushing
        self._drop_spare(also=flushing.txn if flushing is not None else None)
        self._thread.shutdown(wait=True)


def _settle(fut: asyncio.Future[None], like: asyncio.Future[None] | None) -> None:
    """Complete `fut` (if still pending) as `like` completed, or with None."""
    if fut.done():
        return
    if like is not None and like.cancelled():
        fut.cancel()
    elif like is not None and like.exception() is not None:
        fut.set_exception(like.exception())  # type: ignore[arg-type]
    else:
        fut.set_result(None)


def _consume(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()  # a refused batch nobody awaited any more is not an error to log
