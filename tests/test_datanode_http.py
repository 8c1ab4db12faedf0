"""A data node over HTTP (real processes on 127.0.0.1): payload sizes from 0 B to 256 MiB,
Range, HEAD, DELETE, batches, checksums and tokens."""

from __future__ import annotations

import hashlib
import os
import random
import re
import time
from collections.abc import Iterator

import httpx
import pytest

from squall.common.checksum import CRC_HEADER, Crc32c, crc32c
from squall.common.errors import BadRequest, NotFound
from squall.common.security import tokens
from squall.common.wire import payload
from tests import blobhttp
from tests.dn_kit import KEY, auth, both_dispatch_nodes, chunks, tok
from tests.helpers import ADMIN, DataNodeProcess
from tests.test_datanode_tokens import mutations

nodes = both_dispatch_nodes("dn")


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120) as c:
        yield c


@pytest.mark.parametrize("size", [0, 1, 1 << 20])
def test_put_get_small_sizes(nodes: list[DataNodeProcess], client: httpx.Client,
                             size: int) -> None:
    url, blob = nodes[0].url, f"size-{size}"
    data = os.urandom(size)
    res = blobhttp.put_blob(client, url, blob, data, tok("write", blob))
    assert (res.size, res.crc32c, res.errors) == (size, crc32c(data), [])
    assert [s.address for s in res.stored] == [url]
    tokens.verify_receipt(KEY, res.stored[0].receipt, blob, size, crc32c(data))
    assert blobhttp.get_blob(client, url, blob, tok("read", blob)) == data
    h = client.head(f"{url}/v1/blobs/{blob}", headers=auth("read", blob))
    assert h.status_code == 200 and h.content == b""
    assert (h.headers["content-length"], h.headers[CRC_HEADER]) == (str(size), str(crc32c(data)))


def test_256_mib_streamed_through_the_pipeline(nodes: list[DataNodeProcess],
                                               client: httpx.Client) -> None:
    """256 MiB streamed from a generator to node 0, which forwards it to node 1 while it
    stores it; both copies read back byte-identical (compared by SHA-256)."""
    size, blob = 256 << 20, "big-256"
    urls = [n.url for n in nodes]
    sent = hashlib.sha256()
    crc = Crc32c()

    def body() -> Iterator[bytes]:
        for part in chunks(size):
            sent.update(part)
            crc.update(part)
            yield part

    res = blobhttp.put_blob(client, urls[0], blob, body(), tok("write", blob, urls),
                           replicas=urls[1:], size=size)
    assert res.size == size and res.crc32c == crc.value
    assert sorted(s.address for s in res.stored) == sorted(urls)
    for url in urls:
        got = hashlib.sha256()
        n = 0
        for part in blobhttp.iter_blob(client, url, blob, tok("read", blob)):
            got.update(part)
            n += len(part)
        assert n == size and got.digest() == sent.digest()
    for url in urls:  # do not keep 512 MiB around for the other tests
        assert blobhttp.delete_blob(client, url, blob, tok("delete", blob))


def test_range_reads(nodes: list[DataNodeProcess], client: httpx.Client) -> None:
    url, blob = nodes[0].url, "ranged"
    data = random.Random(1).randbytes((3 << 20) + 12345)  # several 1 MiB chunks
    blobhttp.put_blob(client, url, blob, data, tok("write", blob))
    read = tok("read", blob)
    n = len(data)
    for start, end in ((0, 1), (5, 10), ((1 << 20) - 3, (1 << 20) + 3), (n - 1, n), (0, n),
                       (2 << 20, n)):
        assert blobhttp.get_blob(client, url, blob, read, start, end) == data[start:end]
    h = {"Authorization": "Bearer " + read}
    r = client.get(f"{url}/v1/blobs/{blob}", headers={**h, "Range": "bytes=100-199"})
    assert r.status_code == 206 and r.content == data[100:200]
    assert r.headers["content-range"] == f"bytes 100-199/{n}"
    r = client.get(f"{url}/v1/blobs/{blob}", headers={**h, "Range": "bytes=-7"})
    assert r.status_code == 206 and r.content == data[-7:]
    r = client.get(f"{url}/v1/blobs/{blob}", headers={**h, "Range": f"bytes={n}-"})
    assert r.status_code == 416 and r.headers["content-range"] == f"bytes */{n}"
    assert r.json()["error"]["code"] == "range_not_satisfiable"
    r = client.get(f"{url}/v1/blobs/{blob}", headers={**h, "Range": "bytes=0-1,5-6"})
    assert r.status_code == 200 and len(r.content) == n  # several ranges: the whole blob


