"""Who is in a master set, and how a member calls another member's journal.

Members are named by their advertised base URL (``http://10.0.0.5:7070``). The set is
explicit: the first leader logs the members it was started with (``--members``) right
after its epoch start, and every change after is an operator's command (``squall master
members add|remove``), one member at a time, logged as a record the standbys apply like
any other (op ``("C", "H", "", "members", {"members": [...]})``). A member reads the
current set from its index at start and falls back to ``--members`` before the first
record.

Journal calls travel through ``common/transport`` as ``POST /v1/journal/{method}`` with a
msgpack body, authorized by a token signed with the cluster key (op ``journal``), which
only members and data nodes hold; data nodes never get such a token minted.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlsplit

import msgpack

from squall.common.security import tokens
from squall.common.transport.aio import Pool
from squall.common.transport.http1 import Broken
from squall.master.ha.journal import Refused
from squall.master.ha.quorum import Unreachable

MEMBERS_KEY = ("H", "", "members")  # the conf row holding the set
TOKEN_SECS = 60.0


def parse_members(text: str) -> list[str]:
    """`--members a,b,c` -> normalized, distinct base URLs."""
    out: list[str] = []
    for raw in text.split(","):
        url = raw.strip().rstrip("/")
        if not url:
            continue
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname or u.path not in ("", "/"):
            raise ValueError(f"a member is named by its base URL (http://host:port), "
                             f"not {raw!r}")
        if url not in out:
            out.append(url)
    return out


def members_op(members: list[str]) -> tuple[Any, ...]:
    return ("C", "H", "", "members", {"members": list(members)})


def members_in_index(index: Any) -> list[str] | None:
    rec = getattr(index, "ha_conf", {}).get(("", "members"))
    return list(rec["members"]) if rec else None


def journal_token(key: bytes, me: str) -> str:
    return tokens.sign(key, "journal", [me], time.time() + TOKEN_SECS)


class HttpJournalClient:
    """Another member's journal over HTTP."""

    def __init__(self, url: str, me: str, key: bytes, pool: Pool,
                 timeout: float = 5.0) -> None:
        self.url, self.me, self.key, self.pool, self.timeout = url, me, key, pool, timeout
        u = urlsplit(url)
        self._key_t = (u.scheme, u.hostname or "", u.port or (443 if u.scheme == "https"
                                                               else 80))
        self._token: tuple[float, str] = (0.0, "")

    def _auth(self) -> str:
        exp, tok = self._token
        if time.time() > exp - TOKEN_SECS / 2:
            tok = journal_token(self.key, self.me)
            self._token = (time.time() + TOKEN_SECS, tok)
        return tok

    async def call(self, method: str, args: dict[str, Any]) -> Any:
        body = msgpack.packb(args, use_bin_type=True)
        host = f"{self._key_t[1]}:{self._key_t[2]}"
        headers = [("Host", host), ("Authorization", f"Bearer {self._auth()}"),
                   ("Content-Type", "application/x-msgpack")]
        try:
            r = await self.pool.request(self._key_t, "POST", f"/v1/journal/{method}",
                                        headers, body, connect_timeout=self.timeout,
                                        write_timeout=self.timeout,
                                        read_timeout=self.timeout, replay=False)
            try:
                data = await r.read()
            finally:
                r.release()
        except (Broken, OSError, TimeoutError) as e:
            raise Unreachable(f"{self.url}: {e}") from e
        if r.status == 409:
            out = msgpack.unpackb(data, raw=False)
            raise Refused(out["refused"], out["detail"], out.get("state"))
        if r.status != 200:
            raise Unreachable(f"{self.url}: journal {method} answered {r.status}: "
                              f"{data[:200]!r}")
        return decode_records(method, msgpack.unpackb(data, raw=False))


def decode_records(method: str, out: Any) -> Any:
    if method == "read":
        return [(int(t), bytes(b)) for t, b in out]
    return out


def decode_args(method: str, args: dict[str, Any]) -> dict[str, Any]:
    if "records" in args:
        args["records"] = [(int(t), bytes(b)) for t, b in args["records"]]
    return args
