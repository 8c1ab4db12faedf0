"""squall's one HTTP/1.1 client engine: every request squall sends (the clients, the Worker,
data node to peer and to master, heartbeats) goes through it.

- ``http1.py``: the sans-I/O core: request heads, the answer :class:`Reader` (llhttp, via
  ``httptools``), the bounds, and :class:`Broken`, the one failure type (its phase says
  whether the request may have been sent).
- ``sync.py``: the blocking driver (sockets) and its pool.
- ``aio.py``: the asyncio driver (streams) and its pool.
- ``adapters.py``: the engine behind httpx's transport interface (the clients' default), and
  the direct path that skips httpx's request and response objects.

Callers translate :class:`Broken` once, at their boundary: the client into squall's error
tree (``client/_http.py``), the data node into ``PeerUnreachable``.
"""

from squall.common.transport.http1 import Broken, Malformed, PoolBusy, Reader

__all__ = ["Broken", "Malformed", "PoolBusy", "Reader"]
