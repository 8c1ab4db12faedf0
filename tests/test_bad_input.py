"""Invariant 7: bad input gets a 4xx with a clear JSON message; never a 500, never a crash,
never a trace left in the data.

Most cases run against the in-process app (`api` fixture: ASGI transport, manual clock);
a module-scoped real ``python -m squall.master`` subprocess then gets a selection over real
HTTP (raw sockets where httpx would refuse to send the bytes), and must keep serving.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from squall.common.clock import ManualClock
from squall.common.wire.models import MAX_BATCH
from squall.common.wire.names import PID_MAX_BYTES
from squall.master.service import Master, MasterSettings
from tests.helpers import (
    ADMIN,
    DISPATCH_ENV,
    FAKE_TOKEN,
    MasterProcess,
    asgi_master,
    forge_token,
    lease_seq,
)

TK = FAKE_TOKEN  # any well-formed lease token

BODY_LIMIT = 128 << 10  # the in-process app's body limit (1001 small items still fit)
G = "/v1/groups/g"
TASKS = f"{G}/queues/q/tasks"
LEASE = f"{G}/queues/q/lease"
UPDATE = f"{G}/update"
JSON_CT = {"content-type": "application/json"}

API = tuple[httpx.AsyncClient, Master]


@pytest.fixture
def master_settings(tmp_path) -> MasterSettings:  # type: ignore[no-untyped-def]
    return MasterSettings(data_dir=str(tmp_path / "master"), max_body_bytes=BODY_LIMIT)


@pytest.fixture
async def api(master_settings: MasterSettings, clock: ManualClock, fast_dispatch: bool
              ) -> AsyncIterator[API]:
    """Every test here runs through the fast dispatcher and through FastAPI's stack: the
    same answers, word for word."""
    async with asgi_master(master_settings, clock, fast_dispatch) as served:
        yield served


def check_error(r: httpx.Response, status: int, code: str | None = None,
                *fragments: str) -> dict[str, Any]:
    """`r` is a `status` answer with a JSON error body: a code and a non-empty message."""
    assert r.status_code == status, f"{r.status_code} != {status}: {r.text[:500]}"
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    err = body.get("error")
    assert isinstance(err, dict), body
    assert isinstance(err.get("code"), str) and err["code"], body
    assert isinstance(err.get("message"), str) and err["message"].strip(), body
    if code is not None:
        assert err["code"] == code, body
    for f in fragments:
        assert f in err["message"], (f, err["message"])
    return err


async def still_serves(c: httpx.AsyncClient, queue: str = "alive") -> None:
    """The server answers, and a fresh task can be enqueued and leased."""
    r = await c.post(f"{G}/queues/{queue}/tasks", json={"tasks": [{}]})
    assert r.status_code == 200, r.text
    pid = r.json()["enqueued"][0]["pid"]
    r = await c.post(f"{G}/queues/{queue}/lease", json={"max_tasks": 1000})
    assert r.status_code == 200, r.text
    assert pid in [t["pid"] for t in r.json()["tasks"]]


@pytest.fixture
async def client(api: API) -> AsyncIterator[httpx.AsyncClient]:
    c, _ = api
    yield c
    await still_serves(c)


# -- one request each: (method, url, request kwargs, status, error code, message fragment) --
LONG_ASCII_PID = "a" * (PID_MAX_BYTES + 1)
LONG_UTF8_PID = "é" * (PID_MAX_BYTES // 2 + 1)  # 513 characters, 1026 bytes
OK_TASK = {"pid": "ok"}

CASES: list[tuple[str, str, str, dict[str, Any], int, str | None, str]] = [
    # malformed JSON and wrong body shapes
    ("truncated json", "POST", TASKS, {"content": b'{"tasks": [{"pid": "a"}', "headers": JSON_CT},
     400, "bad_request", "JSON"),
    ("not json", "POST", TASKS, {"content": b"{bad", "headers": JSON_CT}, 400, "bad_request", ""),
    ("empty body", "POST", TASKS, {"content": b"", "headers": JSON_CT}, 400, "bad_request", ""),
    ("json null", "POST", TASKS, {"content": b"null", "headers": JSON_CT}, 400, None, ""),
    ("json list", "POST", TASKS, {"json": [OK_TASK]}, 400, "bad_request", ""),
    ("json string", "POST", LEASE, {"json": "lease"}, 400, "bad_request", ""),
    ("invalid utf-8 body", "POST", TASKS,
     {"content": b'{"tasks": [{"pid": "\xff\xfe"}]}', "headers": JSON_CT}, 400, None, ""),
    ("NaN literal", "POST", LEASE, {"content": b'{"lease_secs": NaN}', "headers": JSON_CT},
     400, "bad_request", "lease_secs"),
    ("Infinity literal", "POST", LEASE,
     {"content": b'{"lease_secs": Infinity}', "headers": JSON_CT}, 400, "bad_request", ""),
    # wrong types
    ("tasks not a list", "POST", TASKS, {"json": {"tasks": "x"}}, 400, "bad_request", "tasks"),
    ("pid a number", "POST", TASKS, {"json": {"tasks": [{"pid": 5}]}}, 400, "bad_request", "pid"),
    ("pid a list", "POST", TASKS, {"json": {"tasks": [{"pid": ["a"]}]}}, 400, "bad_request",
     "pid"),
    ("max_tasks a string", "POST", LEASE, {"json": {"max_tasks": "many"}}, 400, "bad_request",
     "max_tasks"),
    ("max_tasks fractional", "POST", LEASE, {"json": {"max_tasks": 1.5}}, 400, "bad_request",
     "max_tasks"),
    ("max_tasks huge", "POST", LEASE, {"json": {"max_tasks": 10**30}}, 400, "bad_request",
     "max_tasks"),
    ("max_tasks zero", "POST", LEASE, {"json": {"max_tasks": 0}}, 400, "bad_request", ""),
    ("token a string", "POST", UPDATE,
     {"json": {"dequeue": [{"queue": "q", "pid": "a", "token": "t"}]}}, 400, "bad_request",
     "token"),
    ("token zero", "POST", UPDATE, {"json": {"dequeue": [{"queue": "q", "pid": "a", "token": 0}]}},
     400, "bad_request", "token"),
    ("token over 2**63", "POST", UPDATE,
     {"json": {"dequeue": [{"queue": "q", "pid": "a", "token": 2**64}]}}, 400, "bad_request",
     "token"),
    ("token an integer", "POST", UPDATE,  # the wire form before lease tokens were sealed
     {"json": {"dequeue": [{"queue": "q", "pid": "a", "token": 12}]}}, 400, "bad_request",
     "token"),
    ("token true", "POST", UPDATE,
     {"json": {"renew": [{"queue": "q", "pid": "a", "token": True}]}}, 400, "bad_request",
     "token"),
    ("token too long", "POST", UPDATE,
     {"json": {"dequeue": [{"queue": "q", "pid": "a", "token": "1." + "0" * 10_000}]}}, 400,
     "bad_request", "token"),
    ("token mac not hex", "POST", UPDATE,
     {"json": {"release": [{"queue": "q", "pid": "a", "token": "1." + "z" * 32}]}}, 400,
     "bad_request", "token"),
    ("token without number", "POST", UPDATE,
     {"json": {"dequeue": [{"queue": "q", "pid": "a", "token": "." + "0" * 32}]}}, 400,
     "bad_request", "token"),
    ("token non-ascii digits", "POST", UPDATE,
     {"json": {"dequeue": [{"queue": "q", "pid": "a", "token": "\u0661." + "0" * 32}]}},
     400, "bad_request", "token"),
    ("payload size negative", "POST", TASKS,
     {"json": {"tasks": [{"pid": "a", "payload": {"blob_id": "b", "size": -1, "crc32c": 0}}]}},
     400, "bad_request", "size"),
    ("update lists not lists", "POST", UPDATE, {"json": {"enqueue": {"queue": "q"}}}, 400,
     "bad_request", "enqueue"),
    # missing and extra fields
    ("no tasks", "POST", TASKS, {"json": {}}, 400, "bad_request", "tasks"),
    ("empty tasks", "POST", TASKS, {"json": {"tasks": []}}, 400, "bad_request", "tasks"),
    ("dequeue without token", "POST", UPDATE, {"json": {"dequeue": [{"queue": "q", "pid": "a"}]}},
     400, "bad_request", "token"),
    ("enqueue item without queue", "POST", UPDATE, {"json": {"enqueue": [{"pid": "a"}]}}, 400,
     "bad_request", "queue"),
    ("extra task field", "POST", TASKS, {"json": {"tasks": [{"pid": "a", "priority": 1}]}}, 400,
     "bad_request", "priority"),
    ("extra top-level field", "POST", TASKS, {"json": {"tasks": [OK_TASK], "x": 1}}, 400,
     "bad_request", "x"),
    ("extra lease field", "POST", LEASE, {"json": {"max_tasks": 1, "timeout": 5}}, 400,
     "bad_request", "timeout"),
    ("extra update section", "POST", UPDATE, {"json": {"ack": []}}, 400, "bad_request", "ack"),
    # pids
    ("empty pid", "POST", TASKS, {"json": {"tasks": [{"pid": ""}]}}, 400, "bad_request", "pid"),
    ("empty pid in update", "POST", UPDATE, {"json": {"enqueue": [{"queue": "q", "pid": ""}]}},
     400, "bad_request", "pid"),
    ("ascii pid over 1 KiB", "POST", TASKS, {"json": {"tasks": [{"pid": LONG_ASCII_PID}]}}, 413,
     "too_large", "pid"),
    ("utf-8 pid over 1 KiB", "POST", TASKS, {"json": {"tasks": [{"pid": LONG_UTF8_PID}]}}, 413,
     "too_large", "1026 bytes"),
    ("long pid in update", "POST", UPDATE,
     {"json": {"enqueue": [{"queue": "q", "pid": LONG_UTF8_PID}]}}, 413, "too_large", "pid"),
    ("long max_pid", "POST", LEASE, {"json": {"max_pid": LONG_ASCII_PID}}, 413, "too_large",
     "pid"),
    ("lone surrogate pid", "POST", TASKS,
     {"content": b'{"tasks": [{"pid": "a\\ud800"}]}', "headers": JSON_CT}, 400, "bad_request",
     "pid"),
    ("lone low surrogate pid", "POST", TASKS,
     {"content": b'{"tasks": [{"pid": "\\udc00"}]}', "headers": JSON_CT}, 400, "bad_request",
     "pid"),
    ("surrogate in dequeue", "POST", UPDATE,
     {"content": b'{"dequeue": [{"queue": "q", "pid": "\\ud83d", "token": "%s"}]}' % TK.encode(),
      "headers": JSON_CT}, 400, "bad_request", "pid"),
    ("surrogate max_pid", "POST", LEASE,
     {"content": b'{"max_pid": "\\udfff"}', "headers": JSON_CT}, 400, "bad_request", "max_pid"),
    ("NUL in pid", "POST", TASKS, {"json": {"tasks": [{"pid": "a\x00b"}]}}, 400, "bad_request",
     "NUL"),
    ("NUL in update pid", "POST", UPDATE, {"json": {"enqueue": [{"queue": "q", "pid": "\x00"}]}},
     400, "bad_request", "NUL"),
    ("NUL in max_pid", "POST", LEASE, {"json": {"max_pid": "z\x00"}}, 400, "bad_request", "NUL"),
    ("NUL in task lookup", "GET", f"{G}/queues/q/tasks/a%00b", {}, 400, "bad_request", "NUL"),
    # names, in the path and in update bodies
    ("group starts with dash", "POST", "/v1/groups/-g/queues/q/tasks", {"json": {"tasks": [{}]}},
     400, "bad_request", "group"),
    ("queue with space", "POST", f"{G}/queues/a%20b/tasks", {"json": {"tasks": [{}]}}, 400,
     "bad_request", "queue"),
    ("queue with #", "POST", f"{G}/queues/a%23b/lease", {"json": {}}, 400, "bad_request",
     "queue"),
    ("queue not ascii", "GET", f"{G}/queues/%C3%A9", {}, 400, "bad_request", "queue"),
    ("queue 129 chars", "POST", f"{G}/queues/{'q' * 129}/tasks", {"json": {"tasks": [{}]}}, 400,
     "bad_request", "queue"),
    ("group in update path", "POST", "/v1/groups/.x/update", {"json": {}}, 400, "bad_request",
     "group"),
    ("group in stats path", "GET", "/v1/groups/a%00/queues/q", {}, 400, "bad_request", "group"),
    ("empty group", "POST", "/v1/groups//queues/q/tasks", {"json": {"tasks": [{}]}}, 404, None,
     ""),
    ("bad queue in enqueue item", "POST", UPDATE, {"json": {"enqueue": [{"queue": "a/b"}]}}, 400,
     "bad_request", "queue"),
    ("empty queue in dequeue", "POST", UPDATE,
     {"json": {"dequeue": [{"queue": "", "pid": "a", "token": TK}]}}, 400, "bad_request", "queue"),
    ("long queue in renew", "POST", UPDATE,
     {"json": {"renew": [{"queue": "r" * 200, "pid": "a", "token": TK}]}}, 400, "bad_request",
     "queue"),
    ("group#queue in release", "POST", UPDATE,
     {"json": {"release": [{"queue": "g#q", "pid": "a", "token": TK}]}}, 400, "bad_request",
     "queue"),
    # unknown queues and tasks
    ("dequeue in unknown queue", "POST", UPDATE,
     {"json": {"dequeue": [{"queue": "nowhere", "pid": "a", "token": TK}]}}, 404, "not_found",
     "nowhere"),
    ("renew in unknown queue", "POST", UPDATE,
     {"json": {"renew": [{"queue": "nowhere", "pid": "a", "token": TK}]}}, 404, "not_found", "'a'"),
    ("unknown task", "GET", f"{G}/queues/q/tasks/nothing", {}, 404, "not_found", "nothing"),
    ("stats of unknown queue", "GET", f"{G}/queues/nowhere", {}, 404, "not_found", "nowhere"),
    ("unknown route", "GET", "/v1/nothing", {}, 404, None, ""),
    ("wrong method", "DELETE", "/v1/queues", {}, 405, None, ""),
    # batch sizes
    ("enqueue batch over 1000", "POST", TASKS, {"json": {"tasks": [{}] * (MAX_BATCH + 1)}}, 400,
     "bad_request", "1000"),
    ("update enqueue over 1000", "POST", UPDATE,
     {"json": {"enqueue": [{"queue": "q"}] * (MAX_BATCH + 1)}}, 400, "bad_request", "1000"),
    ("update dequeue over 1000", "POST", UPDATE,
     {"json": {"dequeue": [{"queue": "q", "pid": "a", "token": TK}] * (MAX_BATCH + 1)}}, 400,
     "bad_request", "1000"),
    ("lease over 1000", "POST", LEASE, {"json": {"max_tasks": MAX_BATCH + 1}}, 400, "bad_request",
     "max_tasks"),
    # body size
    ("body over the limit", "POST", TASKS, {"content": b" " * (BODY_LIMIT + 1),
                                            "headers": JSON_CT}, 413, "too_large", "limit"),
    ("json over the limit", "POST", TASKS,
     {"json": {"tasks": [{"pid": f"p{i:06d}"} for i in range(MAX_BATCH)],
               "pad": "x" * BODY_LIMIT}}, 413, "too_large", "limit"),
    # times and durations
    ("not_before and delay_secs", "POST", TASKS,
     {"json": {"tasks": [{"pid": "a", "not_before": 1, "delay_secs": 1}]}}, 400, "bad_request",
     "not both"),
    ("negative delay", "POST", TASKS, {"json": {"tasks": [{"delay_secs": -1}]}}, 400,
     "bad_request", "delay_secs"),
    ("delay over a year", "POST", TASKS, {"json": {"tasks": [{"delay_secs": 1e9}]}}, 400,
     "bad_request", "delay_secs"),
    ("negative not_before", "POST", TASKS, {"json": {"tasks": [{"not_before": -5}]}}, 400,
     "bad_request", "not_before"),
    ("not_before in year 5000", "POST", TASKS, {"json": {"tasks": [{"not_before": 1e12}]}}, 400,
     "bad_request", "not_before"),
    ("lease_secs 0", "POST", LEASE, {"json": {"lease_secs": 0}}, 400, "bad_request",
     "lease_secs"),
    ("lease_secs negative", "POST", LEASE, {"json": {"lease_secs": -10}}, 400, "bad_request",
     "lease_secs"),
    ("lease_secs huge", "POST", LEASE, {"json": {"lease_secs": 1e300}}, 400, "bad_request",
     "lease_secs"),
    ("lease_secs over a week", "POST", LEASE, {"json": {"lease_secs": 7 * 86400 + 1}}, 400,
     "bad_request", "lease_secs"),
    ("renew lease_secs 0", "POST", UPDATE,
     {"json": {"renew": [{"queue": "q", "pid": "a", "token": TK, "lease_secs": 0}]}}, 400,
     "bad_request", "lease_secs"),
    ("release delay negative", "POST", UPDATE,
     {"json": {"release": [{"queue": "q", "pid": "a", "token": TK, "delay_secs": -1}]}}, 400,
     "bad_request", "delay_secs"),
    # queue listing
    ("bad regex", "GET", "/v1/queues?regex=(", {}, 400, "bad_request", "regex"),
    ("bad regex class", "GET", "/v1/queues?regex=[z-a]", {}, 400, "bad_request", "regex"),
    ("regex too long", "GET", "/v1/queues?regex=" + "a" * 300, {}, 400, "bad_request", "regex"),
    ("limit 0", "GET", "/v1/queues?limit=0", {}, 400, "bad_request", "limit"),
    ("limit not a number", "GET", "/v1/queues?limit=ten", {}, 400, "bad_request", "limit"),
    ("min_tasks negative", "GET", "/v1/queues?min_tasks=-1", {}, 400, "bad_request",
     "min_tasks"),
]


@pytest.mark.parametrize(("method", "url", "kw", "status", "code", "fragment"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_rejected(client: httpx.AsyncClient, method: str, url: str, kw: dict[str, Any],
                        status: int, code: str | None, fragment: str) -> None:
    r = await client.request(method, url, **kw)
    check_error(r, status, code, fragment)


async def test_rejected_requests_leave_no_trace(api: API) -> None:
    """After every bad request of the table, nothing was enqueued anywhere."""
    c, _ = api
    for _, method, url, kw, _status, _code, _frag in CASES:
        r = await c.request(method, url, **kw)
        assert 400 <= r.status_code < 500, (url, r.status_code, r.text)
    r = await c.get("/v1/queues", params={"min_tasks": 0})
    assert r.json()["queues"] == []
    assert (await c.get("/readyz")).json()["ticket"] == 0, "a rejected request was logged"


async def test_streamed_body_over_limit(client: httpx.AsyncClient) -> None:
    """A body with no content-length is cut off at the limit while streaming: 413."""

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"tasks": ['
        for i in range(BODY_LIMIT // 64 + 10):
            yield json.dumps({"pid": f"{i:058d}"}).encode() + b","
        yield b'{"pid": "last"}]}'

    r = await client.post(TASKS, content=chunks(), headers=JSON_CT)
    assert "content-length" not in r.request.headers
    check_error(r, 413, "too_large", "limit")
    r = await client.get(f"{G}/queues/q")
    check_error(r, 404, "not_found")


async def test_streamed_body_under_limit_accepted(client: httpx.AsyncClient) -> None:
    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"tasks": ['
        yield b'{"pid": "s1"}, '
        yield b'{"pid": "s2"}]}'

    r = await client.post(TASKS, content=chunks(), headers=JSON_CT)
    assert r.status_code == 200, r.text
    assert [e["pid"] for e in r.json()["enqueued"]] == ["s1", "s2"]


async def test_pid_limit_is_inclusive(client: httpx.AsyncClient) -> None:
    """Exactly 1024 bytes is fine, ASCII or not; one more is 413 (UTF-8 bytes, not chars)."""
    ok = ["a" * PID_MAX_BYTES, "é" * (PID_MAX_BYTES // 2), "€" * 341 + "z"]  # 1024 bytes each
    r = await client.post(TASKS, json={"tasks": [{"pid": p} for p in ok]})
    assert r.status_code == 200, r.text
    for p in ok:
        r = await client.get(f"{TASKS}/{p}")
        assert r.status_code == 200 and r.json()["pid"] == p
    for p in ("€" * 341 + "zz", "😀" * 257):  # 1025 and 1028 bytes, < 1024 characters
        r = await client.post(TASKS, json={"tasks": [{"pid": p}]})
        check_error(r, 413, "too_large", "pid")


async def test_lease_unknown_queue_is_empty(client: httpx.AsyncClient) -> None:
    r = await client.post(f"{G}/queues/never-seen/lease", json={"max_tasks": 10})
    assert r.status_code == 200, r.text
    assert r.json()["tasks"] == []
    r = await client.get(f"{G}/queues/never-seen")  # leasing did not create it
    check_error(r, 404, "not_found")


async def _lease_one(c: httpx.AsyncClient, pid: str, lease_secs: float = 10.0) -> str:
    r = await c.post(LEASE, json={"max_tasks": 1, "lease_secs": lease_secs,
                                  "max_pid": pid})
    assert r.status_code == 200, r.text
    [t] = r.json()["tasks"]
    assert t["pid"] == pid
    return str(t["token"])


async def test_stale_tokens(api: API, clock: ManualClock) -> None:
    """Every form of stale or wrong token: 409 lease_lost, naming the token; no change."""
    c, _ = api
    r = await c.post(TASKS, json={"tasks": [{"pid": "a"}, {"pid": "b"}]})
    assert r.status_code == 200
    # never leased
    r = await c.post(UPDATE, json={"dequeue": [{"queue": "q", "pid": "a", "token": TK}]})
    check_error(r, 409, "lease_lost", "not leased")

    t1 = await _lease_one(c, "a")
    clock.advance(11)  # the lease expires; the next lease hands the task to someone else
    t2 = await _lease_one(c, "a")
    assert lease_seq(t2) > lease_seq(t1)
    for section, extra in (("dequeue", {}), ("renew", {"lease_secs": 5}),
                           ("release", {"delay_secs": 0})):
        item = {"queue": "q", "pid": "a", "token": t1, **extra}
        r = await c.post(UPDATE, json={section: [item]})
        err = check_error(r, 409, "lease_lost", str(t1), "stale")
        assert err["details"]["token"] == t1
    # tokens that were never issued for this task: a guessed number with a real mac, a
    # forged mac, the next number in the sequence, the current number with the old mac
    for bad in (forge_token(t2, lease_seq(t2) + 1000), forge_token(t2, flip=True),
                forge_token(t1, lease_seq(t1) + 1), forge_token(t1, lease_seq(t2)),
                f"{lease_seq(t2)}." + "0" * 32):
        r = await c.post(UPDATE, json={"dequeue": [{"queue": "q", "pid": "a", "token": bad}]})
        check_error(r, 409, "lease_lost", bad)
    # the current holder still owns it
    r = await c.get(f"{TASKS}/a")
    assert r.json()["state"] == "leased"
    # after a release, the released token is stale too
    r = await c.post(UPDATE, json={"release": [{"queue": "q", "pid": "a", "token": t2}]})
    assert r.status_code == 200, r.text
    r = await c.post(UPDATE, json={"dequeue": [{"queue": "q", "pid": "a", "token": t2}]})
    check_error(r, 409, "lease_lost", str(t2))
    # after a dequeue, the token answers 404: the task is gone
    t3 = await _lease_one(c, "a")
    r = await c.post(UPDATE, json={"dequeue": [{"queue": "q", "pid": "a", "token": t3}]})
    assert r.status_code == 200, r.text
    r = await c.post(UPDATE, json={"dequeue": [{"queue": "q", "pid": "a", "token": t3}]})
    check_error(r, 404, "not_found", "'a'")
    r = await c.get(f"{TASKS}/b")
    assert r.json()["state"] == "available" and r.json()["attempts"] == 0
    await still_serves(c)


async def test_update_all_or_nothing(api: API) -> None:
    """An update whose last item is bad leaves no trace of its first items."""
    c, _ = api
    r = await c.post(TASKS, json={"tasks": [{"pid": "x"}, {"pid": "y"}]})
    assert r.status_code == 200
    tx = await _lease_one(c, "x")
    ty = await _lease_one(c, "y")
    before = (await c.get(f"{G}/queues/q")).json()
    y_before = (await c.get(f"{TASKS}/y")).json()
    ticket = await wal_ticket(c)

    good = {"dequeue": [{"queue": "q", "pid": "x", "token": tx}],
            "renew": [{"queue": "q", "pid": "y", "token": ty, "lease_secs": 500}],
            "enqueue": [{"queue": "q", "pid": "new1"}, {"queue": "other", "pid": "new2"}]}
    bad_tails: list[tuple[dict[str, Any], int, str]] = [
        ({"enqueue": [*good["enqueue"], {"queue": "q", "pid": "\x00"}]}, 400, "bad_request"),
        ({"enqueue": [*good["enqueue"], {"queue": "q", "pid": LONG_UTF8_PID}]}, 413,
         "too_large"),
        ({"enqueue": [*good["enqueue"],
                      {"queue": "q", "pid": "z", "not_before": 1, "delay_secs": 1}]}, 400,
         "bad_request"),
        ({"release": [{"queue": "q", "pid": "y", "token": forge_token(ty, flip=True)}]}, 409,
         "lease_lost"),
        ({"release": [{"queue": "nowhere", "pid": "y", "token": ty}]}, 404, "not_found"),
        ({"dequeue": [*good["dequeue"], {"queue": "q", "pid": "x", "token": tx}]}, 404,
         "not_found"),  # the same task twice: the second one no longer exists
        ({"dequeue": [*good["dequeue"], {"queue": "q", "pid": "y", "token": tx}]}, 409,
         "lease_lost"),
        ({"enqueue": [*good["enqueue"], {"queue": "bad queue"}]}, 400, "bad_request"),
    ]
    for tail, status, code in bad_tails:
        check_error(await c.post(UPDATE, json={**good, **tail}), status, code)
        assert await wal_ticket(c) == ticket, "a failed update was logged"
        assert (await c.get(f"{G}/queues/q")).json() == before
        check_error(await c.get(f"{G}/queues/other"), 404, "not_found")
        for pid in ("new1", "z"):
            check_error(await c.get(f"{TASKS}/{pid}"), 404, "not_found")
        assert (await c.get(f"{TASKS}/x")).json()["state"] == "leased"
        assert (await c.get(f"{TASKS}/y")).json() == y_before  # not renewed
    # and the good update alone goes through, with the same tokens
    r = await c.post(UPDATE, json=good)
    assert r.status_code == 200, r.text
    assert r.json()["dequeued"] == 1 and len(r.json()["enqueued"]) == 2
    check_error(await c.get(f"{TASKS}/x"), 404, "not_found")
    assert (await c.get(f"{G}/queues/other/tasks/new2")).status_code == 200


async def wal_ticket(c: httpx.AsyncClient) -> int:
    return int((await c.get("/readyz")).json()["ticket"])


# -- against a real subprocess over real HTTP ----------------------------------------------
@pytest.fixture(scope="module", params=sorted(DISPATCH_ENV))
def real_master(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
                ) -> Iterator[MasterProcess]:
    m = MasterProcess(str(tmp_path_factory.mktemp("badinput") / "master"),
                      env=DISPATCH_ENV[request.param]).start()
    try:
        yield m
    finally:
        m.stop()
    with open(m.log_path, errors="replace") as f:  # no exception was logged either
        log = f.read()
    assert "Traceback" not in log, log[log.index("Traceback"):][:3000]


@pytest.fixture
def real(real_master: MasterProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=real_master.url, timeout=30, headers=ADMIN) as c:
        yield c
        # the process is alive and serves
        assert real_master.proc is not None and real_master.proc.poll() is None
        assert c.get("/readyz").status_code == 200


def raw_request(m: MasterProcess, head: bytes, body: bytes = b"") -> tuple[int, dict[str, Any]]:
    """Send exact bytes over a socket; return the status and the JSON body of the answer."""
    with socket.create_connection(("127.0.0.1", m.port), timeout=30) as s:
        s.sendall(head + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            headers, sep, rest = data.partition(b"\r\n\r\n")
            if sep:
                length = next((int(line.split(b":")[1]) for line in headers.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), None)
                if length is not None and len(rest) >= length:
                    break
    status_line, _, _ = data.partition(b"\r\n")
    status = int(status_line.split()[1])
    return status, json.loads(data.partition(b"\r\n\r\n")[2] or b"null")


REAL_CASES = [c for c in CASES if c[0] in {
    "truncated json", "invalid utf-8 body", "NaN literal", "pid a number", "extra task field",
    "ascii pid over 1 KiB", "utf-8 pid over 1 KiB", "lone surrogate pid", "NUL in pid",
    "NUL in task lookup", "queue with space", "bad queue in enqueue item",
    "dequeue in unknown queue", "enqueue batch over 1000", "not_before and delay_secs",
    "lease_secs huge", "bad regex", "wrong method"}]


def test_real_master_rejects_bad_input(real: httpx.Client) -> None:
    assert len(REAL_CASES) == 18
    for name, method, url, kw, status, code, fragment in REAL_CASES:
        r = real.request(method, url, **kw)
        try:
            check_error(r, status, code, fragment)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None
    r = real.post(TASKS, json={"tasks": [{"pid": "still-here"}]})
    assert r.status_code == 200, r.text


def test_real_master_stale_token(real: httpx.Client) -> None:
    r = real.post(f"{G}/queues/stale/tasks", json={"tasks": [{"pid": "t"}]})
    assert r.status_code == 200, r.text
    r = real.post(f"{G}/queues/stale/lease", json={"lease_secs": 600})
    [t] = r.json()["tasks"]
    bad = forge_token(t["token"], lease_seq(t["token"]) + 1)
    r = real.post(UPDATE, json={"dequeue": [{"queue": "stale", "pid": "t", "token": bad}]})
    check_error(r, 409, "lease_lost", str(bad))
    r = real.post(f"{G}/queues/stale/lease", json={"lease_secs": 600})
    assert r.json()["tasks"] == []  # still leased by the first lease
    r = real.post(UPDATE, json={"dequeue": [{"queue": "stale", "pid": "t", "token": t["token"]}]})
    assert r.status_code == 200, r.text


def test_real_master_body_limits(real_master: MasterProcess, real: httpx.Client) -> None:
    """Over real sockets: a content-length over the limit is refused from the header alone;
    a chunked body is cut off while streaming; a lone surrogate escape and raw invalid UTF-8
    are 400s; and none of it hurts the server."""
    limit = MasterSettings(data_dir="").max_body_bytes
    listing = real.get("/v1/queues", params={"min_tasks": 0}).json()
    host = (f"Host: 127.0.0.1:{real_master.port}\r\n"
            f"Authorization: {ADMIN['Authorization']}\r\n").encode()
    head = (f"POST {TASKS} HTTP/1.1\r\n".encode() + host
            + b"Content-Type: application/json\r\n"
            + f"Content-Length: {limit + 1}\r\nConnection: close\r\n\r\n".encode())
    status, body = raw_request(real_master, head)  # the body is never sent
    assert status == 413 and body["error"]["code"] == "too_large", body
    assert body["error"]["message"]

    # chunked, over the limit: stream chunks until the server answers and closes
    head = (f"POST {TASKS} HTTP/1.1\r\n".encode() + host
            + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
            + b"Connection: close\r\n\r\n")
    chunk = b"x" * (1 << 20)
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    status, body = _stream_until_answer(real_master, head, frame, limit // len(chunk) + 4)
    assert status == 413 and body["error"]["code"] == "too_large", body

    for raw in (b'{"tasks": [{"pid": "\\ud800"}]}', b'{"tasks": [{"pid": "\xed\xa0\x80"}]}',
                b'{"tasks": [{"pid": "\xff"}]}', b'{"tasks": [{"pid": "a\\u0000"}]}'):
        head = (f"POST {TASKS} HTTP/1.1\r\n".encode() + host
                + b"Content-Type: application/json\r\n"
                + f"Content-Length: {len(raw)}\r\nConnection: close\r\n\r\n".encode())
        status, body = raw_request(real_master, head, raw)
        assert status == 400 and body["error"]["message"], (raw, body)
    assert real.get("/v1/queues", params={"min_tasks": 0}).json() == listing  # no trace


def _stream_until_answer(m: MasterProcess, head: bytes, frame: bytes, frames: int
                         ) -> tuple[int, dict[str, Any]]:
    """Send `frames` chunk frames (fewer if the server answers first), then read the answer.
    The server may answer before the body ends; a reset after it answered is fine."""
    with socket.create_connection(("127.0.0.1", m.port), timeout=30) as s:
        s.sendall(head)
        s.settimeout(0.0)
        data = b""
        for _ in range(frames):
            with contextlib.suppress(BlockingIOError):  # has it answered yet?
                data += s.recv(65536)
            if data:
                break
            s.settimeout(30)
            try:
                s.sendall(frame)
            except (BrokenPipeError, ConnectionResetError):
                break
            s.settimeout(0.0)
        s.settimeout(30)
        try:
            while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:
            pass
    assert data, "no answer"
    status = int(data.partition(b"\r\n")[0].split()[1])
    return status, json.loads(data.partition(b"\r\n\r\n")[2])


async def test_validation_does_not_depend_on_state(client: httpx.AsyncClient) -> None:
    """Bad input is refused the same way whether the queue or the pid exists or not."""
    r = await client.post(TASKS, json={"tasks": [{"pid": "dup"}]})
    assert r.status_code == 200, r.text
    both = {"pid": "dup", "not_before": 1, "delay_secs": 1}  # would collapse into "dup"
    check_error(await client.post(TASKS, json={"tasks": [both]}), 400, "bad_request", "not both")
    for q in ("q", "never-seen"):  # an existing and an unknown queue
        r = await client.post(f"{G}/queues/{q}/lease", json={"max_pid": "a\x00"})
        check_error(r, 400, "bad_request", "NUL")
        r = await client.post(f"{G}/queues/{q}/lease", json={"max_pid": LONG_UTF8_PID})
        check_error(r, 413, "too_large", "pid")
        check_error(await client.get(f"{G}/queues/{q}/tasks/a%00"), 400, "bad_request", "NUL")
        r = await client.get(f"{G}/queues/{q}/tasks/{LONG_UTF8_PID}")
        check_error(r, 413, "too_large", "pid")
    r = await client.get(f"{TASKS}/dup")
    assert r.status_code == 200 and r.json()["state"] == "available"
