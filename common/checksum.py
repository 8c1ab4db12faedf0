"""CRC32C (Castagnoli) of payloads, streaming, in hardware through google-crc32c.

On the wire a checksum is the unsigned 32-bit value as a decimal integer: the
``X-Squall-Crc32c`` header of blob uploads and downloads, and ``PayloadRef.crc32c``.

google-crc32c's ``extend`` takes only ``bytes``; for writable buffers (``bytearray``, views
of one: the data node's chunk records) :func:`crc32c` calls the same C library
(``crc32c_extend`` of the libcrc32c the wheel bundles) through ctypes, so checksumming a
buffer never copies it. Other buffers are copied to ``bytes`` first.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
from collections.abc import Callable, Iterable

import google_crc32c

from squall.common.errors import BadRequest

CRC_HEADER = "x-squall-crc32c"


def _native_extend() -> Callable[[int, object, int], int] | None:
    here = os.path.dirname(os.path.abspath(google_crc32c.__file__))
    paths = sorted(glob.glob(os.path.join(here, os.pardir, "google_crc32c.libs",
                                          "libcrc32c*.so*")))
    paths += [p for p in (ctypes.util.find_library("crc32c"),) if p]
    for path in paths:
        try:
            fn = ctypes.CDLL(path).crc32c_extend
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
        fn.restype = ctypes.c_uint32
        if fn(0, b"123456789", 9) == 0xE3069283:  # the CRC32C check value
            return fn  # type: ignore[no-any-return]
    return None


_EXTEND = _native_extend()


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC32C of `data`, continuing from `crc` (the CRC of what came before)."""
    if type(data) is not bytes:
        if _EXTEND is not None:
            try:
                buf = (ctypes.c_char * len(data)).from_buffer(data)  # shares the memory
            except TypeError:  # read-only or not a plain byte buffer
                pass
            else:
                return int(_EXTEND(crc, buf, len(data)))
        data = bytes(data)
    return int(google_crc32c.extend(crc, data))


class Crc32c:
    """A running CRC32C: ``c = Crc32c(); c.update(part); ...; c.value``; also counts bytes."""

    __slots__ = ("size", "value")

    def __init__(self) -> None:
        self.value = 0
        self.size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        if data:
            self.value = crc32c(data, self.value)
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
