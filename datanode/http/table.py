"""A data node's route table: every route it serves, declared once.

A row is (method, path template, handler, response model, access rule, hot); the request
model and the parameters are the handler's signature. The app's FastAPI routes (hence the
OpenAPI document), the access rules the guard enforces, the request-metric labels and the
fast dispatcher of the hot routes all come from here (``common/server/layered.py``). The
rules' vocabulary is ``common/security/access.py``; ``docs/security.md`` lists the same
rules. Blob routes take the role ``payload``: the handler checks the master-signed payload
token (write / read / delete / replicate, scoped to blob ids).
"""

from __future__ import annotations

from starlette.responses import Response

from squall.common.security.access import MONITOR_READ, PAYLOAD, PUBLIC, SIGV4, rule
from squall.common.server.layered import Route, RouteTable, section
from squall.common.wire.cluster import BatchPutResult, PutResult
from squall.common.wire.models import EnqueueResponse
from squall.datanode.http.routes import batch, blobs, frontdoor, health, lease, replicate, sqs
from squall.datanode.http.routes.blobs import ERRORS, RAW_ANSWER, RAW_BODY

R = Route
B = "/v1/blobs/{blob_id}"
READ = rule("payload", body="none")

ROUTES = RouteTable([
    *section(
        "blobs",
        R("PUT", B, blobs.put_blob, PutResult, PAYLOAD, hot=True,
          options={"openapi_extra": RAW_BODY}),
        R("GET", B, blobs.get_blob, None, READ, hot=True,
          responses={200: RAW_ANSWER, 206: RAW_ANSWER,
                     416: {"description": "Range not satisfiable"}, **ERRORS}),
        R("HEAD", B, blobs.head_blob, None, READ),
        R("DELETE", B, blobs.delete_blob, None, READ),
        R("POST", "/v1/blobs:batch-put", batch.batch_put, BatchPutResult, PAYLOAD,
          options={"openapi_extra": RAW_BODY}),
        R("POST", "/v1/blobs:batch-get", batch.batch_get, None, rule("payload"), hot=True,
          responses={200: RAW_ANSWER, **ERRORS})),
    # the front door: a client's tasks with small payloads (msgpack), committed by the node
    *section(
        "front door",
        R("POST", "/v1/groups/{group}/queues/{queue}/tasks", frontdoor.enqueue,
          EnqueueResponse, rule("producer", "path", "binary"), hot=True,
          options={"openapi_extra": frontdoor.BODY}),
        # a lease answered with its payloads: leased on the master with the consumer's
        # credential (datanode/leasing.py)
        R("POST", "/v1/groups/{group}/queues/{queue}/lease", lease.lease, None,
          rule("consumer", "path"), hot=True,
          responses={200: lease.ANSWER, **ERRORS})),
    *section(
        "replication",
        R("PUT", "/v1/replicate/{blob_id}", replicate.replicate_blob, PutResult, PAYLOAD,
          hot=True, options={"openapi_extra": RAW_BODY}),
        R("POST", "/v1/replicate:batch-put", replicate.replicate_batch, BatchPutResult,
          PAYLOAD, hot=True, options={"openapi_extra": RAW_BODY})),
    *section(
        "health",
        R("GET", "/healthz", health.healthz, None, PUBLIC, responses={}),
        R("GET", "/readyz", health.readyz, None, PUBLIC,
          responses={503: {"description": "The store is not open"}}),
        R("GET", "/metrics", health.metrics, None, MONITOR_READ, responses={},
          options={"response_class": Response})),
    # the SQS-compatible endpoint: AWS JSON 1.0, SigV4 checked by the route (datanode/sqs/);
    # also at a queue URL's path, where some clients post (last: every route above wins)
    *section(
        "sqs",
        R("POST", "/", sqs.endpoint, None, SIGV4,
          responses={200: {"description": "the action's answer (AWS JSON 1.0)"}},
          options={"openapi_extra": sqs.BODY}),
        R("POST", "/{group}/{queue}", sqs.endpoint_at_queue, None, SIGV4,
          responses={200: {"description": "the action's answer (AWS JSON 1.0)"}},
          options={"openapi_extra": sqs.BODY})),
    # served by the framework: the API description, its page and assets
    R("GET", "/openapi.json", None, None, PUBLIC),
    R("GET", "/docs", None, None, PUBLIC),
    R("GET", "/static/{path:path}", None, None, PUBLIC),
], responses=ERRORS)
