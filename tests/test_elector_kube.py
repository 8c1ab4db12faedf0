"""The Kubernetes Lease elector (master/ha/kube.py) against a stand-in for the API
server's Lease API (tests/kube_standin.py)."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from squall.master.ha import kube
from squall.master.ha.elector import make_elector
from squall.master.ha.kube import KubeLeaseElector, micro_time
from tests.helpers import free_port, running_app
from tests.kube_standin import LeaseApi

A, B, C = "http://squall-master-0.squall-master:7070", "http://m1:7070", "http://m2:7070"
NS, NAME, LEASE = "squall", "squall-master", 2
MICRO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


@pytest.fixture
def api() -> Iterator[tuple[LeaseApi, str]]:
    standin = LeaseApi()
    with running_app(standin) as url:
        yield standin, url


class FakeMonotonic:
    """The Kubernetes elector's monotonic clock, moved by the test (``time.time``, the
    records' timestamps, stays real)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return time.time()

    def advance(self, secs: float) -> None:
        self.now += secs


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeMonotonic:
    c = FakeMonotonic()
    monkeypatch.setattr(kube, "time", c)  # the module's clock, not the test process's
    return c


@pytest.fixture
def token_file(tmp_path: Path) -> str:
    p = tmp_path / "token"
    p.write_text("sa-token\n")
    return str(p)


def elector(url: str, token_file: str, lease: int = LEASE) -> KubeLeaseElector:
    return KubeLeaseElector.from_spec(f"{NS}/{NAME}?lease={lease}&api={url}"
                                      f"&token_file={token_file}&timeout=2")


async def closing(*es: KubeLeaseElector) -> None:
    for e in es:
        await e.close()


