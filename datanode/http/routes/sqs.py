"""``POST /`` on a data node: the SQS-compatible endpoint (``datanode/sqs/``, docs/sqs.md).
Its access rule is ``sigv4``: the guard lets the request through and the endpoint checks
its AWS Signature Version 4 itself, refusing unsigned or badly signed requests with SQS's
errors (the guard's bearer credentials mean nothing to an AWS SDK)."""

from __future__ import annotations

from fastapi import Request
from starlette.responses import Response

from squall.datanode.http.deps import NodeDep
from squall.datanode.sqs.endpoint import MAX_REQUEST_BYTES, error_answer, serve
from squall.datanode.sqs.errors import SqsError

BODY = {"requestBody": {"required": True, "content": {"application/x-amz-json-1.0": {
    "schema": {"type": "object", "description": "the action's parameters (AWS SQS API)"}}}}}


async def endpoint(request: Request, node: NodeDep) -> Response:
    """An SQS action (`X-Amz-Target: AmazonSQS.<Action>`, AWS JSON 1.0, SigV4-signed)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_REQUEST_BYTES:
        return error_answer(_too_long(request))
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_REQUEST_BYTES:
            return error_answer(_too_long(request))
    return await serve(node, request.scope, bytes(body))


def _too_long(request: Request) -> SqsError:
    if request.headers.get("x-amz-target", "").endswith("Batch"):
        return SqsError("BatchRequestTooLong", f"Batch requests cannot be longer than "
                        f"{MAX_REQUEST_BYTES} bytes.")
    return SqsError("InvalidParameterValue", "One or more parameters are invalid. Reason: "
                    "Message must be shorter than 1048576 bytes.")


async def endpoint_at_queue(group: str, queue: str, request: Request, node: NodeDep
                            ) -> Response:
    """The same, posted to a queue URL (the body's `QueueUrl` names the queue)."""
    return await endpoint(request, node)
