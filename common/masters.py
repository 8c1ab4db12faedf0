"""Several master addresses, and which one to talk to: the leader-following shared by the
client (``client/_syncdriver.py``, ``client/_async.py``) and the data node's calls to the
master (``datanode/heartbeat.py``, ``datanode/frontdoor.py``).

A master set's standby answers every request but ``/healthz``, ``/readyz`` and
``GET /v1/leader`` with HTTP 503, a JSON body ``{"detail": "standby of <url> (lag N
records)", "leader": <url or null>}`` and, when it knows the leader, the header
``X-Squall-Leader: <url>``. Nothing was applied: the caller switches to the leader and
resends at once. A connection that cannot be made (refused, unresolvable) was never sent
either: the caller tries the next address. The address that answered last is kept for the
next request.

One address (the default, or a Kubernetes Service whose endpoints are the ready pods)
behaves exactly as before: there is nothing to switch to.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

from squall.common.errors import Unavailable

LEADER_HEADER = "X-Squall-Leader"
MAX_ADDRESSES = 16  # configured and learned; a bound on what a standby's header can add


def parse_masters(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """The addresses of `spec`: a comma-separated string ("http://a:1,http://b:2") or a
    sequence of strings; blanks dropped, trailing slashes removed, duplicates kept once.
    Each must be an http(s) URL naming a host (ValueError otherwise, at once: a client
    that retried a connection it can never make would wait out its whole retry budget
    first)."""
    parts: list[str] = []
    if spec is None:
        return ()
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    for item in items:
        if not isinstance(item, str):
            raise ValueError(f"a master address must be a string, not {type(item).__name__}")
        addr = item.strip().rstrip("/")
        if not addr:
            continue
        _check_address(addr)
        if addr not in parts:
            parts.append(addr)
    if len(parts) > MAX_ADDRESSES:
        raise ValueError(f"at most {MAX_ADDRESSES} master addresses, not {len(parts)}")
    return tuple(parts)


def _check_address(addr: str) -> None:
    try:
        u = urlsplit(addr)
        u.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError:
        u = None
    if u is None or u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"a master address is an http(s) URL such as http://host:7070, "
                         f"not {addr[:200]!r}")


def standby_leader(status: int, headers: Mapping[str, str], body: Any) -> tuple[bool, str | None]:
    """(is this a standby's refusal, the leader it names or None) for an answer.

    A standby's refusal is a 503 with the ``X-Squall-Leader`` header, or whose JSON body
    has a ``leader`` key (null while the set elects). Any other 503 (a leader that cannot
    reach its journals, a restarting master) is not: it is retried as before."""
    if status != 503:
        return False, None
    leader = _header(headers, LEADER_HEADER)
    if isinstance(body, dict) and "leader" in body:
        named = body.get("leader")
        leader = leader or (named if isinstance(named, str) else None)
        return True, _clean(leader)
    if leader:
        return True, _clean(leader)
    return False, None


def origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, None for anything else."""
    try:
        u = urlsplit(url)
        host, port = u.hostname, u.port
    except ValueError:
        return None
    if u.scheme not in ("http", "https") or not host:
        return None
    return (u.scheme, host, port or (443 if u.scheme == "https" else 80))


class Standby(Unavailable):
    """A master set's standby refused the request (nothing was applied); `leader`: the
    address it names, None while the set elects."""

    def __init__(self, message: str, leader: str | None, retry_after: float | None = None
                 ) -> None:
        super().__init__(message, {"leader": leader}, retry_after)
        self.leader = leader


def standby_error(status: int, headers: Mapping[str, str], body: Any,
                  retry_after: float | None = None) -> Standby | None:
    """The :class:`Standby` error for a standby's refusal, None for any other answer."""
    is_standby, leader = standby_leader(status, headers, body)
    if not is_standby:
        return None
    detail = body.get("detail") if isinstance(body, dict) else None
    if not isinstance(detail, str) or not detail:
        err = body.get("error") if isinstance(body, dict) else None
        detail = str(err.get("message", "")) if isinstance(err, dict) else ""
    detail = detail[:300] or "a standby master"
    where = f"; the leader is {leader}" if leader else "; no leader is known yet"
    return Standby(f"{detail}{where}", leader, retry_after)


def _header(headers: Mapping[str, str], name: str) -> str | None:
    v = headers.get(name) or headers.get(name.lower())
    if v is None:
        low = name.lower()
        for k, val in headers.items():
            if k.lower() == low:
                return val
    return v


def _clean(url: str | None) -> str | None:
    if not url:
        return None
    url = url.strip().rstrip("/")
    return url if url.startswith(("http://", "https://")) and len(url) <= 2048 else None


class Masters:
    """The master addresses of one client or data node and the one in use (thread-safe;
    an event loop's tasks share it too). ``current`` is where the next request goes."""

    def __init__(self, spec: str | Sequence[str] | None, default: str | None = None) -> None:
        addrs = parse_masters(spec) or parse_masters(default)
        if not addrs:
            raise ValueError("no master address given")
        self.configured = addrs
        self._addrs = list(addrs)
        self._current = addrs[0]
        self._origins = {origin(a) for a in addrs}
        self._lock = threading.Lock()
        self.switches = 0  # how often the address in use changed (tests, status)
        self.on_switch: Callable[[], None] | None = None  # called (no lock held) on a change

    def __len__(self) -> int:
        return len(self._addrs)

    def __contains__(self, url: object) -> bool:
        return url in self._addrs

    @property
    def current(self) -> str:
        return self._current

    @property
    def addresses(self) -> tuple[str, ...]:
        return tuple(self._addrs)

    @property
    def several(self) -> bool:
        """More than one address to switch between (one configured address can still
        learn the leader's from a standby)."""
        return len(self._addrs) > 1

    def follow(self, failed: str, leader: str | None) -> str | None:
        """A standby at `failed` named `leader`: use it from now on. The leader's address
        joins the list if it was not in it (a set reached through one address). None when
        it names nobody new (itself, or nobody): then :meth:`advance` decides."""
        leader = _clean(leader)
        if leader is None or leader == failed:
            return None
        with self._lock:
            if leader not in self._addrs:
                if len(self._addrs) >= MAX_ADDRESSES:
                    return None
                self._addrs.append(leader)
                self._origins.add(origin(leader))
            moved = self._current != leader
            if moved:
                self._current = leader
                self.switches += 1
        if moved:
            self._moved()
        return leader

    def advance(self, failed: str) -> str:
        """`failed` could not be reached (or named no leader): the next address after it,
        which is used from now on unless another request moved on already."""
        with self._lock:
            if self._current != failed:
                return self._current  # another request moved on: follow it
            try:
                i = self._addrs.index(failed)
            except ValueError:
                i = -1
            nxt = self._addrs[(i + 1) % len(self._addrs)]
            moved = nxt != self._current
            if moved:
                self._current = nxt
                self.switches += 1
        if moved:
            self._moved()
        return nxt

    def _moved(self) -> None:
        if self.on_switch is not None:
            self.on_switch()

    def has_origin(self, key: tuple[str, str, int] | None) -> bool:
        """Whether (scheme, host, port) is a master's (its credential may go there)."""
        return key is not None and key in self._origins
