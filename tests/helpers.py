"""Test harness: real master and data node processes on 127.0.0.1, in-process apps, waiting
on conditions."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar

import httpx
import pytest

if TYPE_CHECKING:
    from squall.client.cli.dev import DevCluster

T = TypeVar("T")

# Every server a test starts (in process or as a subprocess) checks credentials under this
# auth key, and every client sends the admin credential from SQUALL_TOKEN; tests of access
# control mint their own (see tests/test_access.py).
# (an Ed25519 private key: masters sign with it; data nodes get its public half)
TEST_AUTH_KEY = b"ed25519-private:c3F1YWxsLXRlc3QtYXV0aC1rZXktMDEyMzQ1Njc4OWE"
os.environ["SQUALL_AUTH_KEY"] = TEST_AUTH_KEY.decode()


def _test_keys() -> Any:
    from squall.common.security.auth import parse_keys

    return parse_keys(TEST_AUTH_KEY)


TEST_KEYS = _test_keys()
TEST_PUBLIC_KEY = TEST_KEYS.public_text().strip()
os.environ["SQUALL_AUTH_PUBLIC_KEY"] = TEST_PUBLIC_KEY.decode()


def mint(*roles: str, ttl_s: float = 20 * 365 * 86400.0, **kw: Any) -> str:
    """A credential under the tests' auth key."""
    from squall.common.security.auth import mint as _mint

    return _mint(TEST_KEYS, roles, ttl_s, time.time(), **kw)


ADMIN_TOKEN = mint("admin")
os.environ["SQUALL_TOKEN"] = ADMIN_TOKEN
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}  # headers for raw HTTP calls


# lease tokens on the wire are `<fencing number>.<mac>` (master/tasks/leasetokens.py)
FAKE_TOKEN = "1." + "0" * 32  # well formed, never issued: stands in where any token does


def lease_seq(token: str) -> int:
    """The fencing number a lease token carries (it grows with every lease)."""
    return int(token.partition(".")[0])


def forge_token(token: str, seq: int | None = None, flip: bool = False) -> str:
    """A well-formed token the master never issued: `token`'s mac with another number, or
    (``flip``) its number with one mac digit changed."""
    n, _, mac = token.partition(".")
    if flip:
        mac = mac[:-1] + ("0" if mac[-1] != "0" else "1")
    return f"{n if seq is None else seq}.{mac}"


def master_auth(master_url: str) -> httpx.Auth:
    """httpx `auth=` sending the admin credential to the master only: a client that also
    calls data nodes (payload tokens in their own Authorization header) must not send it
    there."""
    from squall.client._http import MasterAuth

    return MasterAuth(master_url, ADMIN_TOKEN)


def start_cluster(data_dir: Path, nodes: int, *, heartbeat_interval_s: float = 0.3,
                  extra_env: dict[str, str] | None = None) -> DevCluster:
    """A `squall dev` cluster (master and `nodes` data nodes as subprocesses) on a free
    block of ports, tried again on another block if one was taken meanwhile."""
    from squall.client.cli.dev import DevCluster

    for _ in range(5):
        c = DevCluster(data_dir, free_port_block(nodes + 1), nodes,
                       heartbeat_interval_s=heartbeat_interval_s, extra_env=extra_env)
        try:
            c.start()
            return c
        except RuntimeError as e:
            c.stop()
            if "in use" not in str(e):
                raise
    raise RuntimeError("no free ports")


def cluster_fixture(name: str, nodes: int = 3, **kw: Any) -> Any:
    """A module-scoped `cluster` fixture: ``cluster = cluster_fixture("mine")``."""
    @pytest.fixture(scope="module")
    def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
        c = start_cluster(tmp_path_factory.mktemp(name), nodes, **kw)
        try:
            yield c
        finally:
            c.stop()
    return cluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_block(n: int) -> int:
    """A base port with `n` free ports from it, below the kernel's ephemeral range, so no
    outgoing connection can take one between this check and the servers' bind (a server
    group like `squall dev` listens on base, base+1, ... base+n-1)."""
    import random

    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError):
        low = 32768
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(10_000, low - n)
        ok = True
        for p in range(base, base + n):
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError(f"no block of {n} free ports below {low}")


