"""The first bytes of a task's payload, for the dashboard's task drawer (admins only).

The master never reads payloads on any other path; this one exists so an operator can see
what a failing task carries without a shell. It asks the payload's live replicas in turn
for ``Range: bytes=0-<n-1>`` with a read token the master mints for that one blob, through
the one HTTP engine (``common/transport``), with short timeouts, reading at most ``n``
bytes (``PREVIEW_MAX``); the first replica that answers wins. TLS to the data nodes uses
``SQUALL_TLS_CA`` / ``SQUALL_TLS_CERT`` / ``SQUALL_TLS_KEY``, as a client does.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any
from urllib.parse import quote, urlsplit

from squall.common.security.tls import TLSConfig
from squall.common.transport.aio import Pool
from squall.common.transport.http1 import Broken

PREVIEW_MAX = 4096  # bytes a preview may ask for
CONNECT_S = 2.0
READ_S = 5.0
REPLICAS_TRIED = 3


class Peek:
    """A small connection pool to the data nodes, opened on first use."""

    def __init__(self, tls: TLSConfig | None = None) -> None:
        self.tls = tls
        self.pool: Pool | None = None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def _pool(self) -> Pool:
        if self.pool is None:
            ctx = (self.tls or TLSConfig.from_env()).client_context()
            self.pool = Pool(ctx if isinstance(ctx, ssl.SSLContext) else None, 2.0, 2)
        return self.pool

    async def first_bytes(self, payload: dict[str, Any], n: int) -> tuple[bytes | None, str]:
        """Up to `n` first bytes of the payload (`payload`: a task's reference with its
        live replicas first and a read token), and which replica gave them; or None and
        why no replica did."""
        errors = []
        for url in list(payload.get("replicas") or ())[:REPLICAS_TRIED]:
            try:
                return await self._get(url, payload, n), url
            except (Broken, TimeoutError, OSError, ValueError) as e:
                errors.append(f"{url}: {type(e).__name__}: {e}"[:300])
        return None, "; ".join(errors) or "no live replica"

    async def _get(self, url: str, payload: dict[str, Any], n: int) -> bytes:
        u = urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"not a data node URL: {url!r}")
        port = u.port or (443 if u.scheme == "https" else 80)
        path = f"{u.path.rstrip('/')}/v1/blobs/{quote(payload['blob_id'], safe='')}"
        headers = [("Host", f"{u.hostname}:{port}"),
                   ("Authorization", f"Bearer {payload['token']}"),
                   ("Range", f"bytes=0-{max(0, n - 1)}")]
        r = await self._pool().request((u.scheme, u.hostname, port), "GET", path, headers,
                                       connect_timeout=CONNECT_S, write_timeout=READ_S,
                                       read_timeout=READ_S)
        try:
            if r.status not in (200, 206):
                raise ValueError(f"answered {r.status}")
            got = bytearray()
            async with asyncio.timeout(READ_S):
                async for part in r.parts():
                    got += part[:n - len(got)]
                    if len(got) >= n:
                        break
            return bytes(got)
        finally:
            r.release()