def test_batch_put_and_get(nodes: list[DataNodeProcess], client: httpx.Client) -> None:
    urls = [n.url for n in nodes]
    items = [(f"batch-{i}", os.urandom(random.Random(i).randrange(0, 3000))) for i in range(200)]
    ids = [b for b, _ in items]
    res = blobhttp.put_batch(client, urls[0], items, tok("write", ids, urls), replicas=urls[1:])
    assert [b.blob_id for b in res.blobs] == ids
    for b, (_, data) in zip(res.blobs, items, strict=True):
        assert b.crc32c == crc32c(data) and len(b.stored) == 2
        for s in b.stored:
            tokens.verify_receipt(KEY, s.receipt, b.blob_id, len(data), crc32c(data))
    for url in urls:
        got = blobhttp.get_batch(client, url, [*ids, "batch-missing"],
                                tok("read", [*ids, "batch-missing"]))
        assert all(got[b].data == d and got[b].status == payload.OK for b, d in items)
        assert got["batch-missing"].status == payload.MISSING
    # a batch is all or nothing: one bad checksum stores none of it
    frames = payload.encode_frames([("batch-new-1", b"fine")])
    frames += payload.encode_frame("batch-new-2", b"data", crc=crc32c(b"other"))
    r = client.post(f"{urls[0]}/v1/blobs:batch-put", content=frames,
                    headers=auth("write", ["batch-new-1", "batch-new-2"]))
    assert r.status_code == 400 and "batch-new-2" in r.json()["error"]["message"]
    with pytest.raises(NotFound):
        blobhttp.get_blob(client, urls[0], "batch-new-1", tok("read", "batch-new-1"))
    # the token must cover every blob of the batch
    r = client.post(f"{urls[0]}/v1/blobs:batch-put", content=frames,
                    headers=auth("write", ["batch-new-1"]))
    assert r.status_code == 403 and "batch-new-2" in r.text
    r = client.post(f"{urls[0]}/v1/blobs:batch-put", content=b"\x00\x05ab",
                    headers=auth("write", ["ab"]))
    assert r.status_code == 400


def test_declared_checksum_mismatch_is_refused(nodes: list[DataNodeProcess],
                                               client: httpx.Client) -> None:
    url = nodes[0].url
    with pytest.raises(BadRequest, match="declared"):
        blobhttp.put_blob(client, url, "crc-bad", b"hello", tok("write", "crc-bad"),
                         crc=crc32c(b"hellp"))
    r = client.head(f"{url}/v1/blobs/crc-bad", headers=auth("read", "crc-bad"))
    assert r.status_code == 404


def test_delete_and_conflict(nodes: list[DataNodeProcess], client: httpx.Client) -> None:
    url = nodes[0].url
    blobhttp.put_blob(client, url, "del-1", b"abc", tok("write", "del-1"))
    again = blobhttp.put_blob(client, url, "del-1", b"abc", tok("write", "del-1"))
    assert again.size == 3  # the same bytes again: idempotent
    r = client.put(f"{url}/v1/blobs/del-1", content=b"abd", headers=auth("write", "del-1"))
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"
    assert blobhttp.delete_blob(client, url, "del-1", tok("delete", "del-1")) is True
    assert blobhttp.delete_blob(client, url, "del-1", tok("delete", "del-1")) is False
    with pytest.raises(NotFound):
        blobhttp.get_blob(client, url, "del-1", tok("read", "del-1"))


