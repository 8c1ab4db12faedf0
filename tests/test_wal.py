"""The write-ahead log (master/storage/wal.py) and recovery through `Master`, under damage
and crashes.

Raw WAL: frames round-trip, group commit, segment roll and `drop_through`, a torn tail at
every byte offset of the last frame, a bit flip anywhere in the last frame, damage before
the last segment (refused with WALCorrupt). Through `Master`: replay onto an older index
(the crash window between the WAL fsync and the LMDB data reaching the disk), crashes in
every phase of a checkpoint, replay twice, and the index being ahead of the log. Recovered
states are compared key by key over every LMDB database (tests/crashkit.py).
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import google_crc32c
import pytest

from squall.common.clock import ManualClock
from squall.common.errors import NotFound
from squall.common.wire.models import (
    EnqueueItem,
    LeaseRequest,
    ReleaseItem,
    RenewItem,
    TaskRef,
    TaskSpec,
    UpdateRequest,
)
from squall.master.service import Master, MasterSettings
from squall.master.storage import wal as wal_mod
from squall.master.storage.wal import PROBE_BODY, WAL, WALFailed
from squall.master.storage.walfile import MAGIC, Tail, WALCorrupt, encode_frame, read_records
from tests.crashkit import dump_index, kill9, restore_index, snapshot_index

HDR = struct.Struct("<IIQ")


# -- helpers ----------------------------------------------------------------------------------
def segments(d: str | Path) -> list[str]:
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.startswith("wal-"))


def frames(path: str) -> list[tuple[int, int, int]]:
    """(start, end, ticket) of every frame of a segment, parsed independently of wal.py."""
    data = Path(path).read_bytes()
    assert data[: len(MAGIC)] == MAGIC
    pos, out = len(MAGIC), []
    while pos < len(data):
        n, _, ticket = HDR.unpack_from(data, pos)
        out.append((pos, pos + HDR.size + n, ticket))
        pos += HDR.size + n
    assert pos == len(data)
    return out


def body(ticket: int) -> bytes:
    return f"record {ticket} ".encode() * (1 + ticket % 5)


def open_wal(d: str | Path, **kw: object) -> WAL:
    _, tail = read_records(str(d))
    return WAL(str(d), tail, **kw)  # type: ignore[arg-type]


def write_records(d: str | Path, tickets: list[int], *, flush_each: bool = False,
                  **kw: object) -> None:
    w = open_wal(d, **kw)
    try:
        for t in tickets:
            w.append(t, body(t))
            if flush_each:
                w.flush()
        w.flush()
    finally:
        w.close()


def tickets_of(d: str | Path, after: int = 0) -> list[int]:
    return [t for t, _ in read_records(str(d), after)[0]]


# -- raw WAL ----------------------------------------------------------------------------------
def test_frame_layout() -> None:
    b = b"\x93\xa1P\x01"
    f = encode_frame(7, b)
    n, crc, ticket = HDR.unpack_from(f)
    assert (n, ticket, f[HDR.size:]) == (len(b), 7, b)
    assert crc == google_crc32c.value(struct.pack("<Q", 7) + b)


async def test_frames_round_trip(tmp_path: Path) -> None:
    bodies = {1: b"", 2: b"x", 3: bytes(range(256)) * 300, 4: b"\x00" * 5, 9: b"gap before"}
    w = WAL(str(tmp_path), Tail(0, None, 0))
    try:
        for t, b in bodies.items():
            w.append(t, b)
        await w.durable(9)
        assert w.durable_ticket == 9
        with pytest.raises(ValueError, match="does not increase"):
            w.append(9, b"again")
    finally:
        w.close()
    records, tail = read_records(str(tmp_path))
    assert records == list(bodies.items())
    (seg,) = segments(tmp_path)
    assert (tail.last_ticket, tail.path, tail.offset) == (9, seg, os.path.getsize(seg))
    assert read_records(str(tmp_path), after=3)[0] == [(4, bodies[4]), (9, bodies[9])]
    # appending resumes after the tail, in the same segment
    write_records(tmp_path, [10, 11])
    assert tickets_of(tmp_path) == [1, 2, 3, 4, 9, 10, 11]
    assert segments(tmp_path) == [seg]


async def test_group_commit_batches_concurrent_waiters(tmp_path: Path) -> None:
    w = WAL(str(tmp_path), Tail(0, None, 0))  # real fdatasync
    n = 400

    async def one() -> int:
        t = w.next_ticket()
        w.append(t, body(t))
        await w.durable(t)
        assert w.durable_ticket >= t
        return t

    try:
        done = await asyncio.gather(*(one() for _ in range(n)))
    finally:
        w.close()
    assert sorted(done) == list(range(1, n + 1))
    assert w.records == n
    assert 1 <= w.syncs < n, f"{w.syncs} fdatasyncs for {n} records: no group commit"
    assert tickets_of(tmp_path) == list(range(1, n + 1))


def test_segments_roll_and_drop_through_only_covered(tmp_path: Path) -> None:
    write_records(tmp_path, list(range(1, 61)), flush_each=True, segment_bytes=300)
    segs = segments(tmp_path)
    assert len(segs) >= 8
    # each segment is named after its first ticket, and holds a contiguous run
    runs = [[t for _, _, t in frames(p)] for p in segs]
    assert [t for run in runs for t in run] == list(range(1, 61))
    for p, run in zip(segs, runs, strict=True):
        if run:
            assert int(os.path.basename(p)[4:-4]) == run[0]
    w = open_wal(tmp_path, segment_bytes=300)
    try:
        current = w._path
        assert current == segs[-1]
        for upto in (0, 3, runs[2][-1] - 1, runs[2][-1], 45, 59, 60, 10**6):
            before = segments(tmp_path)
            dropped = w.drop_through(upto)
            after = segments(tmp_path)
            assert len(before) - len(after) == dropped
            for p in before:
                last = max(runs[segs.index(p)], default=0)
                if p == current:
                    assert p in after  # never the segment being appended to
                elif p in after:
                    assert last > upto  # kept: it holds a record after `upto`
                else:
                    assert last <= upto  # dropped: every record it held is covered
            # the floor (known in memory once asked) follows the drops
            assert w.floor == int(os.path.basename(after[0])[4:-4]) - 1
            kept = tickets_of(tmp_path)
            assert set(range(upto + 1, 61)) <= set(kept)
            if kept:
                assert kept == list(range(kept[0], 61))
        # the log still reopens and appends after everything was dropped
        w.append(61, body(61))
        w.flush()
    finally:
        w.close()
    assert tickets_of(tmp_path)[-1] == 61


def test_the_floor_follows_a_truncation_below_the_first_segment(tmp_path: Path) -> None:
    write_records(tmp_path, list(range(1, 31)), flush_each=True, segment_bytes=300)
    w = open_wal(tmp_path, segment_bytes=300)
    try:
        assert w.floor == 0
        w.drop_through(20)
        first = int(os.path.basename(segments(tmp_path)[0])[4:-4])
        assert w.floor == first - 1 > 0
        w.truncate_after(first - 3)  # below every record left: a new, empty segment
        assert w.floor == first - 3 == w.last_ticket
        w.append(first - 2, body(first - 2))
        w.flush()
        assert w.floor == first - 3
    finally:
        w.close()
    assert tickets_of(tmp_path) == [first - 2]


def test_request_roll_starts_new_segment_after_next_write(tmp_path: Path) -> None:
    w = WAL(str(tmp_path), Tail(0, None, 0))
    try:
        w.append(1, b"a")
        w.flush()
        w.request_roll()
        assert w.segment_count() == 1
        w.append(2, b"b")
        w.flush()
        assert w.segment_count() == 2
        assert w.drop_through(2) == 1
        w.append(3, b"c")
        w.flush()
    finally:
        w.close()
    assert tickets_of(tmp_path) == [3]
    assert read_records(str(tmp_path))[1].last_ticket == 3


def test_truncated_tail_at_every_offset(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    write_records(src, [1, 2, 3], segment_bytes=10**6)
    write_records(src, [4, 5, 6], segment_bytes=10**6)
    (seg,) = segments(src)
    data = Path(seg).read_bytes()
    start, end, last = frames(seg)[-1]
    assert (last, end) == (6, len(data))
    work = tmp_path / "work"
    for cut in range(start, end):
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(src, work)
        wseg = os.path.join(work, os.path.basename(seg))
        Path(wseg).write_bytes(data[:cut])
        records, tail = read_records(str(work))
        assert [t for t, _ in records] == [1, 2, 3, 4, 5], cut
        assert all(b == body(t) for t, b in records)
        assert (tail.last_ticket, tail.path, tail.offset) == (5, wseg, start)
        assert os.path.getsize(wseg) == start  # the torn frame is cut off for good
        w = WAL(str(work), tail)
        try:
            w.append(6, b"rewritten")
            w.flush()
        finally:
            w.close()
        assert read_records(str(work))[0][-2:] == [(5, body(5)), (6, b"rewritten")]


def test_torn_magic_of_a_fresh_last_segment(tmp_path: Path) -> None:
    write_records(tmp_path, [1, 2, 3], flush_each=True, segment_bytes=1)  # roll every write
    segs = segments(tmp_path)
    assert len(segs) == 4 and os.path.getsize(segs[-1]) == len(MAGIC)
    for cut in range(len(MAGIC)):
        Path(segs[-1]).write_bytes(MAGIC[:cut])
        records, tail = read_records(str(tmp_path))
        assert [t for t, _ in records] == [1, 2, 3]
        assert (tail.last_ticket, tail.path) == (3, segs[-1])
        # an empty file is a clean start (offset 0: the writer puts the magic first);
        # a torn magic is rewritten
        assert tail.offset == (len(MAGIC) if cut else 0)
        assert Path(segs[-1]).read_bytes() == (MAGIC if cut else b"")
        write_records(tmp_path, [4], segment_bytes=10**6)
        assert tickets_of(tmp_path) == [1, 2, 3, 4]
        assert segments(tmp_path) == segs


def test_bit_flip_anywhere_in_last_frame_drops_only_it(tmp_path: Path) -> None:
    write_records(tmp_path, [1, 2, 3, 4])
    (seg,) = segments(tmp_path)
    data = Path(seg).read_bytes()
    start, end, _ = frames(seg)[-1]
    for pos in range(start, end):
        for bit in (0, 5, 7):
            damaged = bytearray(data)
            damaged[pos] ^= 1 << bit
            Path(seg).write_bytes(bytes(damaged))
            records, tail = read_records(str(tmp_path))
            assert records == [(t, body(t)) for t in (1, 2, 3)], (pos, bit)
            assert tail.offset == start and os.path.getsize(seg) == start


@pytest.mark.parametrize("damage", ["flip", "truncate", "magic", "empty"])
def test_damage_before_last_segment_is_refused(tmp_path: Path, damage: str) -> None:
    write_records(tmp_path, list(range(1, 13)), flush_each=True, segment_bytes=120)
    segs = segments(tmp_path)
    assert len(segs) >= 3
    victim = segs[1]
    data = bytearray(Path(victim).read_bytes())
    _, end, _ = frames(victim)[0]
    if damage == "flip":
        data[end - 1] ^= 0x10
    elif damage == "truncate":
        data = data[: end - 1]
    elif damage == "magic":
        data[0] ^= 0x01
    else:
        data = bytearray()
    Path(victim).write_bytes(bytes(data))
    snapshot = {p: Path(p).read_bytes() for p in segs}
    with pytest.raises(WALCorrupt) as e:
        read_records(str(tmp_path))
    assert victim in str(e.value) and "later segments exist" in str(e.value)
    # nothing was "repaired" away: the operator still has every byte
    assert {p: Path(p).read_bytes() for p in segments(tmp_path)} == snapshot


async def test_writer_failure_fails_waiters_and_refuses_appends(tmp_path: Path) -> None:
    w = WAL(str(tmp_path), Tail(0, None, 0))
    ro = os.open(os.devnull, os.O_RDONLY)
    os.dup2(ro, w._fd)  # the log's descriptor now refuses writes: the next one fails
    os.close(ro)
    try:
        w.append(1, b"x")
        with pytest.raises(WALFailed, match="WAL write failed"):
            await w.durable(1)
        with pytest.raises(WALFailed, match="restart the master"):
            w.append(2, b"y")
        with pytest.raises(WALFailed, match="restart the master"):
            w.flush()
        assert not w.retry()  # the torn write could not be cut off: only a restart helps
    finally:
        w.close()


def _enospc_after(limit: int) -> Any:
    """An os.write that accepts `limit` bytes in all, then fails like a full disk."""
    budget = [limit]

    def write(fd: int, data: Any) -> int:
        if budget[0] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = os.write(fd, bytes(data[: budget[0]]))
        budget[0] -= n
        return n

    return write


async def test_a_full_disk_cuts_the_torn_group_off_and_resumes_by_itself(tmp_path: Path) -> None:
    w = WAL(str(tmp_path), Tail(0, None, 0))
    try:
        w.append(1, b"a" * 100)
        await w.durable(1)
        w._os_write = _enospc_after(150)  # type: ignore[method-assign]
        w.append_many([(2, b"b" * 100), (3, b"c" * 100)])  # one group: torn after 150 bytes
        with pytest.raises(WALFailed, match="No space left"):
            await w.durable(3)
        assert "No space left" in (w.failure() or "") and w.failures == 1
        (seg,) = segments(tmp_path)
        assert os.path.getsize(seg) == _end_of_frames(seg)  # the torn group and the zeros
        with pytest.raises(WALFailed):
            w.append(2, b"refused while failed")
        assert not w.retry()  # still full: the probe fails too, nothing changes
        w._os_write = os.write  # type: ignore[method-assign]
        assert w.retry() and w.failure() is None  # space is back: a probe record went in
        w.append(w.last_ticket + 1, b"d")
        await w.durable(w.last_ticket)
        assert os.path.getsize(seg) == wal_mod.PREALLOC_BYTES  # zero-filled ahead again
    finally:
        w.close()
    records, _ = read_records(str(tmp_path))
    # the torn group is gone whole; the probe is an empty op list; appending resumed
    assert [b for _, b in records] == [b"a" * 100, PROBE_BODY, b"d"]
    assert [t for t, _ in records] == sorted({t for t, _ in records})


def _end_of_frames(path: str) -> int:
    """Where the frames of a segment end (frames() would also parse the zeros after)."""
    data = Path(path).read_bytes()
    pos = len(MAGIC)
    while pos + HDR.size <= len(data) and HDR.unpack_from(data, pos)[2] != 0:
        pos += HDR.size + HDR.unpack_from(data, pos)[0]
    return pos


def test_segments_are_zero_filled_ahead_and_a_crash_leaves_only_zeros(tmp_path: Path) -> None:
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    live.mkdir()
    w = WAL(str(live), Tail(0, None, 0))
    try:
        for t in (1, 2, 3):  # three groups, each synced
            w.append(t, body(t))
            w.flush()
        (seg,) = segments(live)
        end = _end_of_frames(seg)
        data = Path(seg).read_bytes()
        # the groups were written into zeros laid ahead: the file did not grow per group
        assert len(data) == wal_mod.PREALLOC_BYTES > end
        assert data[end:] == bytes(len(data) - end)
        shutil.copytree(live, crashed)  # what a kill -9 leaves on the disk
    finally:
        w.close()
    assert os.path.getsize(seg) == end  # a clean stop cuts the zeros off
    assert [t for _, _, t in frames(seg)] == [1, 2, 3]
    # recovery of the crashed copy: the zeros end the log (no frame), and are cut off there
    cseg = os.path.join(crashed, os.path.basename(seg))
    records, tail = read_records(str(crashed))
    assert records == [(t, body(t)) for t in (1, 2, 3)]
    assert (tail.last_ticket, tail.path, tail.offset) == (3, cseg, end)
    assert os.path.getsize(cseg) == end
    write_records(crashed, [4, 5])  # appending resumes right after the last frame
    assert [t for _, _, t in frames(cseg)] == [1, 2, 3, 4, 5]


def test_a_group_torn_inside_the_zeros_is_cut_off(tmp_path: Path) -> None:
    w = WAL(str(tmp_path), Tail(0, None, 0))
    try:
        for t in (1, 2):
            w.append(t, body(t))
            w.flush()
        (seg,) = segments(tmp_path)
        start = _end_of_frames(seg)
        torn = encode_frame(3, body(3))
        for cut in (1, HDR.size, len(torn) - 1):  # part of the next group reached the disk
            with open(seg, "r+b") as f:
                f.seek(start)
                f.write(torn[:cut] + bytes(len(torn) - cut))
            copy = tmp_path / f"crash{cut}"
            copy.mkdir()
            shutil.copy(seg, copy)
            records, tail = read_records(str(copy))
            assert [t for t, _ in records] == [1, 2] and tail.offset == start, cut
            assert os.path.getsize(os.path.join(copy, os.path.basename(seg))) == start
    finally:
        w.close()


def test_a_rolled_segment_is_cut_to_its_last_frame(tmp_path: Path) -> None:
    w = WAL(str(tmp_path), Tail(0, None, 0), segment_bytes=120)
    try:
        for t in range(1, 13):
            w.append(t, body(t))
            w.flush()
        segs = segments(tmp_path)
        assert len(segs) >= 3
        for old in segs[:-1]:  # exact while the log is open: frames() parses every byte
            assert frames(old)
        assert os.path.getsize(segs[-1]) in (len(MAGIC), wal_mod.PREALLOC_BYTES)
    finally:
        w.close()
    assert tickets_of(tmp_path) == list(range(1, 13))
    # zeros after the frames of an earlier segment are damage, not a preallocated end
    with open(segs[0], "ab") as f:
        f.write(bytes(64))
    with pytest.raises(WALCorrupt, match="later segments exist"):
        read_records(str(tmp_path))


# -- recovery through Master ------------------------------------------------------------------
G = "g"


@pytest.fixture
def data_dir(tmp_path: Path) -> str:
    return str(tmp_path / "data")


@pytest.fixture
def snap(tmp_path: Path) -> str:
    return str(tmp_path / "snapshot.mdb")


def settings(data_dir: str, **kw: object) -> MasterSettings:
    return MasterSettings(data_dir=data_dir, **kw)  # type: ignore[arg-type]


@pytest.fixture
def masters(clock: ManualClock) -> Iterator[list[Master]]:
    """Masters opened by a test; whichever is still open at the end gets killed."""
    opened: list[Master] = []
    yield opened
    for m in opened:
        if not m.wal._closed:
            kill9(m)


def reopen(s: MasterSettings, clock: ManualClock, opened: list[Master]) -> Master:
    m = Master(s, clock)
    opened.append(m)
    return m


async def workload(m: Master, tag: str) -> None:
    """Every kind of mutating request, deterministic, no clock movement (so no sweeps)."""
    await m.enqueue(G, "a", [TaskSpec(pid=f"{tag}{i}") for i in range(6)] + [TaskSpec()])
    await m.enqueue(G, "a", [TaskSpec(pid=f"{tag}-later", delay_secs=30), TaskSpec(pid=f"{tag}0")])
    got = await m.lease(G, "a", LeaseRequest(max_tasks=4, lease_secs=60, worker="w"), "addr")
    t0, t1, t2, t3 = ((t["pid"], t["token"]) for t in got["tasks"])
    await m.update(G, UpdateRequest(dequeue=[TaskRef(queue="a", pid=t0[0], token=t0[1])],
                                    enqueue=[EnqueueItem(queue="b", pid=t0[0])]))
    await m.update(G, UpdateRequest(
        renew=[RenewItem(queue="a", pid=t1[0], token=t1[1], lease_secs=120)],
        release=[ReleaseItem(queue="a", pid=t2[0], token=t2[1], delay_secs=5)]))
    await m.update(G, UpdateRequest(dequeue=[TaskRef(queue="a", pid=t3[0], token=t3[1])]))
    await m.enqueue(G, f"q{tag}", [TaskSpec(pid="x")])


async def test_master_group_commit(data_dir: str, clock: ManualClock,
                                   masters: list[Master]) -> None:
    m = reopen(settings(data_dir), clock, masters)
    n = 300
    results = await asyncio.gather(*(m.enqueue(G, "a", [TaskSpec(pid=f"p{i:04d}")])
                                     for i in range(n)))
    assert sorted(r["ticket"] for r in results) == list(range(1, n + 1))
    assert m.wal.records == n and m.wal.syncs < n
    assert m.queue(G, "a").available == n  # type: ignore[union-attr]


@pytest.mark.parametrize("older", ["empty", "checkpoint", "two_checkpoints"])
async def test_replay_onto_older_index(data_dir: str, snap: str, clock: ManualClock,
                                       masters: list[Master], older: str) -> None:
    """The index loses its newest transactions (never synced): replay redoes them."""
    s = settings(data_dir, segment_bytes=512)
    m = reopen(s, clock, masters)
    await workload(m, "a")
    if older != "empty":
        m.checkpoint()
        snapshot_index(data_dir, snap)
    await workload(m, "b")
    if older == "two_checkpoints":
        m.checkpoint()  # drops the segments this sync covers
        assert m.checkpoints == 2
        snapshot_index(data_dir, snap)
    await workload(m, "c")
    want = dump_index(m)
    applied = m.index.applied
    kill9(m)
    restore_index(data_dir, None if older == "empty" else snap)
    m = reopen(s, clock, masters)
    assert m.replayed > 0
    assert m.index.applied == applied
    assert dump_index(m) == want
    # and it goes on from there: new tickets after the old ones
    r = await m.enqueue(G, "a", [TaskSpec(pid="after")])
    assert r["ticket"] == applied + 1


async def test_every_answered_request_survives_power_loss(data_dir: str, snap: str,
                                                          clock: ManualClock,
                                                          masters: list[Master]) -> None:
    s = settings(data_dir, segment_bytes=400)
    m = reopen(s, clock, masters)
    await workload(m, "a")
    m.checkpoint()
    snapshot_index(data_dir, snap)
    answered = []
    for i in range(40):
        r = await m.enqueue(G, "z", [TaskSpec(pid=f"z{i:03d}")])
        answered.append(r["ticket"])
    assert len(segments(m.wal_dir)) > 1
    kill9(m)
    restore_index(data_dir, snap)
    m = reopen(s, clock, masters)
    for i in range(40):
        assert m.task_info(G, "z", f"z{i:03d}")["state"] == "available"
    assert m.queue(G, "z").available == 40  # type: ignore[union-attr]


@pytest.mark.parametrize("when", ["after_sync", "mid_drop", "after_drop"])
@pytest.mark.parametrize("loss", ["kill9", "power"])
async def test_crash_during_checkpoint(data_dir: str, snap: str, clock: ManualClock,
                                       masters: list[Master], monkeypatch: pytest.MonkeyPatch,
                                       when: str, loss: str) -> None:
    s = settings(data_dir, segment_bytes=300)
    m = reopen(s, clock, masters)
    await workload(m, "a")
    m.checkpoint()
    await workload(m, "b")
    m.wal.request_roll()
    await workload(m, "c")  # several segments now, most covered by the index
    want = dump_index(m)
    assert len(segments(m.wal_dir)) >= 3

    class Crash(Exception):
        pass

    real_unlink = os.unlink
    unlinked: list[str] = []
    real_drop = m.wal.drop_through

    def unlink(path: str) -> None:
        if when == "mid_drop" and unlinked:
            raise Crash
        real_unlink(path)
        unlinked.append(path)

    def drop_through(ticket: int) -> int:
        snapshot_index(data_dir, snap)  # the index was just synced: this is the disk now
        if when == "after_sync":
            raise Crash
        real_drop(ticket)
        raise Crash

    monkeypatch.setattr(wal_mod.os, "unlink", unlink)
    monkeypatch.setattr(m.wal, "drop_through", drop_through)
    with pytest.raises(Crash):
        m.checkpoint()
    monkeypatch.undo()
    assert len(unlinked) == {"after_sync": 0, "mid_drop": 1}.get(when, len(unlinked))
    if when == "after_drop":
        assert len(unlinked) >= 2
    kill9(m)
    if loss == "power":
        restore_index(data_dir, snap)
    m = reopen(s, clock, masters)
    assert dump_index(m) == want
    # a later checkpoint finishes the job
    await workload(m, "d")
    m.checkpoint()
    want = dump_index(m)
    kill9(m)
    m = reopen(s, clock, masters)
    assert dump_index(m) == want


async def test_recovery_is_idempotent(data_dir: str, snap: str, clock: ManualClock,
                                      masters: list[Master]) -> None:
    s = settings(data_dir, segment_bytes=600)
    m = reopen(s, clock, masters)
    await workload(m, "a")
    m.checkpoint()
    snapshot_index(data_dir, snap)
    await workload(m, "b")
    await workload(m, "c")
    want = dump_index(m)
    kill9(m)
    replayed = []
    for restore in (True, False, True, True, False):
        if restore:
            restore_index(data_dir, snap)
        m = reopen(s, clock, masters)
        replayed.append(m.replayed)
        assert dump_index(m) == want
        kill9(m)
    assert replayed[0] > 0 and replayed[1] == 0 and replayed[2] == replayed[0]


async def test_torn_last_frame_through_master(data_dir: str, snap: str, clock: ManualClock,
                                              masters: list[Master]) -> None:
    """A crash tore the last frame: that request was never answered. Recovery keeps every
    earlier one (replayed onto the older index) and new requests append after it."""
    s = settings(data_dir)
    m = reopen(s, clock, masters)
    await workload(m, "a")
    m.checkpoint()
    snapshot_index(data_dir, snap)
    await workload(m, "b")
    want = dump_index(m)
    await m.enqueue(G, "a", [TaskSpec(pid="torn", delay_secs=3)])
    kill9(m)
    seg = segments(m.wal_dir)[-1]
    data = Path(seg).read_bytes()
    start, end, _ = frames(seg)[-1]
    for cut in range(start, end):
        Path(seg).write_bytes(data[:cut])
        restore_index(data_dir, snap)
        m = reopen(s, clock, masters)
        assert dump_index(m) == want, cut
        kill9(m)
    assert os.path.getsize(seg) == start
    m = reopen(s, clock, masters)
    await m.enqueue(G, "a", [TaskSpec(pid="resumed")])
    kill9(m)
    restore_index(data_dir, snap)
    m = reopen(s, clock, masters)
    assert m.task_info(G, "a", "resumed")["state"] == "available"
    with pytest.raises(NotFound):
        m.task_info(G, "a", "torn")


async def test_bit_flip_in_last_record_through_master(data_dir: str, snap: str,
                                                      clock: ManualClock,
                                                      masters: list[Master]) -> None:
    s = settings(data_dir)
    m = reopen(s, clock, masters)
    m.checkpoint()
    snapshot_index(data_dir, snap)
    await workload(m, "a")
    want = dump_index(m)
    # the last record leases and dequeues: applying a corrupt copy would show
    got = await m.lease(G, "a", LeaseRequest(max_tasks=3, lease_secs=9), "addr")
    assert len(got["tasks"]) == 3
    kill9(m)
    seg = segments(m.wal_dir)[-1]
    data = Path(seg).read_bytes()
    start, end, _ = frames(seg)[-1]
    for pos in range(start, end, max(1, (end - start) // 40)):
        damaged = bytearray(data)
        damaged[pos] ^= 0x04
        Path(seg).write_bytes(bytes(damaged))
        restore_index(data_dir, snap)
        m = reopen(s, clock, masters)
        assert dump_index(m) == want, pos
        kill9(m)


async def test_master_refuses_corrupt_middle_segment(data_dir: str, clock: ManualClock,
                                                     masters: list[Master]) -> None:
    s = settings(data_dir, segment_bytes=200)
    m = reopen(s, clock, masters)
    await workload(m, "a")
    kill9(m)
    segs = segments(m.wal_dir)
    assert len(segs) >= 3
    data = bytearray(Path(segs[0]).read_bytes())
    data[frames(segs[0])[0][1] - 1] ^= 0xFF
    Path(segs[0]).write_bytes(bytes(data))
    with pytest.raises(WALCorrupt, match="refusing to start"):
        reopen(s, clock, masters)


async def test_index_ahead_of_wal_then_power_loss(data_dir: str, clock: ManualClock,
                                                  masters: list[Master], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """kill -9 after the LMDB commit of a request but before its frame reached the log: the
    index holds a change the WAL does not. Later records build on it (here: a task in the
    queue that change created), so it must be made durable before they are logged, or a
    power loss leaves a WAL that cannot be replayed onto the synced index."""
    synced: list[str] = []
    from squall.master.storage.index import Index

    real_sync = Index.sync

    def sync(self: Index) -> None:  # every sync: remember what the disk holds now
        real_sync(self)
        dest = str(tmp_path / f"sync{len(synced)}.mdb")
        snapshot_index(data_dir, dest)
        synced.append(dest)

    monkeypatch.setattr(Index, "sync", sync)
    s = settings(data_dir)
    m = reopen(s, clock, masters)
    await m.enqueue(G, "a", [TaskSpec(pid="x")])
    m.checkpoint()
    await m.enqueue(G, "a", [TaskSpec(pid="y")])  # the WAL rolls after this one
    await m.enqueue(G, "new", [TaskSpec(pid="unlogged")])  # creates queue "new"
    kill9(m)
    seg = segments(m.wal_dir)[-1]
    start, _, _ = frames(seg)[-1]
    with open(seg, "r+b") as f:  # its frame never made it to the file
        f.truncate(start)
    m = reopen(s, clock, masters)
    assert m.task_info(G, "new", "unlogged")["state"] == "available"  # unanswered, but there
    r = await m.enqueue(G, "new", [TaskSpec(pid="answered")])
    assert r["ticket"] > 0
    want = dump_index(m)
    kill9(m)
    restore_index(data_dir, synced[-1])  # power loss: the disk has the last synced index
    m = reopen(s, clock, masters)
    assert m.task_info(G, "new", "answered")["state"] == "available"
    assert dump_index(m) == want


async def test_write_group_on_the_callers_thread_keeps_ticket_order_and_fails_whole(
        tmp_path: Path) -> None:
    """The master's group commit writes a group on its commit thread (write_group): it
    waits for appends queued before it, is durable when it returns, and a failed write
    leaves nothing of the group in the file and refuses what follows, as a queued group
    would."""
    w = WAL(str(tmp_path), Tail(0, None, 0))
    try:
        w.append_many([(1, b"queued first"), (2, b"queued too")])
        await asyncio.to_thread(w.write_group, [(3, b"mine"), (4, b"mine too")])
        assert w.durable_ticket == w.last_ticket == 4
        with pytest.raises(ValueError, match="does not increase"):
            w.write_group([(4, b"again")])
        w._os_write = _enospc_after(50)  # type: ignore[method-assign]
        with pytest.raises(WALFailed, match="No space left"):
            await asyncio.to_thread(w.write_group, [(5, b"x" * 40), (6, b"y" * 40)])
        assert w.durable_ticket == w.last_ticket == 4 and w.failure() is not None
        with pytest.raises(WALFailed):
            w.write_group([(5, b"refused while failed")])
        w._os_write = os.write  # type: ignore[method-assign]
        assert w.retry()
        w.write_group([(w.last_ticket + 1, b"after")])
    finally:
        w.close()
    records, _ = read_records(str(tmp_path))  # the torn group (5, 6) is gone; 5 is the probe
    assert records == [(1, b"queued first"), (2, b"queued too"), (3, b"mine"),
                       (4, b"mine too"), (5, PROBE_BODY), (6, b"after")]


class _CountingCondition(threading.Condition):
    """A Condition that counts how often a wait returned (the WAL's writer thread waits on
    its own one)."""

    def __init__(self, lock: Any = None) -> None:
        super().__init__(lock)
        self.woken = 0

    def wait(self, timeout: float | None = None) -> bool:
        got = super().wait(timeout)
        self.woken += 1
        return got


async def test_write_group_wakes_no_idle_writer_and_hands_queued_appends_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group the commit thread writes itself does not wake the idle writer thread (a
    context switch and a GIL handover per group, measured on a master serving one request
    at a time). What must still happen: a `durable()` waiter is released by such a group,
    and appends queued while it was being written are written after it (the writer is
    woken for them), with no flush to nudge it."""
    monkeypatch.setattr(wal_mod.threading, "Condition", _CountingCondition)
    w = WAL(str(tmp_path), Tail(0, None, 0))
    monkeypatch.undo()
    work = w._work
    assert isinstance(work, _CountingCondition)
    try:
        waiter = asyncio.ensure_future(w.durable(1))
        await asyncio.sleep(0)  # one loop turn: the waiter is registered
        assert not waiter.done()
        await asyncio.to_thread(w.write_group, [(1, b"one")])
        await asyncio.wait_for(waiter, 10)
        for t in range(2, 12):
            await asyncio.to_thread(w.write_group, [(t, body(t))])
        assert work.woken == 0  # ten groups, the writer slept through them
        # an append queued while a group is being written: the writer writes it next
        syncing, release = threading.Event(), threading.Event()
        real = w._os_fdatasync

        def held_sync(fd: int) -> None:
            syncing.set()
            assert release.wait(10)
            real(fd)

        w._os_fdatasync = held_sync  # type: ignore[method-assign]
        group = asyncio.ensure_future(asyncio.to_thread(w.write_group, [(12, b"g")]))
        assert await asyncio.to_thread(syncing.wait, 10)
        w._os_fdatasync = real  # type: ignore[method-assign]
        w.append_many([(13, b"queued meanwhile")])
        release.set()
        await asyncio.wait_for(group, 10)
        await asyncio.wait_for(w.durable(13), 10)  # durable() does not nudge the writer
        assert work.woken >= 1
    finally:
        w.close()
    assert tickets_of(tmp_path) == list(range(1, 14))
