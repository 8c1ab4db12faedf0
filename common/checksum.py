"""CRC32C (Castagnoli) of payloads, streaming, in hardware through google-crc32c.

On the wire a checksum is the unsigned 32-bit value as a decimal integer: the
``X-Squall-Crc32c`` header of blob uploads and downloads, and ``PayloadRef.crc32c``.

google-crc32c's ``extend`` takes only ``bytes``; for writable buffers (``bytearray``, views
of one: the data node's chunk records) :func:`crc32c` calls the same C library
(``crc32c_extend`` of the libcrc32c the wheel bundles) through ctypes, so checksumming a
buffer never copies it. Other buffers are copied to ``bytes`` first.

:func:`crc32c_combine` gives the CRC32C of two pieces joined from the CRCs of the pieces
(zlib's ``crc32_combine``, for the Castagnoli polynomial): a reader that checks each chunk
of a blob against its own CRC gets the whole blob's CRC without a second pass over the
bytes. google-crc32c has no combine; the operator for a length is built once (a few ms of
GF(2) matrix squaring in Python) and cached, then a combine is one 32-step product.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
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
            return fn
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


_POLY = 0x82F63B78  # CRC32C's polynomial, bit-reversed (the register shifts right)


def _times(op: tuple[int, ...], vec: int) -> int:
    """A 32x32 GF(2) matrix (``op[i]``: the image of bit i) applied to `vec`."""
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= op[i]
        vec >>= 1
        i += 1
    return out


def _then(first: tuple[int, ...], second: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_times(second, v) for v in first)


@functools.lru_cache(maxsize=16)
def _zeros_op(nbytes: int) -> tuple[int, ...]:
    """The operator that feeds `nbytes` zero bytes through a CRC32C register."""
    op = tuple(1 << i for i in range(32))  # identity
    step = (_POLY, *(1 << i for i in range(31)))  # one zero bit
    for _ in range(3):  # -> one zero byte
        step = _then(step, step)
    while nbytes:
        if nbytes & 1:
            op = _then(op, step)
        nbytes >>= 1
        if nbytes:
            step = _then(step, step)  # 2^k zero bytes
    return op


def crc32c_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC32C of ``a + b`` from ``crc1 = crc32c(a)``, ``crc2 = crc32c(b)`` and
    ``len2 = len(b)``. The first call for a length costs a few ms (then cached): use it for
    a fixed piece size (a data node's chunk), not for arbitrary lengths."""
    return _times(_zeros_op(len2), crc1) ^ crc2 if len2 else crc1


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
