"""Attacks on the servers, each as a regression test: CSRF-style text/plain POSTs, DNS
rebinding Hosts, regex bombs, deeply nested JSON, slow headers and bodies, oversized
unauthenticated bodies, extra blobs under a write token, forged heartbeats and a fake node
claiming blobs, and 10,000 mutated credentials, data-node tokens and lease tokens."""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from squall.common.errors import Forbidden, Unauthorized
from squall.common.security import auth, tokens
from squall.common.server.serving import HeaderDeadline
from squall.common.wire.cluster import HeartbeatRequest
from squall.master.cluster.state import Cluster, ClusterSettings
from squall.master.http.app import create_master_app
from squall.master.security import SecuritySettings
from squall.master.service import MasterSettings
from squall.master.tasks.leasetokens import LeaseTokens
from tests.helpers import ADMIN, TEST_KEYS, mint, running_app
from tests.test_datanode_tokens import mutations

_PUBLISHED = sorted(tokens.PUBLISHED_KEYS)[0]  # key material once printed in the sources

TASKS = "/v1/groups/g/queues/q/tasks"


@pytest.fixture
def served(tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A master served by uvicorn in this process over a real socket, with short header and
    body deadlines."""
    app = create_master_app(MasterSettings(data_dir=str(tmp_path / "m"),
                                           require_receipts=False),
                            security=SecuritySettings(body_timeout_s=0.5))

    class Quick(HeaderDeadline):
        header_timeout_s = 0.5

    with running_app(app, lifespan="on", http=Quick) as url:
        yield url


def _raw(url: str, data: bytes, wait_s: float = 10.0) -> bytes:
    """Send `data` on a new connection and read until the server closes it (or wait_s)."""
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        s.sendall(data)
        out = b""
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            out += chunk
        return out


def test_csrf_text_plain_and_form_posts_are_refused(served: str) -> None:
    """A web page can POST text/plain or form bodies cross-origin without a preflight:
    none is accepted, with or without a credential, and nothing is enqueued."""
    body = b'{"tasks": [{"pid": "csrf"}]}'
    with httpx.Client(base_url=served, timeout=10) as c:
        for ctype in ("text/plain", "application/x-www-form-urlencoded",
                      "multipart/form-data; boundary=x", None):
            for headers in ({}, ADMIN):
                h = {**headers, **({"Content-Type": ctype} if ctype else {})}
                r = c.post(TASKS, content=body, headers=h)
                assert r.status_code in (401, 415), (ctype, r.text)
                if headers:
                    assert r.status_code == 415 and r.json()["error"]["code"] == \
                        "unsupported_media_type"
        r = c.get("/v1/groups/g/queues/q", headers=ADMIN)
        assert r.status_code == 404  # the queue never held a task


def test_dns_rebinding_host_and_foreign_origin_are_refused(served: str) -> None:
    with httpx.Client(base_url=served, timeout=10, headers=ADMIN) as c:
        assert c.get("/v1/cluster/stats").status_code == 200
        r = c.get("/v1/cluster/stats", headers={"Host": "attacker.example:80"})
        assert r.status_code == 403 and "Host" in r.json()["error"]["message"]
        r = c.post(TASKS, json={"tasks": [{"pid": "x"}]},
                   headers={"Origin": "http://attacker.example"})
        assert r.status_code == 403 and "Origin" in r.json()["error"]["message"]
        r = c.get("/v1/cluster/stats", headers={"Origin": "http://localhost:3000"})
        assert r.status_code == 200


def test_regex_bombs_do_not_stall_the_master(served: str) -> None:
    """Backtracking patterns against long queue names run in linear time (RE2), so the
    master keeps answering /healthz quickly while they run."""
    with httpx.Client(base_url=served, timeout=30, headers=ADMIN) as c:
        for name in ("a" * 60, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab"):
            r = c.post(f"/v1/groups/g/queues/{name}/tasks", json={"tasks": [{"pid": "1"}]})
            assert r.status_code == 200
        bombs = ["(.*.*)*X", "(a+)+$", "(a|aa)+$", "(a*)*b$", "((a+)+)+c"]
        done: list[float] = []

        def fire() -> None:
            with httpx.Client(base_url=served, timeout=30, headers=ADMIN) as b:
                for _ in range(10):
                    for rx in bombs:
                        t = time.monotonic()
                        r = b.get("/v1/queues", params={"regex": rx})
                        assert r.status_code == 200
                        done.append(time.monotonic() - t)

        t = threading.Thread(target=fire)
        t.start()
        health = []
        while t.is_alive() and len(health) < 50:
            t0 = time.monotonic()
            assert c.get("/healthz").status_code == 200
            health.append(time.monotonic() - t0)
        t.join(60)
        assert len(done) == 50
        # backtracking would take minutes per request on these names
        assert max(done) < 5.0, max(done)
        assert min(health) < 0.1, health  # best of the samples: robust to a busy machine
        r = c.get("/v1/queues", params={"regex": "(a)\\1"})  # RE2 has no backreferences
        assert r.status_code == 400 and "regex" in r.json()["error"]["message"]
        assert c.get("/v1/queues", params={"regex": "x" * 300}).status_code == 400


@pytest.mark.parametrize("path", [TASKS, "/v1/groups/g/queues/q/lease", "/v1/groups/g/update",
                                  "/v1/groups/g/policy", "/v1/blobs/allocate"])
def test_deeply_nested_json_is_a_clean_400(served: str, path: str) -> None:
    deep = b'{"tasks": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with httpx.Client(base_url=served, timeout=30, headers=ADMIN) as c:
        method = "PUT" if path.endswith("policy") else "POST"
        r = c.request(method, path, content=deep, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "bad_request"
        assert c.get("/healthz").status_code == 200


def test_slow_headers_are_cut_off(served: str) -> None:
    """A client that never finishes its headers is disconnected (slowloris)."""
    t = time.monotonic()
    got = _raw(served, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ", wait_s=10)
    assert got == b"" and time.monotonic() - t < 5  # closed without an answer, early
    with httpx.Client(base_url=served, timeout=10) as c:
        assert c.get("/healthz").status_code == 200


def test_slow_bodies_get_408(served: str) -> None:
    head = (f"POST {TASKS} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: {ADMIN['Authorization']}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n").encode()
    got = _raw(served, head + b'{"tasks": [', wait_s=10)
    assert got.startswith(b"HTTP/1.1 408"), got[:200]


def test_oversized_unauthenticated_bodies_are_refused_before_reading(served: str) -> None:
    """A 15 MiB heartbeat without a credential: 401 from the headers alone, the body is
    never read (it is not even sent here)."""
    for path in ("/v1/nodes/heartbeat", TASKS):
        head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {15 << 20}\r\nConnection: close\r\n\r\n").encode()
        t = time.monotonic()
        got = _raw(served, head, wait_s=10)
        assert got.startswith(b"HTTP/1.1 401"), got[:200]
        assert time.monotonic() - t < 5


def test_forged_and_misdirected_heartbeats(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A heartbeat signed with the public development key, or for another node id, or with
    a payload token, does not register a node."""
    key = b"a-real-cluster-key-0123456789abcdef"
    app = create_master_app(MasterSettings(data_dir=str(tmp_path / "m"), cluster_key=key,
                                           require_receipts=False), background=False)
    beat = {"node_id": "n1", "address": "http://127.0.0.1:9", "started_at": 1.0, "seq": 0,
            "capacity_bytes": 10, "used_bytes": 0, "free_bytes": 10, "blob_count": 0,
            "full": True, "blob_ids": ["real-blob"]}

    async def go() -> None:
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as c:
            exp = time.time() + 60
            for tok, want in ((tokens.sign(_PUBLISHED, "heartbeat", ["n1"], exp),
                               401),
                              (tokens.sign(key, "heartbeat", ["n2"], exp), 403),
                              (tokens.sign(key, "read", ["n1"], exp), 403),
                              (mint("producer"), 403), (None, 401)):
                h = {"Authorization": f"Bearer {tok}"} if tok else {}
                r = await c.post("/v1/nodes/heartbeat", json=beat, headers=h)
                assert r.status_code == want, (tok, r.text)
            assert app.state.master.cluster.nodes == {}
            good = tokens.sign(key, "heartbeat", ["n1"], exp)
            r = await c.post("/v1/nodes/heartbeat", json=beat,
                             headers={"Authorization": f"Bearer {good}"})
            assert r.status_code == 200 and "n1" in app.state.master.cluster.nodes
            # malformed heartbeats (served by the fast path): a clear 400, never a 500
            h = {"Authorization": f"Bearer {good}", "Content-Type": "application/json"}
            for bad in (b"not json", b'{"node_id": "n1"}', b"[" * 100_000,
                        orjson.dumps({**beat, "blob_ids": [1, 2]}),
                        orjson.dumps({**beat, "blob_ids": ["../x"]}),
                        rb'{"node_id": "\ud800"}'):
                r = await c.post("/v1/nodes/heartbeat", content=bad, headers=h)
                assert r.status_code == 400, (bad[:40], r.status_code, r.text)
                assert r.json()["error"]["message"], r.text

    import asyncio

    asyncio.run(go())


def test_a_fake_node_claiming_a_blob_does_not_trim_a_real_replica() -> None:
    """Two nodes hold a blob with receipts; a third (fake) node claims it too. The blob
    looks over-replicated, but only the unproven claim may be trimmed."""
    from squall.common.clock import ManualClock

    clock = ManualClock()
    c = Cluster(clock, ClusterSettings(replication_factor=2), b"k" * 32,
                lambda ids: [True] * len(ids))

    def beat(node: str, blobs: list[str]) -> None:
        c.heartbeat(HeartbeatRequest(node_id=node, address=f"http://{node}:1", started_at=1.0,
                                     seq=0, capacity_bytes=100, used_bytes=0, free_bytes=100,
                                     blob_count=len(blobs), full=True, blob_ids=blobs))

    beat("real1", [])
    beat("real2", [])
    c.record_holders("blob", ["real1", "real2"])  # receipts of the write
    beat("fake", ["blob"])
    c.tick([])
    deletes = {n: [b for cmd in cmds if cmd.op == "delete" for b in cmd.blob_ids]
               for n, cmds in c.commands.items()}
    assert not deletes.get("real1") and not deletes.get("real2"), deletes
    # without proofs for rf copies, nothing is trimmed at all
    c = Cluster(clock, ClusterSettings(replication_factor=2), b"k" * 32,
                lambda ids: [True] * len(ids))
    for n in ("real1", "real2", "fake"):
        beat(n, ["blob"])
    c.tick([])
    assert not any(cmd.op == "delete" for cmds in c.commands.values() for cmd in cmds)


def test_extra_blobs_under_a_write_token_are_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A write token covers exactly the blob ids allocated with it."""
    from squall.datanode.config import DataNodeSettings
    from squall.datanode.http.app import create_datanode_app

    key = b"a-real-cluster-key-0123456789abcdef"
    app = create_datanode_app(DataNodeSettings(data_dir=str(tmp_path / "d"), cluster_key=key,
                                               advertise_url="http://127.0.0.1:1"),
                              background=False)
    tok = tokens.sign(key, "write", [], time.time() + 60, prefix="abc-", count=2)

    async def go() -> None:
        async with app.router.lifespan_context(app), httpx.AsyncClient(
                transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1",
                headers={"Authorization": f"Bearer {tok}"}) as c:
            assert (await c.put("/v1/blobs/abc-1", content=b"ok")).status_code == 200
            for extra in ("abc-2", "abc-10", "abc-01", "abc-1x"):
                r = await c.put(f"/v1/blobs/{extra}", content=b"extra")
                assert r.status_code == 403, (extra, r.text)

    import asyncio

    asyncio.run(go())


def test_ten_thousand_mutated_credentials_and_tokens_are_refused() -> None:
    """Bit flips, truncations, other keys, other scopes, blobs, nodes and tasks, expired: none
    passes (credentials, payload and heartbeat tokens, lease tokens)."""
    rng = random.Random(10)
    now = time.time()
    other = b"some-other-auth-key-0123456789abcdef"
    cluster = b"cluster-key-for-the-fuzz-0123456789"
    bad: list[Any] = []
    cred = mint("consumer", groups=["g"])
    for m in mutations(cred, rng, n=2000):
        bad.append(("cred", m))
    bad += [("cred", auth.mint(auth.parse_keys(auth.new_private_key()), ["admin"], 60, now)),
            ("cred", auth.mint(TEST_KEYS, ["admin"], 1, now - 5))]
    tok = tokens.sign(cluster, "read", ["blob-1"], now + 60)
    for m in mutations(tok, rng, n=2000):
        bad.append(("read", m))
    wtok = tokens.sign(cluster, "write", [], now + 60, prefix="p-", count=3)
    for m in mutations(wtok, rng, n=2000):
        bad.append(("write", m))
    bad += [("read", tokens.sign(cluster, "read", ["blob-2"], now + 60)),  # other blob
            ("read", tokens.sign(cluster, "write", ["blob-1"], now + 60)),  # other scope
            ("read", tokens.sign(other, "read", ["blob-1"], now + 60)),  # other key
            ("read", tokens.sign(cluster, "read", ["blob-1"], now - 1)),  # expired
            ("node", tokens.sign(cluster, "heartbeat", ["n2"], now + 60))]  # other node
    leases = LeaseTokens(b"lease-key-for-the-fuzz-0123456789ab")
    lease = leases.seal("g", "q", "p", 41)
    flips = {lease[:i] + c + lease[i + 1:] for i in range(len(lease))
             for c in "0123456789abcdef." if c != lease[i]}
    cuts = {lease[:k] for k in range(len(lease))} | {lease[k:] for k in range(1, len(lease))}
    seqs = {f"{n}{lease[2:]}" for n in (0, 1, 40, 42, 4100, 10**19)}
    bad += [("lease", m) for m in sorted(flips | cuts | seqs) if m != lease]
    bad += [("lease", leases.seal("g", "q", "p2", 41)),  # other task
            ("lease", leases.seal("g", "q2", "p", 41)),  # other queue
            ("lease", leases.seal("h", "q", "p", 41)),  # other group
            ("lease", LeaseTokens(other).seal("g", "q", "p", 41))]  # other master's key
    while len(bad) < 10_000:  # random garbage with the right prefixes
        kind = rng.choice(["cred", "read"])
        body = "".join(rng.choice("ABCDEFabcdef0123456789-_") for _ in range(rng.randrange(80)))
        bad.append((kind, (auth.CRED_PREFIX if kind == "cred" else tokens.TOKEN_PREFIX) + body
                    + "." + body[::-1]))
    assert len(bad) >= 10_000
    accepted = []
    for kind, t in bad:
        try:
            if kind == "cred":
                auth.verify(TEST_KEYS, t, now)
            elif kind == "lease":
                if leases.open("g", "q", "p", t) == 0:  # 0: refused as a stale token
                    continue
            elif kind == "node":
                tokens.verify(cluster, t, "heartbeat", "n1", now)
            elif kind == "write":
                tokens.verify(cluster, t, "write", "p-1", now)
            else:
                tokens.verify(cluster, t, "read", "blob-1", now)
            accepted.append(t)
        except (Unauthorized, Forbidden):
            pass
    assert accepted == []
