"""The data node's fast paths: the node-to-node client (keep-alive, chunked and streamed
bodies, early error answers), the stdlib blob reader of common/wire/payload.py, batch-gets with
one token per blob, preallocation of the data file, and CRC32C of writable buffers."""

from __future__ import annotations

import asyncio
import os
import random
import re
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import Any

import google_crc32c
import httpx
import pytest

from squall.common.checksum import crc32c
from squall.common.errors import Forbidden, NotFound, Unauthorized
from squall.common.transport.adapters import SyncTransport
from squall.common.wire import payload
from squall.datanode.replication.peers import Peers, PeerUnreachable
from squall.datanode.store.blobstore import BlobStore
from tests import blobhttp
from tests.dn_kit import both_dispatch_nodes, tok
from tests.helpers import ADMIN, DataNodeProcess, free_port

nodes = both_dispatch_nodes("dnfast")


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120) as c:
        yield c


def test_crc32c_of_any_buffer() -> None:
    rng = random.Random(3)
    for n in (0, 1, 7, 4096, 1 << 20):
        data = rng.randbytes(n)
        want = google_crc32c.value(data)
        ba = bytearray(data)
        assert crc32c(data) == crc32c(ba) == crc32c(memoryview(ba)) == want
        assert crc32c(memoryview(data)) == want  # read-only: copied, same answer
        if n > 3:
            assert crc32c(memoryview(ba)[3:], 5) == google_crc32c.extend(5, data[3:])


async def _parts(data: bytes, step: int) -> AsyncIterator[memoryview]:
    view = memoryview(data)
    for i in range(0, len(data), step):
        yield view[i:i + step]


async def test_peer_client_streams_reuses_and_hears_errors(nodes: list[DataNodeProcess]
                                                           ) -> None:
    url = nodes[1].url
    peers = Peers(timeout=30)
    try:
        data = os.urandom(3 << 20)
        for i, length in enumerate((None, len(data))):  # chunked, then with a length
            blob = f"peer-{i}"
            headers = {"Authorization": "Bearer " + tok("replicate", blob)}
            if length is not None:
                headers["Content-Length"] = str(length)
            r = await peers.put(f"{url}/v1/replicate/{blob}", _parts(data, 300_000), headers)
            assert r.status_code == 200, r.text
            assert r.json()["size"] == len(data)
        small = [await peers.put(f"{url}/v1/replicate/peer-s{i}", b"x" * i, {
            "Authorization": "Bearer " + tok("replicate", f"peer-s{i}")}) for i in range(20)]
        assert all(r.status_code == 200 for r in small)
        assert peers.connects < peers.requests  # keep-alive: connections were reused
        # an early error answer (bad token) while a large body is still being sent
        r = await peers.put(f"{url}/v1/replicate/peer-bad", _parts(os.urandom(8 << 20), 1 << 20),
                            {"Authorization": "Bearer " + tok("replicate", "other")})
        assert r.status_code == 403
        with pytest.raises(PeerUnreachable):
            await peers.put(f"http://127.0.0.1:{free_port()}/v1/replicate/x", b"x")
    finally:
        await peers.aclose()


def test_blob_reads_through_the_engine_ranges_and_errors(nodes: list[DataNodeProcess],
                                                        client: httpx.Client) -> None:
    """Blob reads on an httpx client over the engine's transport (the clients' default):
    whole, streamed in parts and by range; error answers; the connection serves on."""
    url = nodes[0].url
    with httpx.Client(transport=SyncTransport(ssl.create_default_context()), timeout=30) as d:
        for size in (0, 1, 1000, (1 << 20) + 5):
            data, blob = os.urandom(size), f"dl-{size}"
            blobhttp.put_blob(client, url, blob, data, tok("write", blob))
            assert blobhttp.get_blob(d, url, blob, tok("read", blob)) == data
            assert b"".join(blobhttp.iter_blob(d, url, blob, tok("read", blob),
                                              chunk_bytes=100_000)) == data
            if size > 10:
                assert blobhttp.get_blob(d, url, blob, tok("read", blob), 3, size - 2) \
                    == data[3:size - 2]
        with pytest.raises(NotFound):
            blobhttp.get_blob(d, url, "dl-none", tok("read", "dl-none"))
        with pytest.raises(Unauthorized):
            blobhttp.get_blob(d, url, "dl-1", "sqt1.forged.token")
        with pytest.raises(Forbidden):
            blobhttp.get_blob(d, url, "dl-1", tok("read", "dl-0"))
        assert blobhttp.get_blob(d, url, "dl-1", tok("read", "dl-1"))  # after errors: fine


def test_batch_get_with_one_token_per_blob(nodes: list[DataNodeProcess],
                                           client: httpx.Client) -> None:
    url = nodes[0].url
    items = [(f"bt-{i}", os.urandom(100 + i)) for i in range(30)]
    ids = [b for b, _ in items]
    blobhttp.put_batch(client, url, items, tok("write", ids))
    got = blobhttp.get_batch(client, url, [*ids, "bt-missing"],
                            [tok("read", b) for b in ids] + [tok("read", "bt-missing")])
    assert [got[b].data for b in ids] == [d for _, d in items]
    assert got["bt-missing"].status == payload.MISSING
    with pytest.raises(Forbidden):  # a token for another blob
        blobhttp.get_batch(client, url, ids[:2], [tok("read", ids[0]), tok("read", ids[0])])
    r = client.post(f"{url}/v1/blobs:batch-get", json={"blob_ids": ids[:2],
                                                       "tokens": [tok("read", ids[0])]},
                    headers=payload.batch_get_headers([tok("read", ids[0])]))
    assert r.status_code == 400


