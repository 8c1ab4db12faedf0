"""The on-disk format of the master's write-ahead log (``wal.py`` appends to it) and the
recovery read of it at start-up.

Directory layout::

    <wal_dir>/wal-<first ticket, 20 digits>.log     segments, in ticket order

Segment file::

    b"SQWAL001"                                    8-byte magic and format version
    frame*

Frame (little-endian)::

    u32 body_len | u32 crc32c(ticket_le64 + body) | u64 ticket | body (body_len bytes)

``body`` is a msgpack list of ops (see ``index.py``). Tickets strictly increase across
frames and segments.

Recovery (:func:`read_records`) reads segments in order and stops at the first frame that
is short, fails its checksum or does not increase the ticket. In the last segment that is
a torn or corrupt tail: the file is truncated there and appending resumes. In an earlier
segment it is corruption of acknowledged data, and :class:`WALCorrupt` is raised rather
than silently dropping everything after it.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

import google_crc32c

MAGIC = b"SQWAL001"
_HDR = struct.Struct("<IIQ")
_TICKET = struct.Struct("<Q")
MAX_RECORD_BYTES = 256 << 20


class WALCorrupt(RuntimeError):
    """A frame before the last segment is damaged: acknowledged records would be lost."""


def _crc(ticket: int, body: bytes) -> int:
    return google_crc32c.extend(google_crc32c.value(_TICKET.pack(ticket)), body)


def encode_frame(ticket: int, body: bytes) -> bytes:
    return _HDR.pack(len(body), _crc(ticket, body), ticket) + body


def segments(wal_dir: str) -> list[tuple[int, str]]:
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
    segs = segments(wal_dir)
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


def frame_ends(path: str, upto: int) -> tuple[list[tuple[int, bytes]], int]:
    """The intact frames of one segment with tickets <= `upto`, and the byte offset where
    the last of them ends (a master set's journal cuts its log there)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[: len(MAGIC)] != MAGIC:
        return [], 0
    pos, prev = len(MAGIC), 0
    out: list[tuple[int, bytes]] = []
    while pos + _HDR.size <= len(data):
        n, crc, ticket = _HDR.unpack_from(data, pos)
        end = pos + _HDR.size + n
        if n > MAX_RECORD_BYTES or end > len(data) or ticket <= prev or ticket > upto:
            break
        body = data[pos + _HDR.size : end]
        if _crc(ticket, body) != crc:
            break
        out.append((ticket, body))
        prev, pos = ticket, end
    return out, pos
