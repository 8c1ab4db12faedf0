"""Receipt handles: opaque, signed by the data node with the cluster key, naming the task
and the lease the receive took::

    "sqh1." + b64url(msgpack [group, queue, pid, lease token]) + "." + b64url(HMAC-SHA256(
        cluster key, b"squall-sqs-receipt-v1\\n" + the msgpack))

Every receive leases anew, so it hands out a new handle with the new lease token. A handle
of an earlier receive names a lease token the master no longer honours (its fencing number
is older): it can neither delete the message nor change its visibility. Any data node of
the cluster opens any node's handles (they share the cluster key); a forged or damaged one
is ``ReceiptHandleIsInvalid``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import msgpack

from squall.datanode.sqs.errors import SqsError

PREFIX = "sqh1."
_DOMAIN = b"squall-sqs-receipt-v1\n"
MAX_CHARS = 4096


def _b64(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def _unb64(s: str) -> bytes:
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def _mac(key: bytes, raw: bytes) -> bytes:
    return hmac.new(key, _DOMAIN + raw, hashlib.sha256).digest()


def make(key: bytes, group: str, queue: str, pid: str, token: str) -> str:
    raw = msgpack.packb([group, queue, pid, token])
    return f"{PREFIX}{_b64(raw)}.{_b64(_mac(key, raw))}"


def open_handle(key: bytes, handle: object) -> tuple[str, str, str, str]:
    """(group, queue, pid, lease token), or ReceiptHandleIsInvalid."""
    bad = SqsError("ReceiptHandleIsInvalid", "The input receipt handle is invalid.")
    if not isinstance(handle, str) or len(handle) > MAX_CHARS or not handle.startswith(PREFIX):
        raise bad
    body, _, mac = handle[len(PREFIX):].partition(".")
    try:
        raw, sig = _unb64(body), _unb64(mac)
    except (ValueError, TypeError):
        raise bad from None
    if not hmac.compare_digest(sig, _mac(key, raw)):
        raise bad
    try:
        g, q, pid, tok = msgpack.unpackb(raw)
    except Exception:  # signed by us: only a change of format could get here
        raise bad from None
    return str(g), str(q), str(pid), str(tok)
