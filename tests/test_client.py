"""The client library against an in-process master (ASGI) and a real master process: every
verb, the public surface, and that Client and AsyncClient expose the same verbs."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

import squall.client as sc
from squall.client import AsyncClient, Client, NewTask
from squall.client._tasks import is_fifo_pid
from squall.common.clock import ManualClock
from squall.master.http.app import create_master_app
from squall.master.service import MasterSettings
from tests.helpers import MasterProcess

EXPORTS = {
    "AsyncBatches", "AsyncClient", "AsyncLeasedTask", "AsyncTransaction", "Backoff",
    "BadRequest", "Batches", "Client",
    "Conflict", "ConnectError", "DataCorrupt", "Forbidden", "InsufficientStorage",
    "LeaseError", "LeaseLost", "LeasedTask", "NewTask", "NotFound", "OutcomeUnknown",
    "Overloaded",
    "PayloadTooLarge", "Policy", "Retry", "Schedule", "ServerError", "SquallError",
    "StatusError", "TLSConfig", "Transaction", "TransportError", "Unauthorized", "Unavailable",
    "Worker",
    "fifo_pid", "may_have_applied",
}


def test_public_surface() -> None:
    assert set(sc.__all__) == EXPORTS
    for name in sc.__all__:
        assert getattr(sc, name) is not None
    assert issubclass(sc.LeaseLost, sc.Conflict) and issubclass(sc.ConnectError,
                                                                sc.TransportError)


def _verbs(cls: type) -> dict[str, inspect.Signature]:
    return {n: inspect.signature(f) for n, f in vars(cls).items()
            if not n.startswith("_") and callable(f)}


@pytest.mark.parametrize(("sync", "asyn"), [(sc.Client, sc.AsyncClient),
                                            (sc.LeasedTask, sc.AsyncLeasedTask),
                                            (sc.Transaction, sc.AsyncTransaction),
                                            (sc.Batches, sc.AsyncBatches)])
def test_sync_and_async_surfaces_match(sync: type, asyn: type) -> None:
    s, a = _verbs(sync), _verbs(asyn)
    assert set(s) == set(a)
    for name in s:
        ps = [(p.name, p.kind, p.default) for p in s[name].parameters.values()]
        pa = [(p.name, p.kind, p.default) for p in a[name].parameters.values()]
        assert ps == pa, name


@pytest.fixture
async def aclient(tmp_path) -> AsyncIterator[tuple[AsyncClient, ManualClock]]:  # type: ignore[no-untyped-def]
    clock = ManualClock()
    app = create_master_app(MasterSettings(data_dir=str(tmp_path / "m")), clock=clock,
                            background=False)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), \
            AsyncClient("http://127.0.0.1", transport=transport, worker="test-worker") as c:
        yield c, clock


async def test_put_lease_done(aclient: tuple[AsyncClient, ManualClock]) -> None:
    c, _ = aclient
    r = await c.put("crawl#fetch", pid="b")
    assert (r.queue, r.pid, r.collapsed) == ("crawl#fetch", "b", False)
    assert (await c.put("crawl#fetch", pid="b")).collapsed
    await c.put("crawl#fetch", pid="a")
    fifo = await c.put("crawl#fetch")
    assert is_fifo_pid(fifo.pid) and not fifo.collapsed
    tasks = await c.lease("crawl#fetch", max_tasks=10, lease_secs=30, done=None)
    assert [t.pid for t in tasks] == [fifo.pid, "a", "b"]  # digits sort first
    t = tasks[0]
    assert t.queue == "crawl#fetch" and t.attempts == 1 and not t.has_payload
    assert await t.payload() == b""
    renewed = await t.renew(120)
    assert renewed.renewed[0].queue == "crawl#fetch"
    await t.done()
    with pytest.raises(sc.NotFound):
        await t.done()
    await c.release(tasks[1], delay=100)
    info = await c.task("crawl#fetch", "a")
    assert info.state == "delayed"
    await c.release(tasks[2], error="boom")
    assert (await c.task("crawl#fetch", "b")).error == "boom"
    with pytest.raises(sc.LeaseLost):
        await tasks[2].renew()


async def test_fifo_pids_keep_order(aclient: tuple[AsyncClient, ManualClock]) -> None:
    c, _ = aclient
    n = await c.put_many("q", [None] * 250, batch_size=100)
    assert n == 250
    pids = [t.pid for t in await c.tasks("default#q", limit=1000)]
    assert len(pids) == 250 and pids == sorted(pids)
    got = await c.lease("q", 1000, 30)
    assert [t.pid for t in got] == pids


async def test_put_many_items_and_progress(aclient: tuple[AsyncClient, ManualClock]) -> None:
    c, _ = aclient
    seen: list[int] = []
    items = (NewTask(pid=f"p{i:03d}") for i in range(30))  # a generator: consumed lazily
    assert await c.put_many("g#q", items, batch_size=7,
                            progress=lambda res: seen.append(len(res))) == 30
    assert seen == [7, 7, 7, 7, 2]
    assert await c.put_many("g#q", [NewTask(pid="p001"), NewTask(pid="new")]) == 1
    with pytest.raises(sc.BadRequest):
        await c.put_many("g#q", [None], batch_size=0)


async def test_delay_and_not_before(aclient: tuple[AsyncClient, ManualClock]) -> None:
    c, clock = aclient
    await c.put("q", pid="later", delay=60)
    await c.put("q", pid="at", not_before=clock.now() + 30)
    assert await c.lease("q", 5) == []
    clock.advance(31)
    assert [t.pid for t in await c.lease("q", 5)] == ["at"]
    clock.advance(30)
    assert [t.pid for t in await c.lease("q", 5)] == ["later"]


async def test_max_pid(aclient: tuple[AsyncClient, ManualClock]) -> None:
    c, _ = aclient
    for p in ("2024-01", "2024-02", "2024-03"):
        await c.put("g#t", pid=p)
    got = await c.lease("g#t", 10, max_pid="2024-02")
    assert [t.pid for t in got] == ["2024-01", "2024-02"]


async def test_transaction_moves_atomically(aclient: tuple[AsyncClient, ManualClock]) -> None:
    c, _ = aclient
    await c.put("p#a", pid="x")
    [t] = await c.lease("p#a", 1)
    async with c.transaction() as tx:
        tx.dequeue(t)
        tx.put("p#b", pid="x2")
        tx.put("c")  # a bare name: in the transaction's group
    assert tx.result is not None and tx.result.dequeued == 1
    assert [e.queue for e in tx.result.enqueued] == ["p#b", "p#c"]
    assert t.finished
    # a stale token fails the whole update: nothing of it is applied
    await c.put("p#a", pid="y")
    [u] = await c.lease("p#a", 1)
    await c.reset_leases("p#a")
    tx2 = c.transaction("p")
    tx2.dequeue(u).put("b", pid="never")
    with pytest.raises(sc.LeaseLost):
        await tx2.commit()
    with pytest.raises(sc.NotFound):
        await c.task("p#b", "never")
    with pytest.raises(sc.BadRequest, match="one group"):
        c.transaction("p").put("other#q")


async def test_admin_verbs(aclient: tuple[AsyncClient, ManualClock]) -> None:
    c, clock = aclient
    await c.put_many("adm#q1", [NewTask(pid=f"{i}") for i in range(5)])
    await c.put("adm#q2", pid="z")
    names = [f"{q.group}#{q.queue}" for q in await c.queues("adm#")]
    assert names == ["adm#q1", "adm#q2"]
    assert [q.queue for q in await c.queues(group="adm", limit=1)] == ["q1"]
    s = await c.stats("adm#q1")
    assert s.total == 5
    total = await c.stats()
    assert total.available == 6
    assert [t.pid for t in await c.tasks("adm#q1", after="1", limit=2)] == ["2", "3"]
    assert [t.pid async for t in c.iter_tasks("adm#q1")] == ["0", "1", "2", "3", "4"]
    await c.lease("adm#q1", 2)
    assert (await c.reset_leases("adm#q1")).reset == 2
    assert (await c.delete("adm#q2")).deleted == 1
    assert (await c.stats("adm#q2")).total == 0
    with pytest.raises(sc.NotFound):
        await c.stats("adm#never")
    with pytest.raises(sc.BadRequest):
        await c.put("bad name#q")
    # policies: per queue and group default; dead letters and redrive
    await c.put("adm#d", pid="once")
    pol = await c.set_policy("adm#d", max_attempts=1)
    assert pol.max_attempts == 1
    assert (await c.policy("adm#d")).max_attempts == 1
    await c.set_policy("adm#", sc.Policy(lease_secs=42))
    assert (await c.policy("adm#")).lease_secs == 42
    assert await c.dead_letters("adm#d") == []
    [t] = await c.lease("adm#d", 1)
    await t.release(error="fatal")
    assert await c.dead_letter_queue("adm#d") == "adm#d.dead"
    [dead] = await c.dead_letters("adm#d")
    assert dead.pid == t.pid and "fatal" in (dead.error or "")
    assert (await c.redrive("adm#d")).moved == 1
    assert await c.dead_letters("adm#d") == []
    await c.delete_policy("adm#d")
    assert (await c.policy("adm#d")).max_attempts is None
    # schedules
    info = await c.set_schedule("adm#tick", queue="q3", interval_secs=60)
    assert info.name == "tick"
    assert [s.name for s in await c.schedules("adm")] == ["tick"]
    await c.delete_schedule("adm#tick")
    assert await c.schedules("adm") == []
    assert (await c.ready())["ok"]
    clock.advance(1)


# -- the blocking client against a real master process --------------------------------------
@pytest.fixture(scope="module")
def master(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterProcess]:
    m = MasterProcess(str(tmp_path_factory.mktemp("client") / "master")).start()
    try:
        yield m
    finally:
        m.stop()


def test_sync_client_verbs(master: MasterProcess) -> None:
    with Client(master.url) as c:
        assert c.put("s#a", pid="1").pid == "1"
        assert c.put_many("s#a", [NewTask(pid=str(i)) for i in range(2, 6)]) == 4
        tasks = c.lease("s#a", 3, 30)
        assert [t.pid for t in tasks] == ["1", "2", "3"]
        with c.transaction() as tx:
            tx.dequeue(tasks[0]).put("s#b", pid="1")
        tasks[1].done()
        tasks[2].release(delay=60)
        assert tasks[2].finished
        assert c.task("s#a", "3").state == "delayed"
        assert [t.pid for t in c.iter_tasks("s#a")] == ["3", "4", "5"]
        assert c.tasks("s#b")[0].pid == "1"
        assert c.stats("s#a").completed == 2
        c.renew(c.lease("s#a", 1), 10)
        with pytest.raises(sc.NotFound):
            c.task("s#a", "2")


def test_sync_put_many_waves_from_threads_share_one_pool(master: MasterProcess) -> None:
    """put_many's waves of batches run on one thread pool for the client's life, from
    several user threads at once; close() stops it."""
    import threading

    with Client(master.url) as c:
        before = {t.name for t in threading.enumerate()}
        counts: list[int] = []

        def produce(k: int) -> None:
            counts.append(c.put_many(f"pool#q{k}", [None] * 230, batch_size=20, in_flight=4))

        users = [threading.Thread(target=produce, args=(k,)) for k in range(3)]
        for u in users:
            u.start()
        for u in users:
            u.join(60)
        assert counts == [230, 230, 230]
        assert sum(len(c.tasks(f"pool#q{k}", limit=1000)) for k in range(3)) == 690
        pool = {t for t in threading.enumerate() if t.name.startswith("squall-gather")}
        assert pool and len(pool) <= 16  # one pool, bounded, kept between waves
        assert c.put_many("pool#q0", [None] * 80, batch_size=20, in_flight=4) == 80
        again = {t for t in threading.enumerate() if t.name.startswith("squall-gather")}
        assert pool <= again and len(again) <= 16  # the same pool, still bounded
        assert not {t.name for t in pool} & before
    assert not any(t.is_alive() for t in pool)  # closed with the client


def test_errors_are_squall_errors(master: MasterProcess) -> None:
    from starlette.responses import Response as PlainResponse

    from tests.helpers import free_port, running_app

    with Client(f"http://127.0.0.1:{free_port()}", retries=1) as c, \
            pytest.raises(sc.ConnectError):
        c.put("q", pid="x")
    with running_app(PlainResponse("<html>nothing here</html>", status_code=404,
                                   media_type="text/html")) as url, \
            Client(url) as c, pytest.raises(sc.NotFound) as ei:
        c.stats()
    assert "does not look like a squall server" in str(ei.value)
    # an address no connection can ever be made to is refused when the client is made,
    # not retried as a connection error for the whole budget
    with pytest.raises(ValueError, match=r"an http\(s\) URL such as .*'not a url at all'"):
        Client("not a url at all", retries=1)
