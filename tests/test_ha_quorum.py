"""The quorum log's protocol against in-memory journals and a fake transport that drops
RPCs: the port of HDFS's TestQJMWithFaults (every pair of RPC indices on two of three
journals fails), a seeded randomized version with many leader generations, and epochs.

Acknowledged = ``QuorumLog.append`` returned. After every run a fresh leader on another
member recovers, and every acknowledged record must be in its log, at its ticket."""

from __future__ import annotations

import asyncio
import copy
import itertools
import random
from typing import Any

import pytest

from squall.master.ha.journal import Journal, MemLog, MemMeta, Refused
from squall.master.ha.quorum import Fenced, QuorumLog, QuorumLost, Unreachable

MEMBERS = ["a", "b", "c"]


class Faults:
    """Which RPCs fail: (member, index of the call to that member) -> mode. Modes:
    ``before`` (the request is lost), ``after`` (applied, the answer is lost), ``torn``
    (a group write keeps a prefix of its records: a crash before its fdatasync)."""

    def __init__(self, plan: dict[tuple[str, int], str] | None = None,
                 rng: random.Random | None = None, p: float = 0.0) -> None:
        self.plan = plan or {}
        self.calls: dict[str, int] = dict.fromkeys(MEMBERS, 0)
        self.rng, self.p = rng, p

    def mode(self, member: str) -> str | None:
        i = self.calls[member]
        self.calls[member] = i + 1
        if (member, i) in self.plan:
            return self.plan[(member, i)]
        if self.rng is not None and self.rng.random() < self.p:
            return self.rng.choice(["before", "after", "torn"])
        return None


