"""A message as a squall task's payload.

A message with nothing but a body is stored as the body's UTF-8 bytes, so squall's own
client, CLI and Spark read the body as the payload, and a payload put by them is received
through SQS as the body. A message with message attributes, a group id, a deduplication id
or a trace header is framed::

    b"\\x00sqs1" + msgpack {"b": body, "a": {name: [data type, str | bytes]},
                           "g": group id?, "d": deduplication id?, "t": trace header?,
                           "s": sender id?}

SQS bodies cannot hold NUL, so no body is mistaken for a frame. A payload that is not UTF-8
(put by squall's client) is received as its base64 with the message attribute
``squall.encoding`` = ``base64``.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any

import msgpack

MAGIC = b"\x00sqs1"
ENCODING_ATTR = "squall.encoding"


@dataclass
class Message:
    body: str
    attrs: dict[str, dict[str, Any]] = field(default_factory=dict)  # SQS shape, binary bytes
    group_id: str | None = None
    dedup_id: str | None = None
    trace: str | None = None
    sender: str | None = None


def encode(m: Message) -> bytes:
    if not (m.attrs or m.group_id or m.dedup_id or m.trace or m.sender):
        return m.body.encode("utf-8")
    doc: dict[str, Any] = {"b": m.body}
    if m.attrs:
        doc["a"] = {k: [v["DataType"], v["BinaryValue"] if "BinaryValue" in v
                        else v["StringValue"]] for k, v in m.attrs.items()}
    for key, v in (("g", m.group_id), ("d", m.dedup_id), ("t", m.trace), ("s", m.sender)):
        if v:
            doc[key] = v
    return MAGIC + msgpack.packb(doc, use_bin_type=True)


def decode(payload: bytes) -> Message:
    if payload.startswith(MAGIC):
        try:
            doc = msgpack.unpackb(payload[len(MAGIC):], raw=False)
            attrs = {}
            for k, (t, v) in (doc.get("a") or {}).items():
                attrs[k] = ({"DataType": t, "BinaryValue": v} if isinstance(v, bytes)
                            else {"DataType": t, "StringValue": v})
            return Message(doc["b"], attrs, doc.get("g"), doc.get("d"), doc.get("t"),
                           doc.get("s"))
        except Exception:  # not ours after all: fall through, as bytes
            pass
    try:
        return Message(payload.decode("utf-8"))
    except UnicodeDecodeError:
        return Message(base64.b64encode(payload).decode(),
                       {ENCODING_ATTR: {"DataType": "String", "StringValue": "base64"}})
