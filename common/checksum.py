"""CRC32C (Castagnoli) of payloads, streaming, in hardware through google-crc32c.

On the wire a checksum is the unsigned 32-bit value as a decimal integer: the
``X-Squall-Crc32c`` header of blob uploads and downloads, and ``PayloadRef.crc32c``.
"""

from __future__ import annotations

from collections.abc import Iterable

import google_crc32c

from squall.common.errors import BadRequest

CRC_HEADER = "x-squall-crc32c"


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C of `data`, continuing from `crc` (the CRC of what came before)."""
    return int(google_crc32c.extend(crc, data))


class Crc32c:
    """A running CRC32C: ``c = Crc32c(); c.update(part); ...; c.value``; also counts bytes."""

    __slots__ = ("size", "value")

    def __init__(self) -> None:
        self.value = 0
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            self.value = int(google_crc32c.extend(self.value, data))
            self.size += len(data)


def crc_of(parts: Iterable[bytes]) -> tuple[int, int]:
    """(crc32c, size) of the concatenation of `parts`, without joining them."""
    c = Crc32c()
    for p in parts:
        c.update(p)
    return c.value, c.size


def parse_crc(text: str | None) -> int | None:
    """Parse a decimal CRC32C header value; None stays None; anything else is a 400."""
    if text is None or text == "":
        return None
    if not text.isdigit() or int(text) >= 1 << 32:
        raise BadRequest(f"{CRC_HEADER} must be a decimal integer below 2**32, got {text[:40]!r}")
    return int(text)
