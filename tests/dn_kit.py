"""Shared pieces of the data node tests: the test cluster key, token helpers, a fake master
and byte surgery on a node's LMDB file."""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from starlette.responses import JSONResponse

from squall.common.errors import StatusError
from squall.common.security import tokens
from squall.common.wire.cluster import HeartbeatRequest
from tests.helpers import DISPATCH_ENV, DataNodeProcess, start_all

KEY = b"squall-test-cluster-key-0123456789"
ENV = {"SQUALL_CLUSTER_KEY": KEY.decode()}


def tok(op: str, ids: list[str] | str, replicas: list[str] | tuple[str, ...] = (),
        ttl: float = 120.0) -> str:
    return tokens.sign(KEY, op, [ids] if isinstance(ids, str) else ids, time.time() + ttl,
                       replicas=replicas)


def auth(op: str, ids: list[str] | str, replicas: list[str] | tuple[str, ...] = ()
         ) -> dict[str, str]:
    return {"Authorization": "Bearer " + tok(op, ids, replicas)}


class FakeMaster:
    """A tiny master: records heartbeats (after checking their token and shape), hands out
    queued commands, and can be told to fail."""

    def __init__(self) -> None:
        self.beats: list[HeartbeatRequest] = []
        self.commands: dict[str, list[dict[str, Any]]] = {}
        self.failing = False
        self.epoch: int | None = None  # the master-set epoch its answers carry (None: none)
        self.lock = threading.Lock()
        self.app = FastAPI()

        @self.app.post("/v1/nodes/heartbeat")
        async def heartbeat(request: Request) -> JSONResponse:
            if self.failing:
                return JSONResponse({"error": {"code": "unavailable", "message": "down"}}, 503)
            body = HeartbeatRequest.model_validate_json(await request.body())
            try:
                tokens.verify(KEY, tokens.bearer(request.headers.get("authorization")),
                              "heartbeat", body.node_id, time.time())
            except StatusError as e:
                return JSONResponse(e.to_body(), e.status)
            with self.lock:
                self.beats.append(body)
                cmds = self.commands.pop(body.node_id, [])
            answer: dict[str, Any] = {"commands": cmds}
            if self.epoch is not None:
                answer["epoch"] = self.epoch
            return JSONResponse(answer)

    def send(self, node_id: str, *commands: dict[str, Any]) -> None:
        with self.lock:
            self.commands.setdefault(node_id, []).extend(commands)

    def beats_of(self, node_id: str) -> list[HeartbeatRequest]:
        with self.lock:
            return [b for b in self.beats if b.node_id == node_id]

    def reported(self, node_id: str, field: str, blob_id: str, after: int = 0) -> bool:
        """Whether a beat (from index `after` on) listed `blob_id` in `field`."""
        return any(blob_id in getattr(b, field) for b in self.beats_of(node_id)[after:])

    def holds(self, node_id: str, blob_id: str) -> bool:
        """The master's view: the last full report plus the deltas after it."""
        held: set[str] = set()
        for b in self.beats_of(node_id):
            if b.full:
                held = set(b.blob_ids)
            held |= set(b.added)
            held -= set(b.deleted)
        return blob_id in held


def node_id_of(url: str) -> str:
    return str(httpx.get(url + "/readyz", timeout=5).json()["node_id"])


def flip_bytes_in_file(path: str, needle: bytes, offset: int = 0) -> int:
    """Flip one bit of every copy of `needle` (at `offset` inside it) in a file; returns the
    number of copies damaged."""
    hits = 0
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        at = m.find(needle)
        while at >= 0:
            m[at + offset] ^= 0x01
            hits += 1
            at = m.find(needle, at + 1)
        m.flush()
    return hits


def data_file(node_dir: str) -> str:
    return os.path.join(node_dir, "blobs", "data.mdb")


def chunks(total: int, part: int = 1 << 20, seed: bytes = b"") -> Iterator[bytes]:
    """`total` pseudo-random bytes, `part` at a time (never held whole)."""
    n = 0
    while n < total:
        k = min(part, total - n)
        yield os.urandom(k) if not seed else (seed * (k // len(seed) + 1))[:k]
        n += k


def both_dispatch_nodes(name: str) -> Any:
    """A module-scoped `nodes` fixture: two nodes serving their hot routes with the fast
    dispatcher, then two through FastAPI's stack, so every test runs both ways
    (``nodes = both_dispatch_nodes("mine")``)."""
    @pytest.fixture(scope="module", params=sorted(DISPATCH_ENV))
    def nodes(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
              ) -> Iterator[list[DataNodeProcess]]:
        with node_processes(tmp_path_factory.mktemp(name), 2,
                            DISPATCH_ENV[request.param]) as ps:
            yield ps
    return nodes


@contextlib.contextmanager
def node_processes(base: Path, n: int, env: dict[str, str] | None = None
                   ) -> Iterator[list[DataNodeProcess]]:
    """`n` data nodes without a master (scrubber off), started in parallel, stopped after;
    `env`: more environment variables."""
    ps = [DataNodeProcess(str(base / f"n{i}"), env={**ENV, **(env or {})},
                          extra=["--scrub-bytes-per-s", "0"])
          for i in range(n)]
    try:
        start_all(ps)
        yield ps
    finally:
        for p in ps:
            p.stop()
