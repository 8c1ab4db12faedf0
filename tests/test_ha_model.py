"""The model test of a master set: a Hypothesis state machine over three in-memory
journals with leader changes on any member, RPCs lost or torn (a crash before a group's
fdatasync keeps part of it), members crashing (their calls fail until they restart), a
wiped disk (an unformatted journal), its re-add through the leader (a joining journal) and
its catch-up. After every transition: a new leader, on any formatted member and with any
one other member down, recovers every acknowledged record at its ticket; and it does
recover whenever it and one other member are formatted and caught up (not joining).

Catch-up runs only when the `catch_up` rule says so (``background=False``): no timer
decides how far a background task got, so every example replays the same."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from squall.master.ha.journal import Journal, MemLog, MemMeta, Refused
from squall.master.ha.quorum import QuorumLog, QuorumLost, Unreachable
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

    @initialize(m=member)
    def first_leader(self, m: str) -> None:
        self.new_leader(m, 0, 0.0)

    @rule(m=member, seed=st.integers(0, 1 << 16), p=st.sampled_from([0.0, 0.1, 0.3]))
    def new_leader(self, m: str, seed: int, p: float) -> None:
        self._drop_leader()
        self.faults.rng, self.faults.p = random.Random(seed), p
        ql = QuorumLog(m, self._clients(), MEMBERS, background=False)

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
        elif self.ql is not None:  # the leader's next calls reach the restarted journal
            self.ql.clients[m] = FakeClient(self.journals[m], self.faults)

    @rule(m=member)
    def restart(self, m: str) -> None:
        self.faults.down.discard(m)

    @rule(m=member)
    def wipe(self, m: str) -> None:
        """A member's disk is replaced: it comes back unformatted. One disk at a time: the
        other two hold their logs and are caught up (a lost majority of disks loses what
        only they held, in any quorum system; a joining journal holds nothing yet)."""
        if any(self.journals[o].cluster is None or self.journals[o].joining is not None
               for o in MEMBERS if o != m):
            return
        self.journals[m] = Journal(m, MemLog(), MemMeta())
        self.faults.down.discard(m)
        if self.ql is not None and self.ql.me == m:
            self._drop_leader()
        elif self.ql is not None:
            self.ql.clients[m] = FakeClient(self.journals[m], self.faults)

    @rule()
    def re_add(self) -> None:
        """The operator re-adds the unformatted (wiped) member: the leader formats it (as
        `squall master members add` does), joining until caught up to its committed
        ticket."""
        ql = self.ql
        if ql is None:
            return
        for m in MEMBERS:
            if self.journals[m].cluster is not None:
                continue

            async def go(m: str = m) -> None:
                await ql.format_member(m)
            with contextlib.suppress(Refused, Unreachable):  # lost: the operator retries
                asyncio.run(go())

    @rule(m=member)
    def catch_up(self, m: str) -> None:
        """The leader brings a lagging (or re-added) journal level; it counts again."""
        ql = self.ql
        if ql is None:
            return

        async def go() -> None:
            await ql.catch_up_step(m)
        with contextlib.suppress(Refused, Unreachable, QuorumLost):
            asyncio.run(go())
        if ql.failed is not None:  # fenced: this leadership is over
            self._drop_leader()

    @invariant()
    def acknowledged_survive(self) -> None:
        assert self.epochs == sorted(set(self.epochs))
        formatted = [m for m in MEMBERS if self.journals[m].cluster is not None]
        if len(formatted) < 2:
            return  # no majority: nothing can lead (and nothing is lost by that)
        counting = {m for m in formatted if self.journals[m].joining is None}
        for me in formatted:
            for down in [None, *[d for d in MEMBERS if d != me]]:
                copy = clone(self.journals)
                ql = QuorumLog(me, {m: FakeClient(j, Down(down) if down else Faults())
                                    for m, j in copy.items()}, MEMBERS, background=False)
                # a caught-up member with another caught-up one reachable must lead
                must = me in counting and len(counting - {down}) >= 2

                async def go(q: QuorumLog = ql) -> None:
                    try:
                        await q.recover(epoch_start)
                    finally:
                        await q.close()
                try:
                    asyncio.run(go())
                except QuorumLost as e:
                    assert not must, (me, down, f"recovery failed: {e}")
                    continue  # no majority of caught-up journals is reachable
                held = dict(copy[me].log.records)
                lost = [r for r in self.acked if held.get(r[0]) != r[1]]
                assert not lost, (me, down, lost[:3])

    def teardown(self) -> None:
        self._drop_leader()


MasterSetMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("SQUALL_MODEL_EXAMPLES", "30")), stateful_step_count=30,
    deadline=None, suppress_health_check=list(HealthCheck))
TestMasterSet = MasterSetMachine.TestCase
