"""The model test of a master set: a Hypothesis state machine over three in-memory
journals with leader changes on any member, RPCs lost or torn (a crash before a group's
fdatasync keeps part of it), members crashing (their calls fail until they restart), a
wiped disk (an unformatted journal) and its re-add. After every transition: a new leader,
on any formatted member and with any one other member down, recovers every acknowledged
record at its ticket."""

from __future__ import annotations

import asyncio
import os
import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from squall.master.ha.journal import Journal, MemLog, MemMeta
from squall.master.ha.quorum import QuorumLog, QuorumLost
from tests.test_ha_quorum import (
    MEMBERS,
    Down,
    FakeClient,
    Faults,
    clone,
    epoch_start,
    make_journals,
)

member = st.sampled_from(MEMBERS)


class Crashed(Faults):
    """Random lost/torn RPCs, and every call to a crashed member fails."""

    def __init__(self, rng: random.Random, p: float) -> None:
        super().__init__(rng=rng, p=p)
        self.down: set[str] = set()

    def mode(self, m: str) -> str | None:
        if m in self.down:
            return "before"
        return super().mode(m)


class MasterSetMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.journals = make_journals()
        self.cluster = self.journals["a"].cluster or ""
        self.faults = Crashed(random.Random(0), 0.0)
        self.ql: QuorumLog | None = None
        self.acked: list[tuple[int, bytes]] = []
        self.epochs: list[int] = []
        self.n = 0

    def _clients(self) -> dict[str, FakeClient]:
        return {m: FakeClient(j, self.faults) for m, j in self.journals.items()}

    def _drop_leader(self) -> None:
        if self.ql is not None:
            asyncio.run(self.ql.close())
            self.ql = None

    @rule(m=member, seed=st.integers(0, 1 << 16), p=st.sampled_from([0.0, 0.1, 0.3]))
    def new_leader(self, m: str, seed: int, p: float) -> None:
        self._drop_leader()
        self.faults.rng, self.faults.p = random.Random(seed), p
        ql = QuorumLog(m, self._clients(), MEMBERS)

        async def go() -> int:
            return await ql.recover(epoch_start)
        try:
            self.epochs.append(asyncio.run(go()))
            self.ql = ql
        except QuorumLost:
            asyncio.run(ql.close())

    @rule(k=st.integers(1, 3))
    def write(self, k: int) -> None:
        ql = self.ql
        if ql is None:
            return
        self.n += 1
        recs = [(ql.last + 1 + i, b"%d-%d" % (self.n, i)) for i in range(k)]

        async def go() -> None:
            await ql.append(recs)
        try:
            asyncio.run(go())
            self.acked.extend(recs)
        except QuorumLost:
            self._drop_leader()

    @rule(m=member)
    def crash(self, m: str) -> None:
        """A member crashes: what it fsynced stays (its journal reopens from it)."""
        self.faults.down.add(m)
        j = self.journals[m]
        self.journals[m] = Journal(m, j.log, j.meta_store)
        if self.ql is not None and self.ql.me == m:
            self._drop_leader()

    @rule(m=member)
    def restart(self, m: str) -> None:
        self.faults.down.discard(m)

    @rule(m=member)
    def wipe(self, m: str) -> None:
        """A member's disk is replaced: it comes back unformatted."""
        self.journals[m] = Journal(m, MemLog(), MemMeta())
        self.faults.down.discard(m)
        if self.ql is not None and self.ql.me == m:
            self._drop_leader()
        elif self.ql is not None:
            self.ql.clients[m] = FakeClient(self.journals[m], self.faults)

    @rule(m=member)
    def re_add(self, m: str) -> None:
        """The operator re-adds an unformatted member (through the leader)."""
        if self.ql is None or self.journals[m].cluster is not None:
            return
        self.journals[m].format(self.cluster, 0)

    @invariant()
    def acknowledged_survive(self) -> None:
        assert self.epochs == sorted(set(self.epochs))
        formatted = [m for m in MEMBERS if self.journals[m].cluster is not None]
        if len(formatted) < 2:
            return  # no majority: nothing can lead (and nothing is lost by that)
        for me in formatted:
            for down in [None, *[d for d in MEMBERS if d != me]]:
                copy = clone(self.journals)
                ql = QuorumLog(me, {m: FakeClient(j, Down(down) if down else Faults())
                                    for m, j in copy.items()}, MEMBERS)

                async def go(q: QuorumLog = ql) -> None:
                    try:
                        await q.recover(epoch_start)
                    finally:
                        await q.close()
                try:
                    asyncio.run(go())
                except QuorumLost:
                    continue  # a majority of formatted journals is not reachable
                held = dict(copy[me].log.records)
                lost = [r for r in self.acked if held.get(r[0]) != r[1]]
                assert not lost, (me, down, lost[:3])

    def teardown(self) -> None:
        self._drop_leader()


MasterSetMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("SQUALL_MODEL_EXAMPLES", "30")), stateful_step_count=30,
    deadline=None, suppress_health_check=list(HealthCheck))
TestMasterSet = MasterSetMachine.TestCase
