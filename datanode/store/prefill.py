"""Page-cache prefill: the file pages LMDB writes next are cached before it writes them.

A write into a file page that is not in the page cache first allocates that page. On the
project's test machine, a virtual machine whose host backs guest memory on first touch,
that allocation is most of the cost of writing new data: ``pwrite`` of 4 MiB into new
pages of a file took 3-10 ms of system time, into cached pages ~0.6 ms; a 4 MiB
write + ``fdatasync`` 7.6 ms against 2.5 ms. A data node that takes new blobs writes new
pages all the time (LMDB's file grows into its preallocated tail), and the writer does so
with clients waiting on the sync.

So the writer asks a :class:`Prefill` thread, before each batch, to have the file's
pages from LMDB's last page up to ``window`` bytes past it in the page cache: the thread
reads them (1 MiB at a time, into one reused buffer) while the writer is idle or syncing.
The tail is preallocated space (``posix_fallocate``: unwritten extents), so those reads
do no disk I/O; the kernel fills the pages with zeros and keeps them, clean. LMDB's later
write then lands on a cached page. Bounded: at most ``window`` bytes ahead (the
preallocation size, 64 MiB by default; clean pages the kernel may drop under memory
pressure), one thread, one buffer; a read error stops it (the writer is unaffected).
The cost, not measured on other hardware: where memory is backed up front, the thread
spends a zero-fill and a copy per page, off the synced path, and saves the writer only
the page's allocation.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

log = logging.getLogger("squall.datanode")
STEP = 1 << 20


class Prefill:
    def __init__(self, path: str, window: int) -> None:
        self.path, self.window = path, window
        self.bytes = 0  # read ahead so far (a metric)
        self._done = self._want = 0  # cached up to / asked up to (file offsets)
        self._cv = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def ahead_of(self, end: int, file_size: int) -> None:
        """Writer thread: LMDB's data ends at `end`, the file at `file_size`; have the
        pages in between, up to ``window`` past `end`, cached."""
        want = min(end + self.window, file_size)
        with self._cv:
            if self._stopped or want <= self._want:
                return
            self._done, self._want = max(self._done, end), want
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="lmdb-prefill",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as e:
            log.debug("page-cache prefill off: %s", e)
            return
        buf = memoryview(bytearray(STEP))
        try:
            while True:
                with self._cv:
                    while not self._stopped and self._done >= self._want:
                        self._cv.wait()
                    if self._stopped:
                        return
                    at, n = self._done, min(STEP, self._want - self._done)
                got = os.preadv(fd, [buf[:n]], at)
                with self._cv:
                    self._done = max(self._done, at + got)
                    self.bytes += got
                    if got < n:  # the file ends sooner than announced: wait to be asked
                        self._want = self._done
        except OSError as e:
            log.warning("page-cache prefill stopped: %s", e)
        finally:
            os.close(fd)

    def close(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            with contextlib.suppress(RuntimeError):
                thread.join(10)
