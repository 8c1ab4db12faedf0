"""Who may *try* to lead a master set: a pluggable elector.

The elector only decides which member attempts to lead. Safety comes from the epochs the
journals promise (a deposed leader's next group is refused), never from the elector:
leader-election leases do not fence (docs/decisions/0024-one-commit-path.md).

A member's role loop calls :meth:`Elector.try_acquire` every ``lease_secs / 3``. Taking
``t0 = monotonic()`` *before* the call, a ``True`` answer means this member holds the
lease until ``t0 + lease_secs * (1 - skew margin)`` by its own clock; past that it stops
acknowledging writes unless a later call renewed it.
"""

from __future__ import annotations

import importlib
from typing import Protocol


class Elector(Protocol):
    kind: str  # "static", "etcd", "kubernetes": shown by `squall status` and the dashboard
    lease_secs: float

    async def try_acquire(self, me: str) -> bool:
        """Acquire or renew the leadership lease for member `me` (its advertised URL).

        True when `me` holds it after the call; False when another member holds an
        unexpired lease or the elector could not be reached (never raises for that)."""
        ...

    async def holder(self) -> str | None:
        """The member the elector names now, None when nobody or unknown (cheap)."""
        ...

    async def release(self, me: str) -> None:
        """Give the lease up if `me` holds it (step-down); best effort."""
        ...

    async def close(self) -> None: ...


class StaticElector:
    """"This one leads": a fixed member, for a single master or a hand-run set."""

    kind = "static"

    def __init__(self, leader: str, lease_secs: float = 5.0) -> None:
        self.leader, self.lease_secs = leader, lease_secs

    async def try_acquire(self, me: str) -> bool:
        return me == self.leader

    async def holder(self) -> str | None:
        return self.leader

    async def release(self, me: str) -> None:
        return None

    async def close(self) -> None:
        return None


# spec prefix -> "module:class" whose `from_spec(rest: str) -> Elector` builds it
_KINDS = {
    "etcd": "squall.master.ha.etcd:EtcdElector",
    "kubernetes": "squall.master.ha.kube:KubeLeaseElector",
    "file": "squall.master.ha.elector:FileLeaseElector",
}


def make_elector(spec: str) -> Elector:
    """Build an elector from `static:<member url>`, `etcd:<...>` or `kubernetes:<...>`."""
    kind, _, rest = spec.partition(":")
    if kind == "static":
        if not rest:
            raise ValueError("static elector: name the leader, e.g. static:http://127.0.0.1:8000")
        return StaticElector(rest)
    target = _KINDS.get(kind)
    if target is None:
        raise ValueError(f"unknown elector {kind!r}: use static:, etcd:, kubernetes: or file:")
    module, _, cls = target.partition(":")
    built: Elector = getattr(importlib.import_module(module), cls).from_spec(rest)
    return built


class FileLeaseElector:
    """A lease in a file on a disk every member shares (one machine): for `squall dev
    --masters N` and tests, never for production. The lease {holder, until} is read and
    replaced under an exclusive ``flock``; `until` is wall-clock time (one machine: one
    clock). Like every elector it only picks who tries to lead; the epochs fence.

    To rehearse losing the elector on one machine, create ``<path>.cut-<member>`` (the
    member's URL with every character but letters and digits as ``_``): that member's
    calls then fail as if the elector were unreachable, until the file is removed."""

    kind = "file"

    def __init__(self, path: str, lease_secs: float = 3.0) -> None:
        self.path, self.lease_secs = path, lease_secs

    @classmethod
    def from_spec(cls, rest: str) -> FileLeaseElector:
        if not rest:
            raise ValueError("file elector: name the lease file, e.g. file:/tmp/squall.lease")
        return cls(rest)

    def cut_path(self, me: str) -> str:
        return f"{self.path}.cut-" + "".join(c if c.isalnum() else "_" for c in me)

    def _swap(self, me: str | None, release: bool = False) -> str | None:
        import fcntl
        import json
        import os
        import time

        if me is not None and os.path.exists(self.cut_path(me)):
            raise OSError(f"{me} is cut off the elector ({self.cut_path(me)} exists)")

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.read(fd, 4096)
            try:
                cur = json.loads(raw) if raw else {}
            except ValueError:
                cur = {}
            now = time.time()
            holder = cur.get("holder") if cur.get("until", 0) > now else None
            if me is not None and (holder in (None, me)) and not release:
                holder = me
                new = {"holder": me, "until": now + self.lease_secs}
            elif me is not None and release and holder == me:
                holder, new = None, {}
            else:
                return str(holder) if holder else None
            os.lseek(fd, 0, os.SEEK_SET)
            os.ftruncate(fd, 0)
            os.write(fd, json.dumps(new).encode())
            return holder
        finally:
            os.close(fd)

    async def try_acquire(self, me: str) -> bool:
        import asyncio

        try:
            return await asyncio.to_thread(self._swap, me) == me
        except OSError:
            return False

    async def holder(self) -> str | None:
        import asyncio

        try:
            return await asyncio.to_thread(self._swap, None)
        except OSError:
            return None

    async def release(self, me: str) -> None:
        import asyncio
        import contextlib

        with contextlib.suppress(OSError):
            await asyncio.to_thread(self._swap, me, True)

    async def close(self) -> None:
        return None
