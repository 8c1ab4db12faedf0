"""The master's write-ahead log: appending, group commit, failures and checkpoints. The
format of its segment files and reading them back at start-up are in ``walfile.py``.

Tickets strictly increase across frames and segments (gaps are allowed: a ticket applied to
LMDB whose frame never reached the file before a crash is skipped, never reused).

Durability: :meth:`WAL.append` only queues a frame. One writer thread takes *every* frame
queued at that moment, writes them with one ``write`` and makes them durable with one
``fdatasync`` (group commit), then wakes all their waiters. A request is answered only
after :meth:`WAL.durable` returns for its ticket. The master's group commit uses
:meth:`WAL.write_group` instead: it writes and syncs one group on the calling thread (the
index's commit thread, which commits the index right after), so a group costs one thread
hop, not three. Both paths write under one lock, in ticket order.

Failures: a write that fails (e.g. ENOSPC) is truncated away, its group's waiters get
:class:`WALFailed`, and every append is refused until :meth:`WAL.retry` manages to write and
sync a probe record (an empty op list: replaying it changes nothing) with at least 1 MiB, or
four times the failed group, free on the disk; then appending resumes.
A failed ``fdatasync`` is different: the kernel may have dropped the dirty pages, so what the
file holds is unknown; the log stays failed and :meth:`WAL.failure` says a restart is needed.

Preallocation: a segment is extended with zeros ``PREALLOC_BYTES`` at a time, ahead of the
groups written into it, so a group's ``fdatasync`` flushes data only: appending instead grows
the file, and ext4 then commits its journal (the new size) in every ``fdatasync`` too, one
more disk flush and thread switch per group (measured: ~30-80 µs more per sync here). As
PostgreSQL zero-fills its WAL segments, and for the same reason: zeros, not ``fallocate``,
whose unwritten extents would need a journal commit when first written. The zeros past
the last group end recovery as a torn tail does (a zero header is no frame) and are cut off
there; a rolled segment and a closed log are cut to their last frame, so only the last
segment of a crashed master has such a tail.

Checkpoint (:meth:`WAL.drop_through`): once the LMDB index is synced with every ticket up
to T applied, segments whose records are all <= T are deleted. The current segment is
rolled first when it is large, so the log stays bounded by the checkpoint interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable

from squall.master.storage.walfile import MAGIC, Tail, encode_frame, frame_ends, segments


class WALFailed(RuntimeError):
    """The log could not be written: the records of the failed group are not durable."""


PROBE_BODY = b"\x90"  # msgpack of an empty op list
RESUME_FREE_BYTES_MIN = 1 << 20  # after a failed write, resume once this much is free
PREALLOC_BYTES = 1 << 20  # zeros written ahead of the groups (see the module's docstring)


class WAL:
    """Append-only log with group commit. `append` from the event loop; one writer thread."""

    # the system calls that can fail, as attributes so that tests can inject disk errors
    _os_write = staticmethod(os.write)
    _os_fdatasync = staticmethod(os.fdatasync)

    def __init__(self, wal_dir: str, tail: Tail, *, segment_bytes: int = 64 << 20,
                 fsync: bool = True) -> None:
        self.dir = wal_dir
        self.segment_bytes = segment_bytes
        self.fsync = fsync
        self.last_ticket = tail.last_ticket  # last ticket handed to append()
        self.durable_ticket = tail.last_ticket
        self.syncs = 0  # fdatasync calls, for metrics
        self.records = 0
        # metrics hook, called on the writer thread: (write secs, fdatasync secs, records)
        self.on_write: Callable[[float, float, int], None] | None = None
        # one lock, two conditions: `_cv` wakes who waits for a group to be written (durable,
        # flush, write_group), `_work` wakes the writer thread when appends are queued. A
        # group written by write_group then wakes no idle writer thread (a switch and a GIL
        # handover per group on a master serving one request at a time).
        lock = threading.RLock()
        self._cv = threading.Condition(lock)
        self._work = threading.Condition(lock)
        self._writing = False  # a group is being written (by the writer thread or a caller)
        self._pending: list[bytes] = []
        self._pending_last = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._roll_requested = False
        self._error: str | None = None  # why appends are refused, or None
        self._fatal = False  # a failed fdatasync: only a restart can tell what is durable
        self.failures = 0  # failed writes or syncs, for metrics
        self._resume_free_bytes = RESUME_FREE_BYTES_MIN
        # the first segment's first ticket, known while only this object adds and drops
        # segments (None: list the directory; a journal asks for the floor on every append)
        self._first: int | None = None
        if tail.path is None:
            tail = Tail(tail.last_ticket, self._new_segment_path(tail.last_ticket + 1), 0)
        self._fd = os.open(tail.path or "", os.O_WRONLY | os.O_CREAT, 0o600)
        self._path = tail.path or ""
        if tail.offset == 0:
            os.write(self._fd, MAGIC)
            os.fsync(self._fd)
            self._fsync_dir()
            self._size = len(MAGIC)
        else:
            self._size = tail.offset
        os.lseek(self._fd, self._size, os.SEEK_SET)
        self._alloc = max(self._size, os.fstat(self._fd).st_size)  # zeros end here
        self._thread = threading.Thread(target=self._run, name="wal-writer", daemon=True)
        self._thread.start()

    def _new_segment_path(self, first: int) -> str:
        return os.path.join(self.dir, f"wal-{first:020d}.log")

    def _fsync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- producer side (event loop thread) -------------------------------------------------
    def next_ticket(self) -> int:
        return self.last_ticket + 1

    def append(self, ticket: int, body: bytes) -> None:
        """Queue one record. Tickets must increase. Durable once `durable(ticket)` returns."""
        self.append_many([(ticket, body)])

    def _increasing(self, records: list[tuple[int, bytes]]) -> int:
        last = self.last_ticket
        for ticket, _ in records:
            if ticket <= last:
                raise ValueError(f"ticket {ticket} does not increase past {last}")
            last = ticket
        return last

    def write_group(self, records: list[tuple[int, bytes]]) -> None:
        """Write and fdatasync `records` as one group on the calling thread; return once
        they are durable. Raises :class:`WALFailed` (the group is cut off the file, nothing
        of it is durable) like a failed :meth:`append_many` group would."""
        last = self._increasing(records)
        frames = [encode_frame(t, b) for t, b in records]
        with self._cv:
            while (self._pending or self._writing) and self._error is None:
                self._cv.wait(0.5)  # queued appends go first: tickets stay in file order
            if self._error is not None:
                raise WALFailed(self._error)
            self.last_ticket = last
            self._writing = True
        error = self._write(frames, last)
        self._settle(last, error)
        if error is not None:
            raise WALFailed(error)

    def append_many(self, records: list[tuple[int, bytes]]) -> None:
        """Queue records that the writer will write as one group (all durable or none)."""
        last = self._increasing(records)
        frames = [encode_frame(t, b) for t, b in records]
        with self._cv:
            if self._error is not None:
                raise WALFailed(self._error)
            self._pending.extend(frames)
            self._pending_last = last
            self.last_ticket = last
            self._work.notify()

    async def durable(self, ticket: int) -> None:
        """Return once every record up to `ticket` is fsynced."""
        if ticket <= self.durable_ticket:
            return
        loop = asyncio.get_running_loop()
        self._loop = loop
        fut: asyncio.Future[None] = loop.create_future()
        with self._cv:
            if ticket <= self.durable_ticket:
                return
            if self._error is not None:
                raise WALFailed(self._error)
            self._waiters.append((ticket, fut))
        await fut

    def flush(self) -> None:
        """Block until everything appended so far is durable (for sync callers and shutdown)."""
        target = self.last_ticket
        with self._cv:
            self._work.notify()
            while self.durable_ticket < target and self._error is None:
                self._cv.wait(0.5)
        if self._error is not None:
            raise WALFailed(self._error)

    def failure(self) -> str | None:
        """Why the log refuses appends right now, or None when it is healthy."""
        return self._error

    # -- writer thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cv:
                while (not self._pending or self._writing) and not self._closed:
                    self._work.wait()
                if not self._pending and self._closed:
                    return
                frames, last = self._pending, self._pending_last
                self._pending = []
                self._writing = True
            self._settle(last, self._write(frames, last))

    def _settle(self, last: int, error: str | None) -> None:
        with self._cv:
            self._writing = False
            if error is None:
                self.durable_ticket = max(self.durable_ticket, last)
            else:
                self._error, self.last_ticket = error, self.durable_ticket
                self._pending = []  # appended after the failed group: refused with it
            self._cv.notify_all()
            if self._pending:  # queued while a write_group wrote: the writer's turn
                self._work.notify()
            wake = bool(self._waiters)
        if wake:  # only durable() callers wait on the loop (a GroupCommit is told itself)
            self._wake(error)

    def _write(self, frames: list[bytes], last: int) -> str | None:
        """Write and sync one group. On failure, cut it off the file and say why."""
        t0 = time.perf_counter()
        data = b"".join(frames)
        start = self._size
        try:
            view = memoryview(data)
            while view:
                n = self._os_write(self._fd, view)
                view = view[n:]
        except OSError as e:
            self.failures += 1
            try:  # shrinking needs no space: the log ends where the last good group ended
                os.ftruncate(self._fd, start)
                self._alloc = start
                os.lseek(self._fd, start, os.SEEK_SET)
                os.fdatasync(self._fd)
            except OSError as e2:
                self._fatal = True
                return (f"WAL write failed ({e}) and the torn write could not be cut off "
                        f"({e2}): restart the master once the disk is fixed")
            self._resume_free_bytes = max(RESUME_FREE_BYTES_MIN, 4 * len(data))
            return f"WAL write failed ({e.strerror or e}): the disk refused {len(data)} bytes"
        self._size += len(data)
        if self._size > self._alloc:
            self._preallocate()
        t1 = time.perf_counter()
        if self.fsync:
            try:
                self._os_fdatasync(self._fd)
            except OSError as e:
                self.failures += 1
                self._fatal = True
                with contextlib.suppress(OSError):  # best effort: the group was refused
                    os.ftruncate(self._fd, start)
                    self._alloc = start
                    os.fdatasync(self._fd)
                return (f"WAL fdatasync failed ({e.strerror or e}): what the log holds is "
                        "unknown; restart the master once the disk is fixed")
        self.syncs += 1
        self.records += len(frames)
        if self.on_write is not None:
            self.on_write(t1 - t0, time.perf_counter() - t1, len(frames))
        if self._size >= self.segment_bytes or self._roll_requested:
            try:
                self._roll(last + 1)
                self._roll_requested = False
            except OSError:  # keep appending to the current segment; roll again later
                self.failures += 1
        return None

    def _preallocate(self) -> None:
        """Zeros from the log's end to the next PREALLOC_BYTES boundary past it, synced with
        the group just written. Best effort: a disk that refuses them only costs speed."""
        end = (self._size // PREALLOC_BYTES + 1) * PREALLOC_BYTES
        with contextlib.suppress(OSError):
            self._alloc = self._size + os.pwrite(self._fd, bytes(end - self._size), self._size)

    def _cut_to_size(self) -> None:
        """Drop the zeros past the last group (a segment that is done growing)."""
        if self._alloc > self._size:
            os.ftruncate(self._fd, self._size)
            self._alloc = self._size

    def retry(self) -> bool:
        """After a failed write: write and sync a probe record; on success the log accepts
        appends again. Call from a worker thread, never while appends may race (the master
        refuses writes while the log is failed). Returns whether the log is healthy."""
        with self._cv:
            if self._error is None:
                return True
            if self._fatal or self._pending:
                return False
            ticket = self.durable_ticket + 1
        st = os.statvfs(self.dir)
        if st.f_bavail * st.f_frsize < self._resume_free_bytes:
            return False  # a probe would fit in the space the torn group left: no flapping
        err = self._write([encode_frame(ticket, PROBE_BODY)], ticket)
        with self._cv:
            if err is None:
                self.durable_ticket = self.last_ticket = ticket
                self._error = None
            elif self._fatal:
                self._error = err
        return err is None

    def _roll(self, first: int) -> None:
        # cut to its last frame for good first: recovery takes a zero tail only as the end
        # of the *last* segment, and any damage before later segments as corruption
        self._cut_to_size()
        if self.fsync:
            os.fdatasync(self._fd)
        path = self._new_segment_path(first)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, MAGIC)
            os.fsync(fd)
            self._fsync_dir()
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        os.close(self._fd)
        self._fd, self._path, self._size = fd, path, len(MAGIC)
        self._alloc = self._size

    def _wake(self, error: str | None = None) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # loop closed under us at shutdown
            loop.call_soon_threadsafe(self._release, error)

    def _release(self, error: str | None) -> None:
        while self._waiters and (error is not None or self._waiters[0][0] <= self.durable_ticket):
            ticket, fut = self._waiters.popleft()
            if fut.done():
                continue
            if ticket <= self.durable_ticket:
                fut.set_result(None)
            else:
                fut.set_exception(WALFailed(error or "WAL write failed"))

    # -- a master set's journal (master/ha/journal.py) --------------------------------------
    def _quiet(self) -> None:
        """Under the lock: wait until no group is being written or queued."""
        while (self._pending or self._writing) and self._error is None:
            self._cv.wait(0.5)

    @property
    def floor(self) -> int:
        """Records with tickets <= floor may be gone (dropped by checkpoints)."""
        first = self._first
        if first is None:
            with self._cv:  # not while a checkpoint or a truncation changes the segments
                segs = segments(self.dir)
                if not segs:
                    return self.last_ticket
                first = self._first = segs[0][0]
        return first - 1

    def read_after(self, after: int, max_records: int, max_bytes: int
                   ) -> list[tuple[int, bytes]]:
        """Durable records with tickets > `after`, at most `max_records` and about
        `max_bytes` (at least one)."""
        with self._cv:
            self._quiet()
            segs = segments(self.dir)
            start = 0
            for i, (first, _) in enumerate(segs):
                if first <= after + 1:
                    start = i
            out: list[tuple[int, bytes]] = []
            size = 0
            for _, path in segs[start:]:
                recs, _end = frame_ends(path, self.durable_ticket)
                for t, b in recs:
                    if t <= after:
                        continue
                    if len(out) >= max_records or (out and size + len(b) > max_bytes):
                        return out
                    out.append((t, b))
                    size += len(b)
            return out

    def truncate_after(self, ticket: int) -> None:
        """Cut every record with a ticket > `ticket` off the log, durably (a journal whose
        tail a new leader did not keep). Appending resumes after the last kept record."""
        with self._cv:
            self._quiet()
            if self._error is not None:
                raise WALFailed(self._error)
            if ticket >= self.last_ticket:
                return
            segs = segments(self.dir)
            keep = [(f, p) for f, p in segs if f <= ticket + 1]
            os.close(self._fd)
            self._first = None  # (a new segment may replace the first one)
            for f, p in segs:
                if f > ticket + 1:
                    os.unlink(p)
            if keep:
                _, path = keep[-1]
                recs, end = frame_ends(path, ticket)
                last = recs[-1][0] if recs else keep[-1][0] - 1
                fd = os.open(path, os.O_WRONLY)
                os.ftruncate(fd, max(end, len(MAGIC)))
                os.fsync(fd)
            else:
                path = self._new_segment_path(ticket + 1)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, MAGIC)
                os.fsync(fd)
                end, last = len(MAGIC), ticket
            self._fsync_dir()
            self._fd, self._path = fd, path
            self._size = self._alloc = max(end, len(MAGIC))
            os.lseek(self._fd, self._size, os.SEEK_SET)
            self.last_ticket = self.durable_ticket = last

    # -- checkpoint ------------------------------------------------------------------------
    def drop_through(self, ticket: int) -> int:
        """Delete segments whose records all have tickets <= `ticket`. Returns how many."""
        with self._cv:  # not while read_after reads them
            segs = segments(self.dir)
            dropped = 0
            self._first = None
            for (_, path), (nxt_first, _) in itertools.pairwise(segs):
                if nxt_first - 1 <= ticket and path != self._path:
                    os.unlink(path)
                    dropped += 1
            if dropped:
                self._fsync_dir()
            return dropped

    def request_roll(self) -> None:
        """Start a new segment after the next write, so a checkpoint can drop this one."""
        self._roll_requested = True

    def segment_count(self) -> int:
        return len(segments(self.dir))

    def disk_bytes(self) -> int:
        """The size of the segment files (a checkpoint's question: cheap, a directory
        listing and a stat per segment)."""
        total = 0
        for _, path in segments(self.dir):
            with contextlib.suppress(FileNotFoundError):
                total += os.path.getsize(path)
        return total

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
            self._work.notify_all()
        self._thread.join(timeout=30)
        with self._cv, contextlib.suppress(OSError):
            if not self._writing:  # no group is being written (none can start meanwhile)
                self._cut_to_size()  # a clean stop leaves the segment exact
        with contextlib.suppress(OSError):
            os.close(self._fd)
