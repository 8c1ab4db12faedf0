"""Levelling a journal against checkpointed logs (the quorum log's ``_level``): a journal
whose committed ticket, read back after a restart, is below its own log's floor is
levelled from that floor; a journal that lacks records the leader's log no longer holds
is refused, never given a log with a hole. (Found by the chaos soak's master-set mode:
a standby killed while it was the leader, restarted, then the other standby lost; no
member could lead again.)"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from squall.master.ha.journal import Journal, MemLog, MemMeta
from squall.master.ha.quorum import QuorumLog, Unreachable
from tests.test_ha_quorum import MEMBERS, FakeClient, Faults, clients, epoch_start, make_journals


class Down:
    def __init__(self, url: str) -> None:
        self.url = url

    async def call(self, method: str, args: dict[str, Any]) -> Any:
        raise Unreachable(f"{self.url} is down")


def checkpoint(log: MemLog, upto: int) -> None:
    """What a checkpoint does to a member's WAL: the records up to `upto` are dropped."""
    log.records = [r for r in log.records if r[0] > upto]
    log.floor = upto


async def lead(me: str, cl: dict[str, Any], groups: int) -> QuorumLog:
    ql = QuorumLog(me, cl, MEMBERS, timeout=1.0)
    await ql.recover(epoch_start)
    for i in range(groups):
        await ql.append([(ql.last + 1, f"{me}{i}".encode())])
    return ql


def test_a_journal_committed_below_its_floor_is_levelled_from_the_floor() -> None:
    js = make_journals()

    async def go() -> None:
        a = await lead("a", clients(js, Faults()), 10)
        await a.close()
        # b checkpointed (its index applied what it dropped), then restarted: the
        # committed ticket in its meta file is older than its log's floor
        b = js["b"]
        checkpoint(b.log, b.log.last_ticket - 3)
        b.committed = 1
        cl = clients(js, Faults())
        cl["a"] = Down("a")  # a is gone: c and b are the majority
        c = await lead("c", cl, 1)
        assert c.in_sync == {"b", "c"}
        assert b.log.records == js["c"].log.records[-len(b.log.records):]
        await c.close()

    asyncio.run(go())


def test_a_journal_is_never_given_a_log_with_a_hole() -> None:
    js = make_journals()

    async def go() -> None:
        a = await lead("a", clients(js, Faults()), 10)
        checkpoint(js["a"].log, 5)  # the leader's log no longer holds tickets 1..5
        js["b"] = Journal("b", MemLog(), MemMeta())  # b's disk wiped, then re-added
        a.clients["b"] = FakeClient(js["b"], Faults())
        await a.format_member("b")
        with pytest.raises(Unreachable, match="no longer holds"):
            await a._level("b", js["b"].state())
        assert js["b"].log.records == []
        await a.close()

    asyncio.run(go())


def test_a_member_restored_from_a_copy_of_a_standby_is_levelled_and_then_counts() -> None:
    """Records 1..5 checkpointed away everywhere, c's disk lost: an empty c could never be
    caught up, so the operator copies b's volume to c. The copy answers as a copy (it
    never counts with b's promises), is re-added, levelled from its floor, and once the
    leader confirmed it, a majority of {b down, a, c} recovers every record."""
    js = make_journals()

    async def go() -> None:
        a = await lead("a", clients(js, Faults()), 10)
        for m in MEMBERS:
            checkpoint(js[m].log, 5)
        b = js["b"]
        log = MemLog()
        log.records, log.floor = list(b.log.records), b.log.floor
        meta = MemMeta()
        meta.saved = dict(b.meta_store.saved or {})
        js["c"] = Journal("c", log, meta)
        a.clients["c"] = FakeClient(js["c"], Faults())
        assert js["c"].state()["copy_of"] == "b"
        await a.append([(a.last + 1, b"while-c-is-a-copy")])  # a and b: a majority
        assert "c" not in a.in_sync
        await a.format_member("c")
        assert await a.catch_up_step("c")
        assert js["c"].log.records == js["a"].log.records
        assert js["c"].state()["joining"] is None
        acked = list(js["a"].log.records)
        await a.close()
        cl = clients(js, Faults())
        cl["b"] = Down("b")
        c = await lead("c", cl, 0)
        assert all(r in js["c"].log.records for r in acked)
        await c.close()

    asyncio.run(go())