class FakeClient:
    def __init__(self, journal: Journal, faults: Faults) -> None:
        self.url, self.journal, self.faults = journal.member, journal, faults

    async def call(self, method: str, args: dict[str, Any]) -> Any:
        await asyncio.sleep(0)  # a real hop: other sends interleave
        mode = self.faults.mode(self.url)
        if mode == "before":
            raise Unreachable(f"{self.url}: {method} dropped")
        if mode == "torn" and method in ("append", "sync") and args["records"]:
            recs = args["records"]
            keep = recs[: len(recs) // 2]
            log = self.journal.log
            if keep and keep[0][0] > log.last_ticket and method == "append":
                log.write(keep)  # a torn group: its head reached the disk, no answer
            raise Unreachable(f"{self.url}: {method} torn")
        out = getattr(self.journal, method)(**args)
        if mode in ("after", "torn"):
            raise Unreachable(f"{self.url}: {method} answer lost")
        return out


def make_journals(cluster: str | None = "c1") -> dict[str, Journal]:
    """Three journals, formatted into one cluster (as HDFS's test formats them first)."""
    out = {m: Journal(m, MemLog(), MemMeta()) for m in MEMBERS}
    if cluster is not None:
        for j in out.values():
            j.format(cluster, 0)
    return out


def clients(journals: dict[str, Journal], faults: Faults) -> dict[str, Any]:
    return {m: FakeClient(j, faults) for m, j in journals.items()}


def epoch_start(e: int) -> bytes:
    return b"E%d" % e


async def write_run(journals: dict[str, Journal], faults: Faults, groups: int,
                    leaders: list[str], epochs: list[int]) -> list[tuple[int, bytes]]:
    """Write `groups` groups through successive leaderships (a failed one is replaced
    by the next member in `leaders`, cyclically); the acknowledged records."""
    acked: list[tuple[int, bytes]] = []
    g = attempt = 0
    while g < groups and attempt < 4 * groups + 8:
        me = leaders[attempt % len(leaders)]
        attempt += 1
        ql = QuorumLog(me, clients(journals, faults), MEMBERS, timeout=5)
        try:
            epochs.append(await ql.recover(epoch_start))
            while g < groups:
                recs = [(ql.last + 1 + i, b"g%d-%d" % (g, i)) for i in range(1 + g % 3)]
                await ql.append(recs)
                acked.extend(recs)
                g += 1
        except QuorumLost:
            pass
        finally:
            await ql.close()
    return acked


def clone(journals: dict[str, Journal]) -> dict[str, Journal]:
    out = {}
    for m, j in journals.items():
        log, meta = MemLog(), MemMeta()
        log.records = list(j.log.records)  # type: ignore[attr-defined]
        meta.saved = copy.deepcopy(j.meta_store.saved)  # type: ignore[attr-defined]
        out[m] = Journal(m, log, meta)
    return out


class Down(Faults):
    """Every call to `member` fails: recovery must do with the other two."""

    def __init__(self, member: str) -> None:
        super().__init__()
        self.down = member

    def mode(self, member: str) -> str | None:
        return "before" if member == self.down else None


async def check_recovered(journals: dict[str, Journal], acked: list[tuple[int, bytes]],
                          me: str) -> None:
    """A new leader recovers every acknowledged record, with any one member down (on a
    copy of the journals for each), and with all three up (on the journals)."""
    for down in MEMBERS:
        if down == me:
            continue
        await _recover_and_check(clone(journals), acked, me, Down(down))
    await _recover_and_check(journals, acked, me, Faults())


async def _recover_and_check(journals: dict[str, Journal], acked: list[tuple[int, bytes]],
                             me: str, faults: Faults) -> None:
    ql = QuorumLog(me, clients(journals, faults), MEMBERS)
    await ql.recover(epoch_start)
    await ql.close()
    held = dict(journals[me].log.records)
    missing = [r for r in acked if held.get(r[0]) != r[1]]
    assert not missing, f"acknowledged records lost: {missing[:5]}"
    # the log is ordered, and a majority holds exactly the leader's log
    tickets = [t for t, _ in journals[me].log.records]
    assert tickets == sorted(set(tickets))
    same = [m for m in MEMBERS if journals[m].log.records == journals[me].log.records]
    assert len(same) >= 2


GROUPS = 5


def test_fault_free_run_then_count_rpcs() -> None:
    async def go() -> dict[str, int]:
        journals, faults, epochs = make_journals(), Faults(), []
        acked = await write_run(journals, faults, GROUPS, ["a"], epochs)
        assert len(acked) == sum(1 + g % 3 for g in range(GROUPS))
        await check_recovered(journals, acked, "b")
        return faults.calls
    calls = asyncio.run(go())
    assert all(n > GROUPS for n in calls.values())


@pytest.mark.parametrize("mode", ["before", "after"])
def test_recover_after_double_failures(mode: str) -> None:
    """TestQJMWithFaults.testRecoverAfterDoubleFailures: for every pair of RPC indices on
    two of the three journals, fail those two calls; a new leader recovers everything that
    was acknowledged."""
    async def go() -> int:
        base = Faults()
        await write_run(make_journals(), base, GROUPS, ["a", "b", "c"], [])
        runs = 0
        for x, y in itertools.combinations(MEMBERS, 2):
            for i in range(base.calls[x] + 1):
                for j in range(base.calls[y] + 1):
                    journals, epochs = make_journals(), []
                    faults = Faults({(x, i): mode, (y, j): mode})
                    acked = await write_run(journals, faults, GROUPS, ["a", "b", "c"],
                                            epochs)
                    assert epochs == sorted(set(epochs)), epochs
                    await check_recovered(journals, acked, random.Random(i * 31 + j)
                                          .choice(MEMBERS))
                    runs += 1
        return runs
    assert asyncio.run(go()) > 300


@pytest.mark.parametrize("seed", range(12))
def test_randomized_generations(seed: int) -> None:
    """Many leader generations on random members, every RPC failing (lost request, lost
    answer or torn write) with some probability; each leadership writes a few groups."""
    rng = random.Random(seed)

    async def go() -> None:
        journals = make_journals()
        acked: list[tuple[int, bytes]] = []
        epochs: list[int] = []
        faults = Faults(rng=rng, p=0.15)
        for gen in range(40):
            me = rng.choice(MEMBERS)
            ql = QuorumLog(me, clients(journals, faults), MEMBERS)
            try:
                epochs.append(await ql.recover(epoch_start))
                for g in range(rng.randint(0, 4)):
                    recs = [(ql.last + 1 + i, b"%d-%d-%d" % (gen, g, i))
                            for i in range(rng.randint(1, 3))]
                    await ql.append(recs)
                    acked.extend(recs)
            except QuorumLost:
                pass
            finally:
                await ql.close()
            if rng.random() < 0.2:  # a leader change that recovers on another member
                await check_recovered(journals, acked, rng.choice(MEMBERS))
        assert epochs == sorted(set(epochs))
        await check_recovered(journals, acked, rng.choice(MEMBERS))
        assert len(acked) > 0
    asyncio.run(go())


def test_epochs_are_unique_under_racing_candidates() -> None:
    """Candidates on every member race for leadership many times: no epoch is won twice,
    and a deposed leader's next group is refused (fenced)."""
    async def go() -> None:
        journals = make_journals()
        won: list[int] = []
        rng = random.Random(7)
        for _ in range(30):
            logs = [QuorumLog(m, clients(journals, Faults()), MEMBERS) for m in MEMBERS]
            rng.shuffle(logs)
            outs = await asyncio.gather(*(ql.recover(epoch_start) for ql in logs),
                                        return_exceptions=True)
            ok = [o for o in outs if isinstance(o, int)]
            won.extend(ok)
            for o in outs:
                assert isinstance(o, int | QuorumLost), o
            for ql in logs:
                await ql.close()
        assert len(won) == len(set(won)), won
        assert won == sorted(won) or len(set(won)) == len(won)

        first = QuorumLog("a", clients(journals, Faults()), MEMBERS)
        await first.recover(epoch_start)
        second = QuorumLog("b", clients(journals, Faults()), MEMBERS)
        e2 = await second.recover(epoch_start)
        assert e2 > first.epoch
        with pytest.raises(Fenced):
            await first.append([(first.last + 1, b"late")])
        await second.append([(second.last + 1, b"fine")])
        assert all(b"late" not in dict(j.log.records).values() for j in journals.values())
    asyncio.run(go())


def test_bootstrap_formats_every_member() -> None:
    async def go() -> None:
        journals = make_journals(cluster=None)
        ql = QuorumLog("b", clients(journals, Faults()), MEMBERS)
        await ql.recover(epoch_start, bootstrap=lambda: [(0, b"members")])
        assert {j.cluster for j in journals.values()} == {ql.cluster}
        assert [b for _, b in journals["a"].log.records] == [b"E1", b"members"]
        await ql.close()
    asyncio.run(go())


def test_wiped_journal_is_unformatted_and_does_not_count() -> None:
    async def go() -> None:
        journals = make_journals()
        ql = QuorumLog("a", clients(journals, Faults()), MEMBERS)
        await ql.recover(epoch_start)
        await ql.append([(ql.last + 1, b"x")])
        await ql.close()
        journals["b"] = Journal("b", MemLog(), MemMeta())  # wiped
        journals["c"] = Journal("c", MemLog(), MemMeta())  # wiped too: no majority left
        with pytest.raises(Refused):
            journals["b"].new_epoch(journals["a"].cluster or "", 99)
        ql = QuorumLog("b", clients(journals, Faults()), MEMBERS)
        with pytest.raises(QuorumLost, match="unformatted"):
            await ql.recover(epoch_start)
        ql = QuorumLog("a", clients(journals, Faults()), MEMBERS)
        with pytest.raises(QuorumLost, match="majority"):
            await ql.recover(epoch_start)
        # an operator re-adds b: formatted by the leader... which needs a majority first:
        journals["b"].format(journals["a"].cluster or "", 0)
        ql = QuorumLog("a", clients(journals, Faults()), MEMBERS)
        await ql.recover(epoch_start)
        assert dict(journals["b"].log.records)[2] == b"x"  # caught up in recovery
        await ql.close()
    asyncio.run(go())


def test_a_longer_stale_log_loses_to_a_newer_epoch() -> None:
    """A deposed leader's unacknowledged group on one journal is longer than what the next
    leader acknowledged on the other two: recovery must prefer the newer epoch, not the
    longest log (HDFS compares lastWriterEpoch first)."""
    async def go() -> None:
        journals = make_journals()
        first = QuorumLog("a", clients(journals, Faults()), MEMBERS)
        await first.recover(epoch_start)
        # b and c drop the group: only a's journal holds it (3 records, never acknowledged)
        plan = Faults({("b", 0): "before", ("c", 0): "before"})
        first.clients = clients(journals, plan)
        with pytest.raises(QuorumLost):
            await first.append([(first.last + i, b"stale%d" % i) for i in (1, 2, 3)])
        await first.close()
        assert len(journals["a"].log.records) == 4
        # the next leader reaches b and c only, and acknowledges one record
        second = QuorumLog("b", clients(journals, Down("a")), MEMBERS)
        await second.recover(epoch_start)
        acked = [(second.last + 1, b"acked")]
        await second.append(acked)
        await second.close()
        assert len(journals["b"].log.records) == 3  # shorter than a's 4
        # a third leadership with c down: it must keep b's acknowledged log
        third = QuorumLog("a", clients(journals, Down("c")), MEMBERS)
        await third.recover(epoch_start)
        held = dict(journals["a"].log.records)
        assert held[acked[0][0]] == b"acked"
        assert b"stale3" not in held.values()
        await third.close()
    asyncio.run(go())


def test_an_empty_append_confirms_or_fences_the_leader() -> None:
    """An empty append (what a leader runs before it hands out delete commands) succeeds
    while a majority follows its epoch, and is fenced once another member took a higher
    one: a deposed leader cannot confirm itself."""
    async def go() -> None:
        journals = make_journals()
        first = QuorumLog("a", clients(journals, Faults()), MEMBERS)
        await first.recover(epoch_start)
        await first.append([])
        second = QuorumLog("b", clients(journals, Faults()), MEMBERS)
        assert await second.recover(epoch_start) > first.epoch
        with pytest.raises(Fenced):
            await first.append([])
        await second.append([])
        await first.close()
        await second.close()
    asyncio.run(go())


def test_a_re_added_journal_counts_only_once_caught_up() -> None:
    """The model test's counterexample: a record acknowledged on a and c while b is down;
    c's disk is wiped and the leader re-adds it (empty log). Had c counted at once, b and c
    (a down) would recover without the record. A joining journal refuses to promise, so
    that recovery fails instead; once the leader caught c up it counts again."""
    async def go() -> None:
        journals = make_journals()
        ql = QuorumLog("a", clients(journals, Down("b")), MEMBERS)
        await ql.recover(epoch_start)
        rec = (ql.last + 1, b"acked")
        await ql.append([rec])  # on a and c
        journals["c"] = Journal("c", MemLog(), MemMeta())  # wiped
        ql.clients["c"] = FakeClient(journals["c"], Faults())
        st = await ql.format_member("c")
        assert st["joining"] == ql.committed == rec[0]
        # a joining journal promises no epoch, also after a restart (the ticket is saved)
        journals["c"] = Journal("c", journals["c"].log, journals["c"].meta_store)
        ql.clients["c"] = FakeClient(journals["c"], Faults())
        with pytest.raises(Refused) as e:
            journals["c"].new_epoch("c1", 99)
        assert e.value.kind == "joining"
        # b and c with a down: no majority of caught-up journals, nothing recovered short
        other = QuorumLog("b", clients(clone(journals), Down("a")), MEMBERS)
        with pytest.raises(QuorumLost, match="caught up"):
            await other.recover(epoch_start)
        await other.close()
        # c counts only once the leader confirmed its epoch on a majority of the others:
        # not with b down
        with pytest.raises(QuorumLost):
            await ql.catch_up_step("c")
        assert journals["c"].joining is not None
        # b is back: a new leadership on a catches b and then c up; c's joining ends
        ql = QuorumLog("a", clients(journals, Faults()), MEMBERS, background=False)
        await ql.recover(epoch_start)
        assert await ql.catch_up_step("c")
        assert journals["c"].joining is None and "c" in ql.in_sync
        assert dict(journals["c"].log.records)[rec[0]] == rec[1]
        nxt = (ql.last + 1, b"next")
        await ql.append([nxt])
        await ql.close()
        # now b and c (a down) recover both records
        await _recover_and_check(journals, [rec, nxt], "b", Down("a"))
    asyncio.run(go())


def test_a_joining_journal_is_caught_up_by_the_next_leader() -> None:
    """The leader that re-added a journal dies before catching it up: the next leader
    (on the other two) levels it, which ends its joining."""
    async def go() -> None:
        journals = make_journals()
        ql = QuorumLog("a", clients(journals, Faults()), MEMBERS, background=False)
        await ql.recover(epoch_start)
        acked = [(ql.last + 1, b"x"), (ql.last + 2, b"y")]
        await ql.append(acked)
        journals["c"] = Journal("c", MemLog(), MemMeta())  # wiped, re-added, not caught up
        ql.clients["c"] = FakeClient(journals["c"], Faults())
        await ql.format_member("c")
        await ql.close()
        nxt = QuorumLog("b", clients(journals, Faults()), MEMBERS, background=False)
        await nxt.recover(epoch_start)
        assert "c" not in nxt.in_sync and journals["c"].joining is not None
        assert await nxt.catch_up_step("c")
        assert journals["c"].joining is None
        assert journals["c"].log.records == journals["b"].log.records
        await nxt.close()
        await _recover_and_check(journals, acked, "c", Down("a"))
    asyncio.run(go())


class WipeOnce(FakeClient):
    """b's journal is wiped and re-added (by the old leader) just before the first call
    of `method` reaches it."""

    def __init__(self, journals: dict[str, Journal], m: str, method: str,
                 until: int) -> None:
        super().__init__(journals[m], Faults())
        self.journals, self.m, self.method, self.until = journals, m, method, until

    async def call(self, method: str, args: dict[str, Any]) -> Any:
        if method == self.method and self.until >= 0:
            fresh = Journal(self.m, MemLog(), MemMeta())
            fresh.format("c1", 1, until=self.until)
            self.journals[self.m] = self.journal = fresh
            self.until = -1
        return await super().call(method, args)


def test_a_promise_from_a_wiped_journal_is_not_acted_on() -> None:
    """c's candidacy is promised by b and c; b holds the acknowledged record, c does not.
    b's disk is wiped and b re-added before c reads b's log: c refuses to take the log it
    reads then for the one b promised with (the journal's incarnation changed), whatever
    that new log holds."""
    async def go() -> None:
        journals = make_journals()
        ql = QuorumLog("a", clients(journals, Down("c")), MEMBERS)
        await ql.recover(epoch_start)
        rec = (ql.last + 1, b"acked")
        await ql.append([rec])  # on a and b
        await ql.close()
        cand = QuorumLog("c", {"a": FakeClient(journals["a"], Down("a")),
                               "b": WipeOnce(journals, "b", "read", ql.committed),
                               "c": FakeClient(journals["c"], Faults())}, MEMBERS)
        with pytest.raises(QuorumLost, match="re-formatted"):
            await cand.recover(epoch_start)
        await cand.close()
        assert rec not in journals["c"].log.records
        await _recover_and_check(journals, [rec], "a", Faults())
    asyncio.run(go())


def test_a_deposed_leader_cannot_make_a_wiped_journal_count() -> None:
    """a leads (epoch 1); c takes epoch 2 with b and acknowledges a record on b and c. b
    is wiped; a, deposed but unaware, re-adds and levels it with its own (older) log. b
    must stay joining: a cannot confirm its epoch on a majority of the others (c refuses),
    so b never counts with a log that lacks c's record."""
    async def go() -> None:
        journals = make_journals()
        old = QuorumLog("a", clients(journals, Faults()), MEMBERS, background=False)
        await old.recover(epoch_start)
        await old.append([(old.last + 1, b"old")])
        new = QuorumLog("c", clients(journals, Down("a")), MEMBERS, background=False)
        await new.recover(epoch_start)
        rec = (new.last + 1, b"acked by c")
        await new.append([rec])  # on b and c
        await new.close()
        journals["b"] = Journal("b", MemLog(), MemMeta())  # wiped
        old.clients["b"] = FakeClient(journals["b"], Faults())
        await old.format_member("b")
        with pytest.raises(Fenced):
            await old.catch_up_step("b")
        assert journals["b"].joining is not None
        await old.close()
        # c down: a and b must not recover (b is joining) rather than lose the record
        ql = QuorumLog("a", clients(clone(journals), Down("c")), MEMBERS)
        with pytest.raises(QuorumLost):
            await ql.recover(epoch_start)
        await ql.close()
        await _recover_and_check(journals, [rec], "a", Faults())
    asyncio.run(go())