def http_status(url: str, timeout: float = 1.0) -> int:
    """The status of a GET of a plain-HTTP `url` (a readiness poll). Not httpx: each of its
    one-off calls builds a TLS context (~25 ms of CPU here), and a poll every 20 ms while a
    server starts took as much CPU as the server's own start-up."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def wait_for(cond: Callable[[], T], timeout: float = 20.0, interval: float = 0.02,
             what: str = "condition",
             fatal: type[BaseException] | tuple[type[BaseException], ...] = ()) -> T:
    """Poll `cond` until it returns a truthy value; fail after `timeout` seconds. An
    exception of `cond` is retried (and chained to the timeout), except a `fatal` one,
    which fails at once."""
    deadline = time.monotonic() + timeout
    last_exc: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            v = cond()
            if v:
                return v
        except fatal:
            raise
        except Exception as e:
            last_exc = e
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what}") from last_exc


async def until(cond: Callable[[], T], timeout: float = 20.0, interval: float = 0.005,
                what: str = "condition") -> T:
    """:func:`wait_for` inside an event loop: poll `cond` (a plain check, e.g. of an
    in-process server's state) without blocking the loop; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (v := cond()):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)
    return v


class ServerProcess:
    """A real `python -m squall.<role>` subprocess on an ephemeral 127.0.0.1 port (or a
    given one, to restart a server where it was)."""

    role = "server"

    def __init__(self, data_dir: str, extra: list[str] | None = None,
                 env: dict[str, str] | None = None, port: int = 0) -> None:
        self.data_dir = data_dir
        self.extra = extra or []
        self.env = env
        self.port = port
        self.fixed_port = bool(port)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = os.path.join(os.path.dirname(data_dir.rstrip("/")) or ".",
                                     f"{self.role}-{os.path.basename(data_dir)}.log")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self) -> list[str]:
        return [sys.executable, "-m", f"squall.{self.role}", "--data-dir", self.data_dir,
                "--port", str(self.port), *self.extra]

    def launch(self) -> None:
        """Spawn the process (on a fresh port unless fixed) without waiting for it."""
        if not self.fixed_port:
            self.port = free_port()
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child owns it
        self.proc = subprocess.Popen(
            self.argv(), stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, **(self.env or {})},
        )
        log.close()

    def start(self, timeout: float = 30.0, launched: bool = False) -> Self:
        for _ in range(1 if self.fixed_port else 5):
            if not launched:
                self.launch()
            launched = False
            try:
                wait_for(self._ready, timeout, what=f"{self.role} on {self.url}")
                return self
            except TimeoutError:
                assert self.proc is not None
                if self.proc.poll() is None:
                    raise
                # exited early (e.g. the port got taken): try another port
        raise RuntimeError(f"{self.role} did not start; see {self.log_path}")

    def _ready(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise TimeoutError(f"{self.role} exited")
        return http_status(self.url + "/readyz") == 200

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill9()


def start_all(procs: Sequence[ServerProcess], timeout: float = 30.0) -> None:
    """Start several servers at once (their imports overlap instead of adding up)."""
    for p in procs:
        p.launch()
    for p in procs:
        p.start(timeout, launched=True)


class MasterProcess(ServerProcess):
    """A real `python -m squall.master` subprocess."""

    role = "master"


class DataNodeProcess(ServerProcess):
    """A real `python -m squall.datanode` subprocess; it advertises its own URL and takes
    the cluster key from ``SQUALL_CLUSTER_KEY`` (pass it in `env`)."""

    role = "datanode"

    def argv(self) -> list[str]:
        return [*super().argv(), "--advertise", self.url]


@contextlib.contextmanager
def running_master(data_dir: str, **kw: Any) -> Iterator[MasterProcess]:
    m = MasterProcess(data_dir, **kw).start()
    try:
        yield m
    finally:
        m.stop()


# both ways a server process serves its hot routes (module fixtures' params)
DISPATCH_ENV = {"fast": {}, "framework": {"SQUALL_FAST_DISPATCH": "0"}}


@contextlib.asynccontextmanager
async def asgi_master(settings: Any, clock: Any, fast_dispatch: bool = True
                      ) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    """A master app in this process (no background loop: the test ticks it), started, and an
    admin client talking to it over ASGI; yields (client, Master)."""
    from squall.master.http.app import create_master_app

    app = create_master_app(settings, clock=clock, background=False,
                            fast_dispatch=fast_dispatch)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1",
                                     headers=ADMIN) as c:
            yield c, app.state.master


async def asgi_body(receive: Any) -> bytes:
    """The whole body of an ASGI request (for the stand-in servers)."""
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            return body


@contextlib.contextmanager
def running_app(app: Any, timeout: float = 20.0, **config: Any) -> Iterator[str]:
    """Serve an ASGI app (e.g. a fake master) with uvicorn in a thread of this process, on an
    ephemeral 127.0.0.1 port; yields its base URL. `config`: more uvicorn.Config options."""
    import threading

    import uvicorn

    cfg = uvicorn.Config(app, **{"host": "127.0.0.1", "port": free_port(),
                                 "log_level": "warning", "access_log": False,
                                 "lifespan": "off", **config})
    server = uvicorn.Server(cfg)
    thread = threading.Thread(target=server.run, name="uvicorn-test-app", daemon=True)
    thread.start()
    url = f"{'https' if cfg.ssl_certfile else 'http'}://127.0.0.1:{cfg.port}"
    try:
        wait_for(lambda: server.started, timeout, what=f"test app on {url}")
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout)
