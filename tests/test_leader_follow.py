"""Clients and data nodes follow the leader of a master set (common/masters.py): a real
master behind stand-in members (tests/leader_kit.py) that answer as a standby does, or
forward to the master as its leader."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import httpx
import pytest

from squall.client import AsyncClient, Client
from squall.client._effects import ConnectError
from squall.common.errors import SquallError, TransportError, Unavailable
from squall.common.masters import Masters, Standby, parse_masters, standby_leader
from tests.helpers import MasterProcess, free_port, running_app, start_cluster, wait_for
from tests.leader_kit import Member


@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterProcess]:
    # made-up payload references are not needed: these tests put tasks without payloads
    m = MasterProcess(str(tmp_path_factory.mktemp("follow") / "master")).start()
    try:
        yield m
    finally:
        m.stop()


@contextlib.contextmanager
def member(target: str | None = None, role: str = "standby", leader: str | None = None
           ) -> Iterator[Member]:
    m = Member(target, role, leader)
    with running_app(m) as url:
        m.url = url
        yield m


def dead_address() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there: connection refused


def drain(c: Client, queue: str) -> list[str]:
    pids: list[str] = []
    while True:
        got = c.lease(queue, 100, 30)
        if not got:
            return pids
        pids += [t.pid for t in got]
        c.done(got)


# -- the address list and the standby's answer -----------------------------------------------
def test_addresses_parse_one_or_several() -> None:
    assert parse_masters("http://a:1") == ("http://a:1",)
    assert parse_masters(" http://a:1/, http://b:2 ,,http://a:1") == ("http://a:1", "http://b:2")
    assert parse_masters(["http://a:1", "https://b:2/"]) == ("http://a:1", "https://b:2")
    with pytest.raises(ValueError, match="a master address must be a string"):
        parse_masters(["http://a:1", 7])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="no master"):
        Masters("", None)
    # refused at once: a connection that can never be made is not retried for a minute
    for bad in ("localhost:7070", "ftp://a:21", "http://", "http://a:port", "unix:/run/s"):
        with pytest.raises(ValueError, match="an http\\(s\\) URL such as"):
            parse_masters(f"http://a:1,{bad}")
    with pytest.raises(ValueError, match="an http\\(s\\) URL"):
        Client("http://a:1,ftp://b:2")
    m = Masters("http://a:1,http://b:2")
    assert m.follow("http://a:1", "http://b:2/") == "http://b:2" and m.current == "http://b:2"
    assert m.follow("http://b:2", "http://b:2") is None  # names itself: nobody new
    assert m.advance("http://b:2") == "http://a:1"
    assert m.advance("http://b:2") == "http://a:1"  # another request moved on already
    assert m.follow("http://a:1", "http://c:3") == "http://c:3" and len(m) == 3  # learned
    assert m.has_origin(("http", "c", 3)) and not m.has_origin(("http", "d", 3))


def test_standby_answers_are_told_from_other_503s() -> None:
    assert standby_leader(503, {"X-Squall-Leader": "http://l:1"}, None) == (True, "http://l:1")
    assert standby_leader(503, {}, {"detail": "standby", "leader": None}) == (True, None)
    assert standby_leader(503, {"x-squall-leader": "http://l:1/"}, {"leader": None}) == (
        True, "http://l:1")
    assert standby_leader(503, {}, {"error": {"code": "unavailable"}}) == (False, None)
    assert standby_leader(200, {"X-Squall-Leader": "http://l:1"}, {}) == (False, None)
    assert standby_leader(503, {"X-Squall-Leader": "javascript:x"}, None) == (True, None)


def test_one_address_behaves_as_before(master: MasterProcess) -> None:
    with Client(master.url + "/") as c:
        assert c.master == master.url and not c.masters.several
        c.put("one#q", pid="p1")
        assert drain(c, "one#q") == ["p1"]


# -- the client ------------------------------------------------------------------------------
def test_standby_names_the_leader_sync(master: MasterProcess) -> None:
    with member(leader=master.url) as s, Client(s.url, retries=0) as c:
        # one address, a standby's: the client learns the leader's address from its answer
        r = c.put("sync#q", pid="a")
        assert not r.collapsed
        assert c.masters.current == master.url and s.refused() == 1
        c.put("sync#q", pid="b")
        assert sorted(drain(c, "sync#q")) == ["a", "b"]
        assert s.refused() == 1  # the address that answered last is kept
        assert c.ready()  # asks the member asked, the leader now


async def test_standby_names_the_leader_async(master: MasterProcess) -> None:
    with member(leader=master.url) as s:
        async with AsyncClient([dead_address(), s.url], retries=0) as c:
            await c.put("async#q", pid="a")  # refused connection -> standby -> leader
            assert c.masters.current == master.url and s.refused() == 1
            got = await c.lease("async#q", 10, 30)
            assert [t.pid for t in got] == ["a"]
            await c.done(got)
            assert s.refused() == 1


def test_a_standby_that_knows_no_leader_sends_to_the_next(master: MasterProcess) -> None:
    with member(leader=None) as s, Client([s.url, master.url], retries=0) as c:
        c.put("next#q", pid="x")
        assert c.masters.current == master.url and s.refused() == 1
        assert drain(c, "next#q") == ["x"]


def test_no_leader_anywhere_is_unavailable_under_the_retry_budget() -> None:
    with member(leader=None) as s, member(leader=None) as t, \
            Client([s.url, t.url], retries=2, retry_budget_s=1.0) as c:
        with pytest.raises(Standby) as e:
            c.put("none#q", pid="x")
        assert isinstance(e.value, Unavailable) and e.value.leader is None
        assert "no leader is known" in str(e.value)
        # one round of the addresses per attempt: 3 attempts, 2 addresses
        assert s.refused() + t.refused() == 6
    with Client([dead_address(), dead_address()], retries=1, retry_budget_s=1.0) as c, \
            pytest.raises(ConnectError):
        c.put("none#q", pid="x")


def test_failover_applies_every_enqueue_once(master: MasterProcess) -> None:
    """A, the leader, becomes a standby naming B; then B loses an answer after the master
    applied the put; then A goes away. Every put is applied once, none lost."""
    with member(master.url, "leader") as a, member(master.url, "standby") as b:
        b.set("standby", a.url)
        with Client([a.url, b.url], retries=10) as c:
            pids = [c.put("fo#q").pid for _ in range(5)]
            assert c.masters.current == a.url and b.count("/v1/groups") == 0
            a.set("standby", b.url)
            b.set("leader")
            pids += [c.put("fo#q").pid for _ in range(5)]
            assert c.masters.current == b.url and a.refused("/v1/groups") == 1
            b.drop_after_apply = 1  # applied, its answer lost: resent (client-made pid)
            r = c.put("fo#q")
            pids.append(r.pid)
            assert b.drop_after_apply == 0
            # a non-idempotent call whose answer is lost is not resent: the caller is told
            b.drop_after_apply = 1
            with pytest.raises(TransportError):
                c.lease("fo#other", 1, 30)
        with Client([a.url, b.url], retries=10) as c2:
            got = drain(c2, "fo#q")
    assert sorted(got) == sorted(pids) and len(set(pids)) == 11


async def test_async_client_follows_a_failover(master: MasterProcess) -> None:
    with member(master.url, "leader") as a, member(master.url, "standby") as b:
        b.set("standby", a.url)
        async with AsyncClient(f"{a.url},{b.url}", retries=10) as c:
            await c.put("afo#q", pid="1")
            a.set("standby", b.url)
            b.set("leader")
            await c.put("afo#q", pid="2")
            assert c.masters.current == b.url
            got = await c.lease("afo#q", 10, 30)
            await c.done(got)
            assert sorted(t.pid for t in got) == ["1", "2"]


def test_a_member_gone_sends_the_client_on(master: MasterProcess) -> None:
    with member(master.url, "leader") as b:
        with member(master.url, "leader") as a, Client([a.url, b.url], retries=5) as c:
            c.put("gone#q", pid="1")
            assert c.masters.current == a.url
        # a is stopped now: connection refused
        with Client([a.url, b.url], retries=5) as c2:
            c2.put("gone#q", pid="2")
            assert c2.masters.current == b.url
            assert sorted(drain(c2, "gone#q")) == ["1", "2"]


def test_the_credential_goes_to_masters_only(master: MasterProcess) -> None:
    seen: list[str | None] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={})

    with Client(["http://m1:1", "http://m2:2"], token="tok",
                transport=httpx.MockTransport(record)) as c:
        c._run(c._core._call("GET", "/v1/x"))  # a master's path
        c._run(c._core._call("GET", "http://datanode:3/v1/x"))  # not a master
    assert seen == ["Bearer tok", None]


# -- the data node ---------------------------------------------------------------------------
def forwarded(m: Member, path: str) -> int:
    """Requests under `path` that `m` forwarded to the master as the leader (answered 200)."""
    with m.lock:
        return sum(1 for _m, p, st in m.hits if p.startswith(path) and st == 200)


def test_data_node_heartbeats_and_commits_follow_the_leader(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cluster = start_cluster(tmp_path / "c", 2)
    try:
        with member(cluster.master_url, "leader") as a, member(cluster.master_url) as b, \
                Client(cluster.master_url, token=cluster.admin) as c:
            b.set("standby", a.url)
            cluster.kill_node(1)
            # a dead address, a standby naming the leader, then the leader
            cluster.start_node(1, master=f"{dead_address()},{b.url},{a.url}")

            def beat_through(m: Member, n: int) -> None:
                wait_for(lambda: forwarded(m, "/v1/nodes/heartbeat") >= n, 60,
                         what=f"{n} heartbeats through {m.url}")

            beat_through(a, 2)
            assert b.refused("/v1/nodes/heartbeat") >= 1
            refused_before = b.refused("/v1/nodes/heartbeat")
            beat_through(a, forwarded(a, "/v1/nodes/heartbeat") + 2)
            assert b.refused("/v1/nodes/heartbeat") == refused_before  # it stays with a
            # failover: a becomes a standby naming b, which leads now
            a.set("standby", b.url)
            b.set("leader")
            beat_through(b, 2)
            node = [x for x in c.cluster().nodes if x.address == cluster.node_url(1)]
            assert node and node[0].state == "alive"
            # front-door puts through both nodes: node 1 takes blocks and commits through b
            for i in range(20):
                c.put("dn#q", b"x" * 100, pid=f"p{i:02}")
            assert c.stats("dn#q").available == 20
            assert forwarded(b, "/v1/nodes/commit") >= 1
            assert forwarded(a, "/v1/nodes/commit") == 0
    finally:
        cluster.stop()


def test_errors_are_squall_errors() -> None:
    assert issubclass(Standby, SquallError)


def test_spark_takes_several_masters() -> None:
    from squall.client.spark._conn import resolve

    assert resolve({"master": ["http://a:1", "http://b:2"]}, env={})[0] == "http://a:1,http://b:2"
    assert resolve({}, {"spark.squall.master": "http://a:1,http://b:2"}, env={})[0] == \
        "http://a:1,http://b:2"
    assert resolve({}, {}, env={"SQUALL_MASTER": "http://a:1,http://b:2"})[0] == \
        "http://a:1,http://b:2"
    with Client(resolve({"master": ("http://a:1", "http://b:2")}, env={})[0]) as c:
        assert c.masters.addresses == ("http://a:1", "http://b:2")


def test_a_data_node_finds_a_new_leader_without_waiting_for_its_period(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A new leader places payloads only on nodes it heard from: during a failover a node
    beats again within a fraction of a second (not its 30 s period, doubled), and when its
    front door's requests move to a new leader it beats there at once."""
    cluster = start_cluster(tmp_path / "c", 2, heartbeat_interval_s=30.0)
    try:
        with member(cluster.master_url) as a, member(cluster.master_url) as b, \
                Client(cluster.master_url, token=cluster.admin) as c:
            cluster.kill_node(1)
            cluster.start_node(1, master=f"{a.url},{b.url}")  # no member leads yet
            wait_for(lambda: a.refused("/v1/nodes/heartbeat") >= 3, 20,
                     what="the node's beats retried while no member leads")
            a.set("leader")
            wait_for(lambda: forwarded(a, "/v1/nodes/heartbeat") >= 1, 20,
                     what="a beat through the member that now leads")
            beats = forwarded(a, "/v1/nodes/heartbeat")
            # a failover: a is a standby naming b; the node learns it from its commits
            a.set("standby", b.url)
            b.set("leader")
            for i in range(20):
                c.put("dn#moved", b"x" * 100, pid=f"p{i:02}")
            assert forwarded(b, "/v1/nodes/commit") >= 1
            wait_for(lambda: forwarded(b, "/v1/nodes/heartbeat") >= 1, 20,
                     what="a beat through the new leader, at once")
            assert forwarded(a, "/v1/nodes/heartbeat") == beats
    finally:
        cluster.stop()
