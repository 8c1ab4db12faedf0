"""The MD5 digests SQS answers and the SDKs check: ``MD5OfMessageBody`` (of the body's
UTF-8 bytes) and ``MD5OfMessageAttributes`` (the SDKs' algorithm: the attributes sorted by
name, each as length-prefixed name, length-prefixed data type, one transport byte (1 string
or number, 2 binary) and the length-prefixed value; lengths are 4-byte big-endian)."""

from __future__ import annotations

import hashlib
import struct
from typing import Any

STRING, BINARY = 1, 2


def md5_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def _lp(b: bytes) -> bytes:
    return struct.pack(">I", len(b)) + b


def md5_attributes(attrs: dict[str, dict[str, Any]]) -> str:
    """`attrs`: name -> {"DataType", "StringValue" | "BinaryValue" (bytes)}."""
    h = hashlib.md5(usedforsecurity=False)
    for name in sorted(attrs):
        a = attrs[name]
        h.update(_lp(name.encode()))
        h.update(_lp(a["DataType"].encode()))
        if "BinaryValue" in a:
            h.update(bytes([BINARY]))
            h.update(_lp(a["BinaryValue"]))
        else:
            h.update(bytes([STRING]))
            h.update(_lp(a["StringValue"].encode()))
    return h.hexdigest()
