"""The data node's LMDB environment: one writer thread that group-commits, a reader gate,
map growth, and the translation of storage failures into squall errors.

- Opened without ``writemap`` (a full disk then fails a ``write()`` cleanly instead of
  raising SIGBUS on a mapped page), with ``sync=True, metasync=False``: every commit
  fdatasyncs its data pages; a batch holding any write that will be acknowledged is
  followed by ``env.sync(True)`` before anyone is told it is durable.
- **Group commit**: callers :meth:`Env.submit` functions of a write transaction. The writer
  thread takes every function queued at that moment (up to ``batch_ops_max`` /
  ``batch_bytes_max``), runs each in a nested transaction (an op that raises is rolled back
  alone), commits once and syncs once for all of them.
- **Repair waits behind clients**: ops submitted with ``background=True`` (re-replication
  copies a peer sends) queue apart. The writer takes them only when no client op is queued,
  never in one transaction with client ops, and at most ``BACKGROUND_BATCH_BYTES`` at a
  time, so a client's write waits for at most one small repair commit, not for every copy
  queued before it. Each record counts ``RECORD_COST_BYTES`` on top of its size there: a
  commit of 4,000 1 KiB copies held the GIL for ~60 ms of Python work, and the event loop's
  requests waited for it in 5 ms turns. A background op queued for
  ``BACKGROUND_MAX_WAIT_S`` goes next anyway: repair slows under a steady client load, it
  never stops.
- ``MapFullError`` aborts the batch; the map doubles up to ``map_size_max`` and the batch is
  retried. At the bound, or on any other storage error, the ops are retried one by one so
  that one oversized write does not fail its neighbours; those that still fail get
  :class:`InsufficientStorage` (map bound or disk full) or :class:`Unavailable`
  (read-only or I/O error). A full disk shows up as a short ``write()`` that LMDB reports as
  EIO, so EIO with little free space left counts as "disk full".
- **The file's tail** (``filetail.py``): before each batch the writer has room for it
  preallocated in the data file (``posix_fallocate``) and the ``prealloc_bytes`` past
  LMDB's last page read into the page cache, so LMDB overwrites allocated blocks and
  cached pages instead of growing the file.
- Read transactions are short (one record) and pass through a gate, so that growing the map
  or reopening after a panic can wait until no transaction is open in this process.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import lmdb

from squall.common.errors import InsufficientStorage, StatusError, Unavailable
from squall.common.security.files import FILE_MODE, private_dir
from squall.datanode.store.filetail import DISK_FULL_SLACK_BYTES, Tail

log = logging.getLogger("squall.datanode.lmdb")
_OPEN_PATHS: set[str] = set()  # LMDB: one environment per path per process
_OPEN_LOCK = threading.Lock()


BACKGROUND_BATCH_BYTES = 4 << 20  # background data per transaction
BACKGROUND_MAX_WAIT_S = 0.5  # a background op waits behind client ops at most this long
RECORD_COST_BYTES = 16 << 10  # per-record work, as bytes (≤ 256 small copies a commit)


@dataclass(slots=True)
class _Op:
    fn: Callable[[lmdb.Transaction], Any]
    durable: bool
    nbytes: int
    future: Future[Any] = field(default_factory=Future)
    queued_at: float = 0.0


class Env:
    def __init__(self, path: str, dbs: tuple[bytes, ...], map_size: int, map_size_max: int,
                 batch_ops_max: int = 2000, batch_bytes_max: int = 32 << 20,
                 prealloc_bytes: int = 64 << 20) -> None:
        private_dir(path)
        self.path = path
        self._real = os.path.realpath(path)
        with _OPEN_LOCK:
            if self._real in _OPEN_PATHS:
                raise RuntimeError(f"LMDB environment {path} is already open in this process")
            _OPEN_PATHS.add(self._real)
        self.db_names = dbs
        self.map_size_max = max(map_size_max, map_size)
        self.batch_ops_max, self.batch_bytes_max = batch_ops_max, batch_bytes_max
        self.commits = self.syncs = self.ops = self.failures = 0
        self.background_ops = 0  # of `ops`: repair copies, written behind client writes
        self.ops_seconds = self.commit_seconds = self.sync_seconds = 0.0  # writer thread time
        self.tail = Tail(path, prealloc_bytes, self.map_size_max, self.disk_free)
        self.env: lmdb.Environment
        self.dbs: dict[bytes, Any] = {}
        try:
            self._open(map_size)
        except BaseException:
            with _OPEN_LOCK:
                _OPEN_PATHS.discard(self._real)
            raise
        self._gate = threading.Condition()
        self._readers = 0
        self._exclusive = False
        self._queue: deque[_Op | None] = deque()
        self._background: deque[_Op] = deque()
        self._qcond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="lmdb-writer", daemon=True)
        self._thread.start()

    def _open(self, map_size: int) -> None:
        self.env = lmdb.open(self.path, map_size=map_size, max_dbs=len(self.db_names) + 2,
                             writemap=False, sync=True, metasync=False, max_readers=256,
                             mode=FILE_MODE)
        self.dbs = {n: self.env.open_db(n) for n in self.db_names}
        self._psize = int(self.env.stat()["psize"])
        self.tail.open()

    @property
    def map_size(self) -> int:
        return int(self.env.info()["map_size"])

    # -- reads -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def read(self, buffers: bool = False) -> Iterator[lmdb.Transaction[Any]]:
        """A short read transaction (keep it to a few records: no long-lived readers). With
        `buffers`, values are memoryviews into the map, valid only inside the block."""
        with self._gate:
            while self._exclusive:
                self._gate.wait()
            self._readers += 1
        yield from self._counted_read(buffers)

    @contextlib.contextmanager
    def read_now(self, buffers: bool = False) -> Iterator[lmdb.Transaction[Any] | None]:
        """As :meth:`read`, for the event loop: never waits. The block gets None (read on a
        thread instead) when the map is being resized or the gate is held meanwhile."""
        ok = self._gate.acquire(blocking=False)
        if ok:
            ok = not self._exclusive
            self._readers += ok
            self._gate.release()
        if not ok:
            yield None
            return
        yield from self._counted_read(buffers)

    def _counted_read(self, buffers: bool) -> Iterator[lmdb.Transaction[Any]]:
        """The read transaction of :meth:`read` and :meth:`read_now`, whose reader is
        counted already: uncounted when it ends (a resize waits for none left)."""
        try:
            txn = self.env.begin(buffers=True) if buffers else self.env.begin()
            with txn:
                yield txn
        finally:
            with self._gate:
                self._readers -= 1
                if not self._readers:
                    self._gate.notify_all()

    @contextlib.contextmanager
    def _alone(self) -> Iterator[None]:
        with self._gate:
            self._exclusive = True
            while self._readers:
                self._gate.wait()
        try:
            yield
        finally:
            with self._gate:
                self._exclusive = False
                self._gate.notify_all()

    def extent_bytes(self) -> int:
        """Bytes of the data file LMDB uses: up to its last page."""
        return (int(self.env.info()["last_pgno"]) + 1) * self._psize

    def file_bytes(self) -> int:
        try:
            st = os.stat(os.path.join(self.path, "data.mdb"))
        except OSError:
            return 0
        return min(st.st_size, st.st_blocks * 512 if st.st_blocks else st.st_size,
                   self.extent_bytes())

    def prealloc_tail(self) -> int:
        """Preallocated bytes past LMDB's last page (free space, already reserved)."""
        return self.tail.free(self.extent_bytes())

    def free_pages_bytes(self) -> int:
        """Bytes inside the file that LMDB can reuse (file pages no database uses)."""
        info = self.env.info()
        with self.read() as txn:
            used = sum(_pages(txn.stat(db)) for db in self.dbs.values()) + _pages(txn.stat())
        psize = int(self.env.stat()["psize"])
        return max(0, (int(info["last_pgno"]) + 1 - used - 2) * psize)

    def disk_free(self) -> int:
        try:
            return int(shutil.disk_usage(self.path).free)
        except OSError:
            return 0

    # -- writes ----------------------------------------------------------------------------
    def submit(self, fn: Callable[[lmdb.Transaction], Any], durable: bool = True,
               nbytes: int = 0, background: bool = False) -> Future[Any]:
        """Queue `fn(txn)` for the writer thread. The future resolves once the transaction is
        committed, and synced when `durable`; it raises what `fn` raised or a StatusError.
        `background`: behind client ops (see "Repair waits behind clients" above)."""
        op = _Op(fn, durable, nbytes, queued_at=time.monotonic() if background else 0.0)
        op.future.set_running_or_notify_cancel()  # it will run: cancelling cannot stop it
        with self._qcond:
            if self._closed:
                raise Unavailable("data node store is closing")
            (self._background if background else self._queue).append(op)
            self._qcond.notify()
        return op.future

    def _take(self) -> list[_Op] | None:
        with self._qcond:
            while not self._queue and not self._background:
                self._qcond.wait()
            bg = self._background
            head = self._queue[0] if self._queue else None  # None: none, or closing
            if bg and (head is None
                       or time.monotonic() - bg[0].queued_at > BACKGROUND_MAX_WAIT_S):
                batch = _pop(bg, self.batch_ops_max, BACKGROUND_BATCH_BYTES)
                self.background_ops += len(batch)
                return batch
            if head is None:
                return None  # closing, after every queued op ran
            return _pop(self._queue, self.batch_ops_max, self.batch_bytes_max)

    def _run(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            try:
                self._execute(batch)
            except BaseException as e:  # never let the writer die with waiters queued
                log.exception("writer thread failure")
                for op in batch:
                    if not op.future.done():
                        op.future.set_exception(_classify(e, self))

    def _execute(self, batch: list[_Op]) -> None:
        self.tail.ahead_of(self.extent_bytes(), sum(op.nbytes for op in batch))
        while True:
            err: BaseException
            try:
                outcomes = self._commit(batch)
            except lmdb.MapFullError as e:
                if self._grow():
                    continue
                err = e
            except Exception as e:  # storage failure: classified below
                err = e
            else:
                self._finish(batch, outcomes)
                return
            if isinstance(err, lmdb.PanicError):
                self._reopen()
            if len(batch) == 1:
                self.failures += 1
                status = _classify(err, self)
                log.warning("write refused (%d %s): %s", status.status, status.code,
                            status.message)
                batch[0].future.set_exception(status)
                return
            for op in batch:  # isolate the op that does not fit
                self._execute([op])
            return

    def _commit(self, batch: list[_Op]) -> list[tuple[bool, Any]]:
        outcomes: list[tuple[bool, Any]] = []
        t0 = time.perf_counter()
        txn = self.env.begin(write=True)
        try:
            for op in batch:
                try:
                    with self.env.begin(write=True, parent=txn) as child:
                        outcomes.append((True, op.fn(child)))
                except lmdb.Error:
                    raise
                except Exception as e:  # the op's own error (e.g. Conflict): only it fails
                    outcomes.append((False, e))
        except BaseException:
            txn.abort()
            raise
        t1 = time.perf_counter()
        txn.commit()  # writes the pages and fdatasyncs them (not the meta page)
        t2 = time.perf_counter()
        self.ops_seconds += t1 - t0
        self.commit_seconds += t2 - t1
        self.commits += 1
        self.ops += len(batch)
        return outcomes

    def _finish(self, batch: list[_Op], outcomes: list[tuple[bool, Any]]) -> None:
        """Sync once for the batch, then resolve every future. A failed sync fails every
        op (committed but not known durable: never acknowledged) without re-running it."""
        if any(op.durable and ok for op, (ok, _) in zip(batch, outcomes, strict=True)):
            t0 = time.perf_counter()
            try:
                self.env.sync(True)  # the meta page: now the commit is durable
            except Exception as e:
                self.failures += 1
                err = _classify(e, self)
                for op in batch:
                    op.future.set_exception(err)
                return
            self.syncs += 1
            self.sync_seconds += time.perf_counter() - t0
        for op, (ok, value) in zip(batch, outcomes, strict=True):
            if ok:
                op.future.set_result(value)
            else:
                op.future.set_exception(value)

    def _grow(self) -> bool:
        size = self.map_size
        if size >= self.map_size_max:
            return False
        new = min(self.map_size_max, size * 2)
        with self._alone():
            self.env.set_mapsize(new)
        log.info("LMDB map grown from %d to %d bytes", size, new)
        return True

    def _reopen(self) -> None:
        with self._alone():
            size = self.map_size
            with contextlib.suppress(lmdb.Error):
                self.env.close()
            try:
                self._open(size)
            except lmdb.Error:
                log.exception("could not reopen the LMDB environment")

    def close(self) -> None:
        with self._qcond:
            if self._closed:
                return
            self._closed = True
            self._queue.append(None)
            self._qcond.notify()
        self._thread.join(60)
        with self._alone():
            self.env.close()
            self.tail.close()
        with _OPEN_LOCK:
            _OPEN_PATHS.discard(self._real)


def _pop(queue: deque[Any], max_ops: int, max_bytes: int) -> list[_Op]:
    """The ops at the head of `queue` up to the bounds (at least one), to the closing mark."""
    batch: list[_Op] = []
    size = 0
    while queue and len(batch) < max_ops:
        op = queue[0]
        if op is None or (batch and size + op.nbytes > max_bytes):
            break
        queue.popleft()
        batch.append(op)
        size += op.nbytes
    return batch


def _pages(stat: Any) -> int:
    return int(stat["branch_pages"]) + int(stat["leaf_pages"]) + int(stat["overflow_pages"])


def _classify(e: BaseException, env: Env) -> StatusError:
    """One storage failure → the squall error a client can act on."""
    if isinstance(e, StatusError):
        return e
    text = str(e)
    if isinstance(e, lmdb.MapFullError):
        return InsufficientStorage(
            f"data node store is full: its map reached the configured bound of "
            f"{env.map_size_max} bytes; free space or raise --map-size-max")
    code = e.errno if isinstance(e, OSError) else None
    if (isinstance(e, lmdb.ReadonlyError) or code in (errno.EROFS, errno.EACCES, errno.EPERM)
            or "Read-only file system" in text or "Permission denied" in text):
        return Unavailable(f"data directory {env.path} is read-only: {text}", retry_after=5)
    free = env.disk_free()
    if (isinstance(e, lmdb.DiskError) or code == errno.ENOSPC or "No space" in text
            or ("Input/output error" in text and free < DISK_FULL_SLACK_BYTES)):
        return InsufficientStorage(f"disk full on {env.path}: {free} bytes free ({text})")
    return Unavailable(f"storage error on {env.path}: {text}", retry_after=1)
