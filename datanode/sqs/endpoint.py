"""``POST /``: one SQS request, start to end.

1. the SigV4 claims of the request (``sigv4.parse``), the clock window, the region;
2. the access key's principal and signing key (``keys.py``: from the master, cached) and
   the signature over the method, path, query, signed headers and the body;
3. ``X-Amz-Target: AmazonSQS.<Action>``, a JSON body (``application/x-amz-json-1.0``);
4. the action (``actions.py``), answered as JSON, or SQS's error shape (``errors.py``).
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any

import orjson
from starlette.responses import Response
from starlette.types import Scope

from squall.datanode.sqs import sigv4
from squall.datanode.sqs.actions import ACTIONS, Ctx
from squall.datanode.sqs.errors import SqsError
from squall.datanode.sqs.keys import KeyCache
from squall.datanode.sqs.upstream import Upstream

if TYPE_CHECKING:
    from squall.datanode.service import DataNode

log = logging.getLogger("squall.datanode.sqs")
MAX_REQUEST_BYTES = 4 << 20  # a batch of 1 MiB of messages, and its JSON (escapes...)
JSON_10 = "application/x-amz-json-1.0"
TARGET = "AmazonSQS."


def _answer(status: int, body: bytes, extra: list[tuple[bytes, bytes]] | None = None
            ) -> Response:
    r = Response(body, status_code=status, media_type=JSON_10)
    r.headers["x-amzn-RequestId"] = str(uuid.uuid4())
    for k, v in extra or []:
        r.headers[k.decode()] = v.decode()
    return r


def error_answer(e: SqsError) -> Response:
    return _answer(e.status, e.body(), [h for h in e.headers() if h[0] != b"content-type"])


def _headers(scope: Scope) -> tuple[dict[str, str], dict[str, list[str]]]:
    first: dict[str, str] = {}
    every: dict[str, list[str]] = {}
    for k, v in scope.get("headers", ()):
        name, value = k.decode("latin-1").lower(), v.decode("latin-1")
        first.setdefault(name, value)
        every.setdefault(name, []).append(value)
    return first, every


def keys_of(node: DataNode) -> KeyCache:
    kc: KeyCache | None = node.sqs_keys
    if kc is None:
        kc = node.sqs_keys = KeyCache(node)
    return kc


async def serve(node: DataNode, scope: Scope, body: bytes) -> Response:
    try:
        return _answer(200, orjson.dumps(await _serve(node, scope, body)))
    except SqsError as e:
        if e.status >= 500:
            log.warning("SQS %s: %s", e.shape, e.message)
        return error_answer(e)
    except Exception:  # a bug: said in SQS's shape (the SDKs retry InternalFailure)
        log.exception("SQS request failed")
        return error_answer(SqsError("InternalFailure", "The request processing has failed "
                                     "because of an unknown error."))


async def _serve(node: DataNode, scope: Scope, body: bytes) -> dict[str, Any]:
    first, every = _headers(scope)
    query = scope.get("query_string", b"").decode("latin-1")
    signed = sigv4.parse(first, query)
    now = node.clock.now()
    sigv4.check_time(signed, now)
    regions = {r.strip() for r in node.settings.sqs_region.split(",")}
    region = signed.region
    if region not in regions and "*" not in regions:
        raise SqsError("SignatureDoesNotMatch", f"Credential should be scoped to a valid "
                       f"region: this endpoint serves {sorted(regions)}, not "
                       f"'{region[:64]}'")
    info = await keys_of(node).get(signed.access_key_id, signed.date, signed.region)
    raw_path = scope.get("raw_path") or scope["path"].encode()
    sigv4.check(signed, info.signing_key, scope["method"], raw_path.decode("latin-1"),
                query, every, body)
    target = first.get("x-amz-target", "")
    if not target.startswith(TARGET):
        raise SqsError("InvalidAction", "this endpoint speaks the AWS JSON 1.0 protocol: send "
                       "X-Amz-Target: AmazonSQS.<Action> (the query protocol is not served)")
    action = ACTIONS.get(target[len(TARGET):])
    if action is None:
        raise SqsError("InvalidAction", f"The action {target[len(TARGET):][:64]} is not "
                       "valid for this endpoint.")
    try:
        doc = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError:
        raise SqsError("InvalidParameterValue", "the body is not JSON") from None
    if not isinstance(doc, dict):
        raise SqsError("InvalidParameterValue", "the body must be a JSON object")
    host = first.get("host") or node.address.partition("//")[2]
    ctx = Ctx(node, info.principal, Upstream(node, info.credential),
              f"{scope.get('scheme', 'http')}://{host}", region, signed.access_key_id)
    return await action(ctx, doc)