def test_bad_tokens_are_refused(nodes: list[DataNodeProcess], client: httpx.Client) -> None:
    url, blob = nodes[0].url, "guarded"
    blobhttp.put_blob(client, url, blob, b"secret", tok("write", blob))
    good = tok("read", blob)
    get = f"{url}/v1/blobs/{blob}"
    assert client.get(get, headers={"Authorization": "Bearer " + good}).content == b"secret"
    muts = sorted(m for m in mutations(good, random.Random(7), 60) if m and m == m.strip())
    assert len(muts) > 150
    for m in muts:
        r = client.get(get, headers={"Authorization": "Bearer " + m})
        assert r.status_code == 401, (m, r.text)
        assert r.json()["error"]["code"] == "unauthorized"
    cases = [
        ({}, 401), ({"Authorization": "Basic " + good}, 401),
        ({"Authorization": "Bearer " + tokens.sign(KEY, "read", [blob], time.time() - 1)}, 401),
        ({"Authorization": "Bearer " + tokens.sign(b"x" * 32, "read", [blob],
                                                   time.time() + 60)}, 401),
        (auth("write", blob), 403), (auth("delete", blob), 403), (auth("replicate", blob), 403),
        (auth("read", "other-blob"), 403),
    ]
    for headers, status in cases:
        r = client.get(get, headers=headers)
        assert r.status_code == status, (headers, r.text)
    # writes, deletes and node-to-node copies need their own op
    for method, path, op in (("PUT", f"/v1/blobs/{blob}-2", "read"),
                             ("PUT", f"/v1/blobs/{blob}-2", "replicate"),
                             ("DELETE", f"/v1/blobs/{blob}", "read"),
                             ("DELETE", f"/v1/blobs/{blob}", "write"),
                             ("PUT", f"/v1/replicate/{blob}-2", "write")):
        ids = [f"{blob}-2", blob]
        r = client.request(method, url + path, content=b"x" if method == "PUT" else None,
                           headers=auth(op, ids))
        assert r.status_code == 403, (method, path, op, r.text)
        r = client.request(method, url + path, content=b"x" if method == "PUT" else None)
        assert r.status_code == 401
    # forwarding only to the replica set the token names
    r = client.put(f"{url}/v1/blobs/{blob}-3", content=b"x",
                   params={"replicas": "http://127.0.0.1:9"},
                   headers=auth("write", f"{blob}-3", [nodes[1].url]))
    assert r.status_code == 403 and "forwarding" in r.text
    assert blobhttp.get_blob(client, url, blob, good) == b"secret"


def test_health_metrics_and_openapi(nodes: list[DataNodeProcess], client: httpx.Client) -> None:
    url = nodes[0].url
    assert client.get(url + "/healthz").json() == {"ok": True}
    ready = client.get(url + "/readyz").json()
    assert ready["ok"] and ready["address"] == url and ready["node_id"].startswith("dn-")
    text = client.get(url + "/metrics", headers=ADMIN).text
    assert "squall_datanode_blobs" in text and "squall_datanode_syncs_total" in text
    for name in ("squall_datanode_scrubbed_blobs_total", "squall_datanode_scrub_corrupt_total",
                 "squall_datanode_build_info", "process_cpu_seconds_total", "python_info"):
        assert name in text, name
    # reads and writes by route template (the fast path's routes included), with latency
    assert re.search(r'^squall_datanode_http_request_duration_seconds_count\{method="PUT",'
                     r'route="/v1/blobs/\{blob_id\}"\} [1-9]', text, re.M), text
    assert re.search(r'^squall_datanode_http_requests_total\{method="GET",'
                     r'route="/v1/blobs/\{blob_id\}",status="2xx"\} [1-9]', text, re.M)
    docs = client.get(url + "/docs")
    assert docs.status_code == 200 and "/static/swagger-ui/swagger-ui-bundle.js" in docs.text
    paths = client.get(url + "/openapi.json").json()["paths"]
    for p in ("/v1/blobs/{blob_id}", "/v1/blobs:batch-put", "/v1/blobs:batch-get",
              "/v1/replicate/{blob_id}", "/v1/replicate:batch-put"):
        assert p in paths
    r = client.put(url + "/v1/blobs/bad%20id", content=b"x", headers=auth("write", "bad id"))
    assert r.status_code == 400
    r = client.post(url + "/v1/blobs:batch-get", content=b"{",
                    headers={**auth("read", "a"), "Content-Type": "application/json"})
    assert r.status_code == 400
