"""A member's journal over the master's real WAL: reads across segments, cutting a tail
(also across segments, after zeros of preallocation), the meta file, and a restart."""

from __future__ import annotations

import os

import pytest

from squall.master.ha.journal import FileMeta, Journal, Refused
from squall.master.ha.role import WalLog
from squall.master.storage.wal import WAL
from squall.master.storage.walfile import read_records


def open_wal(d: str) -> WAL:
    _, tail = read_records(d)
    return WAL(d, tail, segment_bytes=4096)


def test_read_after_and_truncate_across_segments(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = str(tmp_path)
    wal = open_wal(d)
    for t in range(1, 201):
        wal.write_group([(t, b"x%03d" % t * 20)])
    assert len(os.listdir(d)) > 3  # several segments
    assert [t for t, _ in wal.read_after(150, 10, 1 << 20)] == list(range(151, 161))
    assert wal.read_after(0, 1000, 100)[0][0] == 1  # at least one record
    wal.truncate_after(57)
    assert wal.last_ticket == 57
    assert [t for t, _ in wal.read_after(50, 100, 1 << 20)] == list(range(51, 58))
    wal.write_group([(58, b"new")])
    wal.close()
    records, _ = read_records(d)
    assert [t for t, _ in records] == list(range(1, 59))
    assert records[-1][1] == b"new"


def test_journal_on_the_wal_survives_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    d = str(tmp_path / "wal")
    os.makedirs(d)
    meta = str(tmp_path / "journal.json")
    wal = open_wal(d)
    j = Journal("http://m1", WalLog(wal), FileMeta(meta))
    with pytest.raises(Refused, match="unformatted"):
        j.new_epoch("c", 1)
    j.format("c", 0)
    j.new_epoch("c", 1)
    j.sync("c", 1, 0, [], 0, True)
    j.append("c", 1, 0, [(1, b"a"), (2, b"b")], 0)
    j.append("c", 1, 2, [(3, b"c")], 2)
    with pytest.raises(Refused, match="out_of_sync"):
        j.append("c", 1, 2, [(4, b"d")], 3)
    # a new leader (epoch 2) keeps 1..2 and replaces 3
    j.new_epoch("c", 2)
    with pytest.raises(Refused, match="fenced"):
        j.append("c", 1, 3, [(4, b"late")], 3)
    j.sync("c", 2, 2, [(3, b"C"), (4, b"D")], 3, True)
    wal.close()
    wal = open_wal(d)
    j = Journal("http://m1", WalLog(wal), FileMeta(meta))
    st = j.state()
    assert (st["promised"], st["accepted"], st["last"], st["committed"]) == (2, 2, 4, 3)
    assert j.read(0) == [(1, b"a"), (2, b"b"), (3, b"C"), (4, b"D")]
    with pytest.raises(Refused, match="foreign"):
        j.format("other", 0)
    wal.close()


def test_a_member_replays_only_what_its_journal_knows_committed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A set member's WAL may end in a group no majority took (a new leader may cut it):
    at start its index gets only the records up to the journal's committed ticket."""
    import json

    import msgpack

    from squall.master.ha.role import SetSettings
    from squall.master.service import Master, MasterSettings

    d = tmp_path / "m"
    (d / "wal").mkdir(parents=True)
    wal = open_wal(str(d / "wal"))
    ops = [msgpack.packb([("M", 100 * t, 0)]) for t in (1, 2, 3)]
    wal.write_group([(1, ops[0]), (2, ops[1])])
    wal.write_group([(3, ops[2])])  # never acknowledged by a majority
    wal.close()
    (d / "journal.json").write_text(json.dumps({"cluster": "c", "promised": 1,
                                                "accepted": 1, "committed": 2}))
    s = MasterSettings(data_dir=str(d), cluster_key=b"k" * 32)
    s.master_set = SetSettings(me="http://127.0.0.1:1", members=["http://127.0.0.1:1"])
    m = Master(s)
    try:
        assert m.index.applied == 2 and m.index.lease_seq == 200
    finally:
        m.close()


def test_a_re_added_journal_stays_joining_across_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A re-added journal on the real WAL and meta file: joining (no promise) and its
    incarnation survive a restart; a call naming another incarnation is refused; only
    an append with join=True, once its log reaches the ticket, ends joining."""
    d = str(tmp_path / "wal")
    os.makedirs(d)
    meta = str(tmp_path / "journal.json")
    wal = open_wal(d)
    j = Journal("http://m2", WalLog(wal), FileMeta(meta))
    inc = j.format("c", 3, until=2)["incarnation"]
    wal.close()
    wal = open_wal(d)
    j = Journal("http://m2", WalLog(wal), FileMeta(meta))
    st = j.state()
    assert (st["joining"], st["incarnation"], st["promised"]) == (2, inc, 3)
    with pytest.raises(Refused, match="joining"):
        j.new_epoch("c", 4)
    with pytest.raises(Refused, match="re-formatted"):
        j.sync("c", 3, 0, [(1, b"a")], 0, True, incarnation="an-earlier-one")
    j.sync("c", 3, 0, [(1, b"a"), (2, b"b")], 2, True, incarnation=inc)
    assert j.state()["joining"] == 2  # levelled, but the leader has not confirmed yet
    j.append("c", 3, 2, [], 2, incarnation=inc, join=True)
    assert j.state()["joining"] is None
    j.new_epoch("c", 4)
    wal.close()


def test_a_copy_of_another_members_volume_counts_only_once_re_added(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A member restored from a copy of another member's volume holds that member's
    promises and log, not its own: it answers "unformatted" (a copy) to every call until a
    leader re-adds it, then keeps the copied log and is joining until levelled."""
    import shutil

    d, meta = str(tmp_path / "b" / "wal"), str(tmp_path / "b" / "journal.json")
    os.makedirs(d)
    wal = open_wal(d)
    j = Journal("http://m2", WalLog(wal), FileMeta(meta))
    j.format("c", 0)
    j.new_epoch("c", 1)
    j.sync("c", 1, 0, [], 0, True)
    j.append("c", 1, 0, [(1, b"a"), (2, b"b")], 2)
    wal.close()
    shutil.copytree(tmp_path / "b", tmp_path / "c")  # the operator's restore of m3
    wal = open_wal(str(tmp_path / "c" / "wal"))
    copy = Journal("http://m3", WalLog(wal), FileMeta(str(tmp_path / "c" / "journal.json")))
    st = copy.state()
    assert (st["formatted"], st["copy_of"]) == (False, "http://m2")
    for call in (lambda: copy.new_epoch("c", 2), lambda: copy.read(0),
                 lambda: copy.append("c", 1, 2, [(3, b"c")], 2),
                 lambda: copy.format("c", 1)):  # only a leader's re-add (with `until`)
        with pytest.raises(Refused, match="copy of http://m2"):
            call()
    with pytest.raises(Refused, match="foreign"):
        copy.format("another-cluster", 1, until=2)
    st = copy.format("c", 1, until=2)
    assert (st["formatted"], st["copy_of"], st["joining"], st["last"]) == (True, None, 2, 2)
    with pytest.raises(Refused, match="joining"):
        copy.new_epoch("c", 2)
    wal.close()
    # the re-add is durable: reopened, it is m3's own journal, still joining
    wal = open_wal(str(tmp_path / "c" / "wal"))
    again = Journal("http://m3", WalLog(wal), FileMeta(str(tmp_path / "c" / "journal.json")))
    assert (again.state()["copy_of"], again.state()["joining"]) == (None, 2)
    wal.close()