def test_spec_forms(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    e = KubeLeaseElector.from_spec("ns/name?lease=7&api=http://127.0.0.1:1&token_file=/x")
    assert (e.namespace, e.name, e.lease_secs, e.api) == ("ns", "name", 7.0, "http://127.0.0.1:1")
    assert e.path == "/apis/coordination.k8s.io/v1/namespaces/ns/leases/name"
    assert e.kind == "kubernetes" and e.http.timeout_s == pytest.approx(7 / 3)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(ValueError, match="not in a pod"):
        KubeLeaseElector.from_spec("ns/name")  # no API server known
    with pytest.raises(ValueError, match="give the namespace"):
        KubeLeaseElector.from_spec("name?api=http://h:1")
    with pytest.raises(ValueError, match="unknown option"):
        KubeLeaseElector.from_spec("ns/name?ttl=3&api=http://h:1")
    with pytest.raises(ValueError, match="whole seconds"):
        KubeLeaseElector.from_spec("ns/name?lease=1.5&api=http://h:1")
    with pytest.raises(ValueError, match="at least 1"):
        KubeLeaseElector.from_spec("ns/name?lease=0&api=http://h:1")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    e = make_elector("kubernetes:ns/name")
    assert isinstance(e, KubeLeaseElector) and e.api == "https://10.0.0.1:6443"
    assert e.lease_secs == 10.0


async def test_first_member_creates_the_lease_as_client_go_does(
        api: tuple[LeaseApi, str], token_file: str) -> None:
    standin, url = api
    a = elector(url, token_file)
    try:
        assert await a.holder() is None
        assert await a.try_acquire(A)
        lease = standin.lease(NS, NAME)
        assert lease is not None
        spec = lease["spec"]
        assert spec["holderIdentity"] == A and spec["leaseDurationSeconds"] == LEASE
        assert spec["leaseTransitions"] == 0 and spec["acquireTime"] == spec["renewTime"]
        assert MICRO.match(spec["renewTime"]) and MICRO.match(micro_time(0))
        assert standin.statuses("POST") == [201]
        rv = lease["metadata"]["resourceVersion"]
        assert await a.try_acquire(A)  # a renewal: an update on that resourceVersion
        renewed = standin.lease(NS, NAME)
        assert renewed is not None and renewed["metadata"]["resourceVersion"] != rv
        assert renewed["spec"]["acquireTime"] == spec["acquireTime"]
        assert renewed["spec"]["leaseTransitions"] == 0
        assert standin.statuses("PUT") == [200]
        assert await a.holder() == A
    finally:
        await closing(a)


async def test_two_compete_exactly_one_holds(api: tuple[LeaseApi, str], token_file: str,
                                             clock: FakeMonotonic) -> None:
    standin, url = api
    a, b = elector(url, token_file, lease=10), elector(url, token_file, lease=10)
    try:
        got = await asyncio.gather(a.try_acquire(A), b.try_acquire(B))
        assert sorted(got) == [False, True]
        first = A if got[0] else B
        # renewed every 4 s of the electors' clock, the holder keeps its 10 s lease well
        # past its length; the other never takes it
        for _ in range(5):
            clock.advance(4)
            got = await asyncio.gather(a.try_acquire(A), b.try_acquire(B))
            assert got == [first == A, first == B]
        assert await a.holder() == first
        # an AlreadyExists (409 on create) or the holder seen renewing: never both
        assert standin.statuses("POST").count(201) == 1
    finally:
        await closing(a, b)


async def test_a_conflict_means_someone_else_won(api: tuple[LeaseApi, str], token_file: str
                                                 ) -> None:
    standin, url = api
    a, b = elector(url, token_file), elector(url, token_file)
    try:
        assert await a.try_acquire(A)
        # b's update lands after another writer's (c's) that it did not read: 409
        await a.release(A)
        standin.before_put = lambda: standin.write_holder(NS, NAME, C)
        assert not await b.try_acquire(B)
        assert standin.statuses("PUT")[-1] == 409
        assert await b.holder() == C
    finally:
        await closing(a, b)


async def test_expiry_hands_over(api: tuple[LeaseApi, str], token_file: str,
                                 clock: FakeMonotonic) -> None:
    standin, url = api
    a, b = elector(url, token_file), elector(url, token_file)
    try:
        assert await a.try_acquire(A)
        assert not await b.try_acquire(B)  # b saw a's record now: it waits a whole lease
        # a stops renewing (dead, paused); b takes over once the record stood still a lease
        # by b's own clock, not before
        clock.advance(LEASE * 0.9)
        assert not await b.try_acquire(B)
        clock.advance(LEASE * 0.1 + 0.001)
        assert await b.try_acquire(B)
        lease = standin.lease(NS, NAME)
        assert lease is not None and lease["spec"]["holderIdentity"] == B
        assert lease["spec"]["leaseTransitions"] == 1
        assert not await a.try_acquire(A)  # a is back: b renewed less than a lease ago
    finally:
        await closing(a, b)


async def test_release_hands_over_at_once(api: tuple[LeaseApi, str], token_file: str) -> None:
    standin, url = api
    a, b = elector(url, token_file, lease=30), elector(url, token_file, lease=30)
    try:
        assert await a.try_acquire(A) and not await b.try_acquire(B)
        await b.release(B)  # not its to release: nothing changes
        assert await a.holder() == A
        await a.release(A)
        lease = standin.lease(NS, NAME)
        assert lease is not None and lease["spec"]["holderIdentity"] == ""
        assert await a.holder() is None
        assert await b.try_acquire(B) and await a.holder() == B
        assert not await a.try_acquire(A)
    finally:
        await closing(a, b)


async def test_failures_are_false_never_raise(api: tuple[LeaseApi, str], token_file: str,
                                             tmp_path: Path) -> None:
    standin, url = api
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token")
    dead = elector(f"http://127.0.0.1:{free_port()}", token_file)
    unauthorized = elector(url, str(wrong))
    a = elector(url, token_file)
    try:
        assert await dead.try_acquire(A) is False and await dead.holder() is None
        await dead.release(A)
        assert await unauthorized.try_acquire(A) is False
        assert "Unauthorized" in unauthorized.last_error
        assert await a.try_acquire(A)
        for code in (500, 503, 403):
            standin.fail_with = code
            assert await a.try_acquire(A) is False
            assert await a.holder() is None
            assert f"HTTP {code}" in a.last_error
        standin.fail_with = None
        assert await a.try_acquire(A)  # back: still its own
    finally:
        await closing(dead, unauthorized, a)