def test_batch_get_with_one_token_for_every_blob(nodes: list[DataNodeProcess],
                                                 client: httpx.Client) -> None:
    """A lease answer's one read token, sent once in the body (it can be too long for a
    header behind a proxy)."""
    url = nodes[0].url
    items = [(f"b1-{i}", os.urandom(50 + i)) for i in range(40)]
    ids = [b for b, _ in items]
    blobhttp.put_batch(client, url, items, tok("write", ids))
    one = tok("read", ids)
    assert payload.batch_get_body(ids, [one] * len(ids)) == {"blob_ids": ids, "token": one}
    got = blobhttp.get_batch(client, url, ids, [one] * len(ids))
    assert [got[b].data for b in ids] == [d for _, d in items]

    def post(body: dict[str, Any]) -> httpx.Response:
        # the bearer: one of the body's tokens (checked before the body is read)
        head = payload.batch_get_headers([body["token"]]) if "token" in body else {}
        return client.post(f"{url}/v1/blobs:batch-get", json=body, headers=head)

    r = post({"blob_ids": [*ids[:3], "b1-other"], "token": tok("read", ids[:3])})
    assert r.status_code == 403 and "does not cover" in r.json()["error"]["message"]
    r = post({"blob_ids": ids[:2], "token": one, "tokens": [one, one]})
    assert r.status_code == 400 and "not both" in r.json()["error"]["message"]
    r = post({"blob_ids": ids[:2], "token": "sqt1.forged.token"})
    assert r.status_code == 401
    r = post({"blob_ids": ids[:2]})  # no credential at all
    assert r.status_code == 401


def test_batch_get_answers_whole_or_group_by_group(nodes: list[DataNodeProcess],
                                                   client: httpx.Client) -> None:
    """A batch-get (either dispatch path): one read group is one answer with its Content-Length;
    more than one read group (over 8 MiB of blobs) is streamed chunked, group by group, the
    frames in request order either way; bad bodies get 400 naming the field, the route is
    counted under its template, and a forged token is refused before anything is read."""
    url = nodes[0].url
    big = [(f"bg-big-{i}", os.urandom((1 << 20) + i)) for i in range(10)]
    small = [(f"bg-small-{i}", os.urandom(10 + i)) for i in range(3)]
    blobhttp.put_batch(client, url, big, tok("write", [b for b, _ in big]))
    blobhttp.put_batch(client, url, small, tok("write", [b for b, _ in small]))

    def get(ids: list[str]) -> httpx.Response:
        t = tok("read", ids)
        r = client.post(f"{url}/v1/blobs:batch-get", json={"blob_ids": ids, "token": t},
                        headers=payload.batch_get_headers([t]))
        assert r.status_code == 200, r.text
        return r

    want = dict(big + small)
    one = get([b for b, _ in small] + ["bg-missing"])
    assert int(one.headers["content-length"]) == len(one.content)
    frames = list(payload.decode_frames(one.content))
    assert [f.blob_id for f in frames] == [b for b, _ in small] + ["bg-missing"]
    assert [f.data for f in frames[:3]] == [d for _, d in small]
    assert frames[3].status == payload.MISSING
    ids = [small[0][0], *(b for b, _ in big), small[1][0]]
    many = get(ids)
    assert "content-length" not in many.headers
    assert many.headers["transfer-encoding"] == "chunked"
    frames = list(payload.decode_frames(many.content))
    assert [f.blob_id for f in frames] == ids
    assert all(f.status == payload.OK and f.data == want[f.blob_id] for f in frames)
    for body, field in (({"blob_ids": []}, "blob_ids"), ({"blob_ids": ["bad id!"]}, "blob_ids"),
                        ({"blob_ids": "x"}, "blob_ids"), ({"ids": ["a"]}, "blob_ids")):
        r = client.post(f"{url}/v1/blobs:batch-get", json=body,
                        headers={"Authorization": "Bearer " + tok("read", "a")})
        assert r.status_code == 400, (body, r.text)
        assert field in r.json()["error"]["message"], r.text
    r = client.post(f"{url}/v1/blobs:batch-get", json={"blob_ids": ["a"]},
                    headers={"Authorization": "Bearer sqt1.forged.token"})
    assert r.status_code == 401
    metrics = client.get(f"{url}/metrics", headers=ADMIN).text
    assert re.search(r'^squall_datanode_http_requests_total\{method="POST",'
                     r'route="/v1/blobs:batch-get",status="2xx"\} [1-9]', metrics, re.M)


async def test_data_file_is_preallocated_and_counted_free(tmp_path) -> None:  # type: ignore[no-untyped-def]
    s = BlobStore(str(tmp_path / "blobs"), map_size=256 << 20, map_size_max=1 << 30)
    try:
        free0 = s.space().free_bytes
        await s.put("a", os.urandom(3 << 20))
        st = os.stat(os.path.join(s.env.path, "data.mdb"))
        if s.env.tail.preallocs == 0:
            pytest.skip("no room to preallocate on this filesystem")
        assert st.st_size > s.env.extent_bytes() + (3 << 20)  # room beyond LMDB's pages
        assert s.env.file_bytes() <= s.env.extent_bytes()
        free1 = s.space().free_bytes  # the preallocated tail is free space, not used
        assert free0 - free1 < 8 << 20
        for i in range(20):
            await s.put(f"b{i}", os.urandom(1 << 20))
        assert len(await asyncio.gather(*(s.run(s.stat, f"b{i}") for i in range(20)))) == 20
        meta = s.stat("b7")
        assert meta is not None
        assert len(b"".join([p async for p in s.stream(meta)])) == 1 << 20
    finally:
        s.close()
