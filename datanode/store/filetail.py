"""The data file's tail: the space past LMDB's last page, made ready before the LMDB writer
reaches it (``lmdbenv.py`` asks before each batch).

- **Preallocation**: before a batch that would write past the end of the data file, the
  file grows with ``posix_fallocate`` (by ``prealloc_bytes`` or 1/8 of the data, whichever
  is more). LMDB then overwrites blocks the file already has instead of appending, and an
  ``fdatasync`` of an overwrite does not wait for the filesystem to allocate blocks and
  grow the file (on this project's ext4 machine, appends synced at ~200-600 MB/s and
  overwrites at ~1-2 GB/s). Best effort: it never takes the last
  ``DISK_FULL_SLACK_BYTES`` of the disk or goes past the map's bound, and a failure just
  leaves LMDB to grow the file itself. LMDB ignores the file beyond its last page, and the
  space accounting counts that tail as free.
- **Page-cache prefill** (``prefill.py``): the ``prealloc_bytes`` past LMDB's last page
  are read into the page cache by a background thread, so LMDB's writes of new pages do
  not wait for the kernel to allocate them.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable

from squall.datanode.store.prefill import Prefill

log = logging.getLogger("squall.datanode.lmdb")
DISK_FULL_SLACK_BYTES = 64 << 20  # never preallocated; EIO with less free means disk full


class Tail:
    def __init__(self, path: str, prealloc_bytes: int, max_bytes: int,
                 disk_free: Callable[[], int]) -> None:
        self.file = os.path.join(path, "data.mdb")
        self.prealloc_bytes, self.max_bytes, self.disk_free = prealloc_bytes, max_bytes, disk_free
        self.fd = -1
        self.size = 0  # the file's size as last seen or grown
        self.preallocs = 0  # file extensions so far (a metric)
        self.prefill = Prefill(self.file, prealloc_bytes) if prealloc_bytes > 0 else None

    def open(self) -> None:
        """After LMDB opened (or reopened) the file."""
        if self.fd < 0:
            self.fd = os.open(self.file, os.O_RDWR | os.O_CLOEXEC)
        self.size = os.fstat(self.fd).st_size

    def free(self, end: int) -> int:
        """Bytes reserved past `end` (LMDB's last page): free space, already allocated."""
        return max(0, self.size - end)

    def ahead_of(self, end: int, nbytes: int) -> None:
        """Writer thread, before a batch of `nbytes` when LMDB's data ends at `end`: room
        for the batch reserved, and the pages past `end` on their way into the cache."""
        self._reserve(end, nbytes)
        if self.prefill is not None:
            self.prefill.ahead_of(end, self.size)

    def _reserve(self, end: int, nbytes: int) -> None:
        if self.prealloc_bytes <= 0 or self.fd < 0:
            return
        need = end + nbytes + nbytes // 16 + (1 << 20)  # page headers, branch pages, meta
        if need <= self.size:
            return
        with contextlib.suppress(OSError):
            self.size = os.fstat(self.fd).st_size  # LMDB may have grown it itself
        if need <= self.size:
            return
        grow = max(need - self.size, self.prealloc_bytes, end // 8)
        grow = min(grow, self.disk_free() - DISK_FULL_SLACK_BYTES, self.max_bytes - self.size)
        if grow < need - self.size:
            return  # no room to spare: LMDB meets the full disk itself, as without this
        try:
            os.posix_fallocate(self.fd, self.size, grow)
        except OSError as e:
            log.debug("preallocation of %d bytes failed: %s", grow, e)
            return
        self.size += grow
        self.preallocs += 1

    def close(self) -> None:
        """After the writer stopped."""
        if self.prefill is not None:
            self.prefill.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
