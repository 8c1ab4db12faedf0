"""HTTP/1.1 framing shared by the lean transports, without I/O: the request head they send
and the answer head they read. The asyncio core (``common/transport/aio.py``: the async client
and the data nodes' peer client) and the sync client's transport (``client/_leanhttp.py``)
do their own reads and writes around these two functions.

- :func:`request_head`: the request line and the caller's headers as given (they name the
  Host), plus ``Content-Length`` for a body of known size (also 0 for a method that
  normally has a body) or ``Transfer-Encoding: chunked`` for a streamed one, unless the
  caller set either.
- :func:`parse_head`: status, reason and headers of an answer, and how its body is framed
  (``Content-Length``, chunked, or up to the connection's end) and whether the connection
  may carry another exchange afterwards. Anything that is not an HTTP/1.x answer raises
  ``ValueError``.
"""

from __future__ import annotations

from dataclasses import dataclass

NO_BODY = ("GET", "HEAD", "DELETE", "OPTIONS")  # methods that send no Content-Length: 0
MAX_HEAD_BYTES = 64 << 10  # an answer's head (status line and headers) is at most this
COALESCE_BYTES = 64 << 10  # a body up to this goes out with its head in one send
MAX_INTERIM = 8  # interim (1xx) answers a reader skips before the answer, at most


def request_head(method: str, target: str, headers: list[tuple[str, str]],
                 size: int | None) -> tuple[bytes, bool]:
    """The request's head, ending with its blank line, and whether the body goes chunked.
    `size`: the body's length (0: none), None for a body streamed in parts."""
    lines = [f"{method} {target} HTTP/1.1"]
    lines += [f"{k}: {v}" for k, v in headers]
    lower = {k.lower(): v for k, v in headers}
    chunked = "chunked" in lower.get("transfer-encoding", "").lower() or (
        size is None and "content-length" not in lower)
    if chunked and "transfer-encoding" not in lower:
        lines.append("Transfer-Encoding: chunked")
    elif size is not None and "content-length" not in lower and (
            size or method not in NO_BODY):
        lines.append(f"Content-Length: {size}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"), chunked


@dataclass(slots=True)
class Head:
    """An answer's head. ``length``: the body's size, or None when it is chunked
    (``chunked``) or runs to the connection's end. ``keep``: the connection may carry
    another exchange once the body was read to its end."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    length: int | None
    chunked: bool
    keep: bool

    @property
    def interim(self) -> bool:
        """A 1xx answer other than 101: the real answer follows on the connection."""
        return 100 <= self.status < 200 and self.status != 101

    def header_dict(self) -> dict[str, str]:
        """The headers by lower-case name (the last of repeated ones)."""
        return {k.lower(): v for k, v in self.headers}


def parse_head(block: bytes, method: str) -> Head:
    """The answer head in `block` (its lines, with or without the blank line; a bare LF
    ends a line too, as most clients allow) to a request made with `method`."""
    lines = [line.rstrip("\r") for line in block.decode("latin-1").rstrip("\r\n").split("\n")]
    version, _, rest = lines[0].partition(" ")
    if not version.startswith("HTTP/1.") or len(rest) < 3 or not rest[:3].isdigit():
        raise ValueError(f"not an HTTP/1.x answer: {lines[0][:60]!r}")
    status, reason = int(rest[:3]), rest[4:]
    headers: list[tuple[str, str]] = []
    keep = version == "HTTP/1.1"
    length: int | None = None
    chunked = has_length = False
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise ValueError(f"not an HTTP header line: {line[:60]!r}")
        name, value = name.strip(), value.strip()
        headers.append((name, value))
        low = name.lower()
        if low == "connection" and value.lower() == "close":
            keep = False
        elif low == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
        elif low == "content-length":
            if not value.isdigit():
                raise ValueError(f"bad Content-Length {value[:30]!r}")
            length, has_length = int(value), True
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        length, chunked = 0, False
    elif chunked:
        length = None
    elif not has_length:
        keep = False  # framed by the connection's end
    return Head(status, reason, headers, length, chunked, keep)
