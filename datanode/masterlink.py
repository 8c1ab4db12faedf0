"""The data node's requests to the master (heartbeats, the front door's block grants and
commits), sent to the leader of a master set.

``--master`` / ``SQUALL_MASTER`` may name several masters ("http://a:7070,http://b:7070").
A request goes to the address that answered last; a standby's refusal (503 naming the
leader, ``common/masters.py``) sends it to the leader at once, and a connection that could
not be made sends it to the next address: neither was applied. A request that failed after
it was sent is not resent here (it may have been applied; the caller says what that means),
but the next one goes to the next address. At most one round of the addresses per request.
"""

from __future__ import annotations

import orjson

from squall.common.masters import Masters, standby_leader
from squall.datanode.replication.peers import PeerResponse, Peers, PeerUnreachable


async def post(peers: Peers, masters: Masters, path: str, content: bytes,
               headers: dict[str, str], connect_timeout: float | None = None,
               timeout: float | None = None) -> PeerResponse:
    """POST `content` to `path` on the master that leads; its answer (a standby's refusal
    when no address led), or PeerUnreachable as :meth:`Peers.post` raises it."""
    return await request(peers, masters, "POST", path, content, headers,
                         connect_timeout=connect_timeout, timeout=timeout)


async def request(peers: Peers, masters: Masters, method: str, path: str,
                  content: bytes | None, headers: dict[str, str], *, replay: bool = False,
                  connect_timeout: float | None = None, timeout: float | None = None
                  ) -> PeerResponse:
    """:func:`post` for any method; `path` may carry a query string. `replay`: resend on
    a reused connection that broke (idempotent requests only)."""
    hops = 0
    while True:
        base = masters.current
        try:
            r = await peers.request(method, base + path, content, headers, replay,
                                    connect_timeout, timeout)
        except PeerUnreachable as e:
            if masters.several:
                masters.advance(base)
                if not e.sent and hops < len(masters) - 1:
                    hops += 1
                    continue
            raise
        if r.status_code != 503:
            return r
        try:
            body = orjson.loads(r.content)
        except orjson.JSONDecodeError:
            body = None
        standby, leader = standby_leader(r.status_code, r.headers, body)
        if not standby:
            return r
        if masters.follow(base, leader) is not None:
            if hops > len(masters):
                return r
        elif masters.several:
            masters.advance(base)
            if hops >= len(masters) - 1:
                return r
        else:
            return r
        hops += 1
