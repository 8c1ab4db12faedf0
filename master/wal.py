"""The master's write-ahead log: segment files of checksummed, length-framed records.

Directory layout::

    <wal_dir>/wal-<first ticket, 20 digits>.log     segments, in ticket order

Segment file::

    b"SQWAL001"                                    8-byte magic and format version
    frame*

Frame (little-endian)::

    u32 body_len | u32 crc32c(ticket_le64 + body) | u64 ticket | body (body_len bytes)

``body`` is a msgpack list of ops (see ``index.py``). Tickets strictly increase across
frames and segments (gaps are allowed: a ticket applied to LMDB whose frame never reached
the file before a crash is skipped, never reused).

Durability: :meth:`WAL.append` only queues a frame. One writer thread takes *every* frame
queued at that moment, writes them with one ``write`` and makes them durable with one
``fdatasync`` (group commit), then wakes all their waiters. A request is answered only
after :meth:`WAL.durable` returns for its ticket. The master's group commit uses
:meth:`WAL.write_group` instead: it writes and syncs one group on the calling thread (the
index's commit thread, which commits the index right after), so a group costs one thread
hop, not three. Both paths write under one lock, in ticket order.

Recovery (:func:`read_records`) reads segments in order and stops at the first frame that
is short, fails its checksum or does not increase the ticket. In the last segment that is
a torn or corrupt tail: the file is truncated there and appending resumes. In an earlier
segment it is corruption of acknowledged data, and :class:`WALCorrupt` is raised rather
than silently dropping everything after it.

Failures: a write that fails (e.g. ENOSPC) is truncated away, its group's waiters get
:class:`WALFailed`, and every append is refused until :meth:`WAL.retry` manages to write and
sync a probe record (an empty op list: replaying it changes nothing) with at least 1 MiB, or
four times the failed group, free on the disk; then appending resumes.
A failed ``fdatasync`` is different: the kernel may have dropped the dirty pages, so what the
file holds is unknown; the log stays failed and :meth:`WAL.failure` says a restart is needed.

Checkpoint (:meth:`WAL.drop_through`): once the LMDB index is synced with every ticket up
to T applied, segments whose records are all <= T are deleted. The current segment is
rolled first when it is large, so the log stays bounded by the checkpoint interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import google_crc32c

MAGIC = b"SQWAL001"
_HDR = struct.Struct("<IIQ")
_TICKET = struct.Struct("<Q")
MAX_RECORD_BYTES = 256 << 20


class WALCorrupt(RuntimeError):
    """A frame before the last segment is damaged: acknowledged records would be lost."""


class WALFailed(RuntimeError):
    """The log could not be written: the records of the failed group are not durable."""


PROBE_BODY = b"\x90"  # msgpack of an empty op list
RESUME_FREE_BYTES_MIN = 1 << 20  # after a failed write, resume once this much is free


def _crc(ticket: int, body: bytes) -> int:
    return google_crc32c.extend(google_crc32c.value(_TICKET.pack(ticket)), body)


def encode_frame(ticket: int, body: bytes) -> bytes:
    return _HDR.pack(len(body), _crc(ticket, body), ticket) + body


def _segments(wal_dir: str) -> list[tuple[int, str]]:
    out = []
    for name in os.listdir(wal_dir):
        if name.startswith("wal-") and name.endswith(".log"):
            out.append((int(name[4:-4]), os.path.join(wal_dir, name)))
    return sorted(out)


@dataclass
class Tail:
    """Where recovery stopped: the last good ticket and the byte offset to append at."""

    last_ticket: int
    path: str | None
    offset: int


def _read_segment(path: str, prev: int) -> tuple[list[tuple[int, bytes]], int, bool]:
    """Frames of one segment: (records, good_end_offset, clean)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[: len(MAGIC)] != MAGIC:
        return [], 0, len(data) == 0
    pos = len(MAGIC)
    out: list[tuple[int, bytes]] = []
    while pos < len(data):
        if pos + _HDR.size > len(data):
            return out, pos, False
        n, crc, ticket = _HDR.unpack_from(data, pos)
        end = pos + _HDR.size + n
        if n > MAX_RECORD_BYTES or end > len(data) or ticket <= prev:
            return out, pos, False
        body = data[pos + _HDR.size : end]
        if _crc(ticket, body) != crc:
            return out, pos, False
        out.append((ticket, body))
        prev, pos = ticket, end
    return out, pos, True


def read_records(wal_dir: str, after: int = 0) -> tuple[list[tuple[int, bytes]], Tail]:
    """Every intact record with ticket > `after`, and the tail to resume appending at.

    Truncates a torn or corrupt tail of the last segment; raises :class:`WALCorrupt` when
    damage is followed by more log.
    """
    segs = _segments(wal_dir)
    records: list[tuple[int, bytes]] = []
    prev, tail = 0, Tail(0, None, 0)
    for i, (_, path) in enumerate(segs):
        recs, end, clean = _read_segment(path, prev)
        if recs:
            prev = recs[-1][0]
        records.extend(r for r in recs if r[0] > after)
        # an empty file is a clean start only as the last segment: a segment's magic is
        # fsynced before the next one is created, so an empty one before it lost records
        if not clean or (end == 0 and i != len(segs) - 1):
            if i != len(segs) - 1:
                raise WALCorrupt(
                    f"WAL segment {path} is damaged at byte {end} and later segments exist; "
                    "refusing to start (restore the data directory from a backup)"
                )
            with open(path, "r+b") as f:
                if end == 0:
                    f.write(MAGIC)
                    end = len(MAGIC)
                f.truncate(end)
                os.fsync(f.fileno())
        tail = Tail(prev, path, end)
    return records, tail


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
        self._cv = threading.Condition()
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
        if tail.path is None:
            tail = Tail(tail.last_ticket, self._new_segment_path(tail.last_ticket + 1), 0)
        self._fd = os.open(tail.path or "", os.O_WRONLY | os.O_CREAT, 0o644)
        self._path = tail.path or ""
        if tail.offset == 0:
            os.write(self._fd, MAGIC)
            os.fsync(self._fd)
            self._fsync_dir()
            self._size = len(MAGIC)
        else:
            self._size = tail.offset
        os.lseek(self._fd, self._size, os.SEEK_SET)
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
            self._cv.notify()

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
            self._cv.notify()
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
                    self._cv.wait()
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
                os.lseek(self._fd, start, os.SEEK_SET)
                os.fdatasync(self._fd)
            except OSError as e2:
                self._fatal = True
                return (f"WAL write failed ({e}) and the torn write could not be cut off "
                        f"({e2}): restart the master once the disk is fixed")
            self._resume_free_bytes = max(RESUME_FREE_BYTES_MIN, 4 * len(data))
            return f"WAL write failed ({e.strerror or e}): the disk refused {len(data)} bytes"
        self._size += len(data)
        t1 = time.perf_counter()
        if self.fsync:
            try:
                self._os_fdatasync(self._fd)
            except OSError as e:
                self.failures += 1
                self._fatal = True
                with contextlib.suppress(OSError):  # best effort: the group was refused
                    os.ftruncate(self._fd, start)
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
        path = self._new_segment_path(first)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
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

    # -- checkpoint ------------------------------------------------------------------------
    def drop_through(self, ticket: int) -> int:
        """Delete segments whose records all have tickets <= `ticket`. Returns how many."""
        segs = _segments(self.dir)
        dropped = 0
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
        return len(_segments(self.dir))

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout=30)
        with contextlib.suppress(OSError):
            os.close(self._fd)
