"""A server process's Python runtime: short garbage-collector pauses, full ones rare, and
the event loop's turn at the GIL within 1 ms.

Objects in a server are freed by reference counting; the cyclic collector almost never
finds anything there, but a full collection walks every container object the process
holds, and the event loop waits meanwhile. On the 2-core test machine one took ~45 ms for
the ~80,000 objects a server holds after its imports alone (functions, types, pydantic
schemas), and 40-100 ms under load; during a re-replication of many small blobs the
master and the data nodes each ran one every 1-2 s, and they were the longest stalls of
foreground writes (docs/decisions/0011-server-runtime-tuning.md). So :func:`serve_tuning`, which the
server commands call once the app is built:

- collects once, then ``gc.freeze()``: everything the imports and the app's construction
  made moves to the permanent generation, which collections skip (such objects are still
  freed by reference counting if they ever go);
- keeps Python's young collections (every 700 allocations, each a few milliseconds);
- makes full collections rare: one after ``GEN2`` collections of the middle generation
  instead of 10 (about 700,000 allocations; Python's rule that the long-lived objects
  grew by a quarter still applies), and at least one every ``FULL_EVERY_S`` from a
  timer, so a cycle of long-lived objects that became garbage waits at most that long;
- records each collection's pause in ``squall_gc_pause_seconds{generation}``
  (:func:`metric`) on both servers;
- sets the GIL's switch interval to ``SWITCH_INTERVAL_S`` (Python's is 5 ms). While a
  thread runs Python work (the data node's LMDB writer committing repair copies, a reader
  building a block report, the master's WAL writer), the event loop thread waits for the
  GIL each time it gave it up for I/O: a request doing a dozen such turns waited up to
  5 ms each. 1 ms costs the busy thread a few more switches;
- keeps freed memory for reuse (glibc's ``mallopt``, where there is one): blocks up to
  ``MMAP_MAX_BYTES`` come from the heap instead of their own mappings, and the heap gives
  memory back to the system only beyond ``TRIM_BYTES`` free. Payload buffers of a few
  MiB were mapped and unmapped on every request, and touching the new pages (page faults,
  zeroing) cost more than copying the bytes: ~2 ms of CPU per 4 MiB read in the client's
  stack on the test machine.

Apps embedded in another process (the tests' in-process servers) keep Python's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
import threading
import time
from typing import Any

from squall.common.server.metrics import Hist, hist_text

GEN0 = 700  # allocations (net of frees) between young collections (Python's default)
GEN1 = 10  # young collections between collections of the middle generation (Python's)
GEN2 = 100  # middle collections between full ones (Python's: 10)
FULL_EVERY_S = 60.0
SWITCH_INTERVAL_S = 0.001
MMAP_MAX_BYTES = 32 << 20  # blocks up to this from the heap (glibc: 128 KiB, growing)
TRIM_BYTES = 64 << 20  # free heap kept before giving memory back (glibc: 2x a freed block)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters

PAUSES = tuple(Hist() for _ in range(3))  # per generation
_started: list[float] = []
_tuned = threading.Event()


def _observe(phase: str, info: dict[str, Any]) -> None:
    if phase == "start":
        _started[:] = [time.perf_counter()]
    elif _started:
        PAUSES[info["generation"]].observe(time.perf_counter() - _started[0])


def _full_collections(every_s: float) -> None:
    while True:
        time.sleep(every_s)
        gc.collect()


def serve_tuning(full_every_s: float = FULL_EVERY_S) -> None:
    """Tune this process for serving (idempotent; see the module doc)."""
    if _tuned.is_set():
        return
    _tuned.set()
    gc.callbacks.append(_observe)
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0, GEN1, GEN2)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    keep_freed_memory()
    threading.Thread(target=_full_collections, args=(full_every_s,), name="gc-full",
                     daemon=True).start()


def keep_freed_memory() -> bool:
    """glibc's allocator keeps freed blocks of up to ``MMAP_MAX_BYTES`` for reuse (see the
    module doc); False where there is no glibc ``mallopt`` (the defaults stay)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_MAX_BYTES)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES))


def metric() -> str:
    """``squall_gc_pause_seconds`` in Prometheus text (zero counts until tuned)."""
    return hist_text("squall_gc_pause_seconds", "pause of one cyclic garbage collection "
                     "(generation 2 is a full one; the event loop waits meanwhile)",
                     [({"generation": str(g)}, h) for g, h in enumerate(PAUSES)])
