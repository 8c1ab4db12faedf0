"""The etcd elector (master/ha/etcd.py) against a real etcd (Debian's etcd-server;
``make test`` installs it, else these tests are skipped)."""

from __future__ import annotations

import asyncio
import base64
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from squall.master.ha.elector import make_elector
from squall.master.ha.etcd import EtcdElector
from tests.helpers import free_port, until, wait_for

ETCD = shutil.which("etcd")
needs_etcd = pytest.mark.skipif(ETCD is None, reason="no etcd binary (Debian: apt-get install "
                                                     "etcd-server, or `make etcd`)")
TTL = 2


class Etcd:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port, self.peer = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        # one client for every poll: a one-off httpx call builds a TLS context each time
        self.http = httpx.Client(timeout=5)

    def start(self) -> Etcd:
        assert ETCD is not None
        peer = f"http://127.0.0.1:{self.peer}"
        log = open(self.data_dir.parent / "etcd.log", "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            [ETCD, "--name", "t", "--data-dir", str(self.data_dir),
             "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"t={peer}", "--log-level", "error"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_for(self._healthy, 30, what="etcd healthy")
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"etcd exited; see {self.data_dir.parent / 'etcd.log'}")
        try:
            return self.http.get(self.url + "/health", timeout=1).json().get("health") == "true"
        except (httpx.HTTPError, ValueError):
            return False

    def ttl_left(self, lease: int) -> int:
        """The seconds etcd gives `lease` before it expires; -1 once it has."""
        r = self.http.post(self.url + "/v3/lease/timetolive", json={"ID": str(lease)})
        return int(r.json().get("TTL", -1))

    def has_key(self, key: str) -> bool:
        r = self.http.post(self.url + "/v3/kv/range",
                           json={"key": base64.b64encode(key.encode()).decode()})
        return bool(r.json().get("kvs"))

    def kill9(self) -> None:
        """Kill etcd (and close the helper's client: a killed etcd is not started again)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.http.close()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Etcd]:
    if ETCD is None:
        pytest.skip("no etcd binary (Debian: apt-get install etcd-server, or `make etcd`)")
    e = Etcd(tmp_path_factory.mktemp("etcd") / "data").start()
    try:
        yield e
    finally:
        e.kill9()


def pair(etcd: Etcd, key: str, ttl: int = TTL) -> tuple[EtcdElector, EtcdElector]:
    spec = f"{etcd.url}{key}?ttl={ttl}"
    return EtcdElector.from_spec(spec), EtcdElector.from_spec(spec)


A, B = "http://m0:7070", "http://m1:7070"


def test_spec_forms() -> None:
    e = EtcdElector.from_spec("http://127.0.0.1:2379/squall/leader?ttl=5")
    assert (e.endpoints, e.key, e.lease_secs) == (["http://127.0.0.1:2379"], "/squall/leader", 5.0)
    e = EtcdElector.from_spec("https://e0:2379,https://e1:2379/prod/leader?timeout=1")
    assert e.endpoints == ["https://e0:2379", "https://e1:2379"] and e.key == "/prod/leader"
    assert e.http.timeout_s == 1.0 and e.lease_secs == 5.0
    assert EtcdElector.from_spec("http://h:2379").key == "/squall/leader"
    assert make_elector("etcd:http://h:2379/k?ttl=3").kind == "etcd"
    for bad, why in [("", "name an endpoint"), ("h:2379", "not an http"),
                     ("http://a:1/k,http://b:2", "after the last endpoint"),
                     ("http://h:1?ttl=0.5", "whole number"), ("http://h:1?ttl=x", "numbers"),
                     ("http://h:1?lease=3", "unknown option")]:
        with pytest.raises(ValueError, match=why):
            EtcdElector.from_spec(bad)


@needs_etcd
async def test_two_compete_exactly_one_holds_and_renews(etcd: Etcd) -> None:
    # renewals every TTL/3 of a long TTL: a busy machine delaying one does not lose it
    ttl = 6
    a, b = pair(etcd, "/t/compete", ttl)
    try:
        for _ in range(5):
            got = await asyncio.gather(a.try_acquire(A), b.try_acquire(B))
            assert sorted(got) == [False, True]
        first = A if got[0] else B
        assert await a.holder() == first == await b.holder()
        # the holder keeps renewing past several TTLs, each time a third of its lease has
        # run down on etcd; the other never gets it, and the holder's lease is the same one
        held = (a if first == A else b)._lease
        loop = asyncio.get_running_loop()
        end = loop.time() + 1.5 * ttl
        while loop.time() < end:
            await until(lambda: 0 <= etcd.ttl_left(held) <= ttl * 2 / 3, 30, interval=0.1,
                        what="a third of the holder's lease run down")
            got = await asyncio.gather(a.try_acquire(A), b.try_acquire(B))
            assert got == [first == A, first == B]
        assert (a if first == A else b)._lease == held
    finally:
        await a.close()
        await b.close()


@needs_etcd
async def test_expiry_hands_over(etcd: Etcd) -> None:
    a, b = pair(etcd, "/t/expiry")
    try:
        assert await a.try_acquire(A) and not await b.try_acquire(B)
        # a stops renewing (a dead or paused leader): its lease runs out, etcd deletes the
        # key, and the next try of b's takes it
        await until(lambda: not etcd.has_key("/t/expiry"), 6 * TTL + 10, interval=0.1,
                    what="the key gone with a's expired lease")
        assert await b.try_acquire(B)
        assert await b.holder() == B
        assert not await a.try_acquire(A)  # its lease expired: it does not hold any more
    finally:
        await a.close()
        await b.close()


@needs_etcd
async def test_release_hands_over_at_once(etcd: Etcd) -> None:
    a, b = pair(etcd, "/t/release")
    try:
        assert await a.try_acquire(A) and not await b.try_acquire(B)
        await a.release(A)
        assert await a.holder() is None
        assert await b.try_acquire(B) and await a.holder() == B
        assert not await a.try_acquire(A)
    finally:
        await a.close()
        await b.close()


@needs_etcd
async def test_a_restarted_holder_takes_its_own_key_back(etcd: Etcd) -> None:
    a1, b = pair(etcd, "/t/restart")
    a2 = EtcdElector.from_spec(f"{etcd.url}/t/restart?ttl={TTL}")
    try:
        assert await a1.try_acquire(A)
        await a1.close()  # the process died without releasing; its key lives on until TTL
        assert await a2.try_acquire(A)  # same member name: takes it over
        assert not await b.try_acquire(B)
        assert await a2.try_acquire(A)  # and renews it under its own lease
    finally:
        await a2.close()
        await b.close()


async def test_unreachable_etcd_is_false_never_raises() -> None:
    dead = EtcdElector.from_spec(f"http://127.0.0.1:{free_port()}/t?ttl=3&timeout=0.5")
    try:
        assert await dead.try_acquire(A) is False
        assert await dead.holder() is None
        await dead.release(A)
        assert dead.errors == 2 and "Unreachable" not in dead.last_error
    finally:
        await dead.close()


@needs_etcd
async def test_etcd_killed_the_holder_loses(tmp_path: Path) -> None:
    e = Etcd(tmp_path / "data").start()
    a = EtcdElector.from_spec(f"{e.url}/t/killed?ttl={TTL}&timeout=0.5")
    try:
        assert await a.try_acquire(A)
        e.kill9()
        assert await a.try_acquire(A) is False
        assert await a.holder() is None
    finally:
        e.kill9()
        await a.close()
