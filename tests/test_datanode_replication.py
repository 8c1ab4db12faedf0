"""The replication pipeline and corrupt replicas, on real data node processes."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import httpx
import pytest

from squall.common.checksum import crc32c
from squall.common.errors import DataCorrupt, NotFound, TransportError, Unavailable
from squall.common.security import tokens
from squall.common.wire import payload
from tests import blobhttp
from tests.dn_kit import (
    KEY,
    auth,
    data_file,
    flip_bytes_in_file,
    node_id_of,
    node_processes,
    tok,
)
from tests.helpers import ADMIN, DataNodeProcess, free_port, wait_for


@pytest.fixture(scope="module")
def nodes(tmp_path_factory) -> Iterator[list[DataNodeProcess]]:  # type: ignore[no-untyped-def]
    with node_processes(tmp_path_factory.mktemp("dnr"), 3) as ps:
        yield ps


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=60) as c:
        yield c


@pytest.mark.parametrize("n", [2, 3])
def test_replicated_write_lists_every_replica_with_a_receipt(
        nodes: list[DataNodeProcess], client: httpx.Client, n: int) -> None:
    urls = [p.url for p in nodes[:n]]
    blob = f"rep-{n}"
    data = os.urandom((2 << 20) + 333)  # several chunks, streamed through the pipeline
    res = blobhttp.put_blob(client, urls[0], blob, data, tok("write", blob, urls),
                           replicas=urls[1:])
    assert res.errors == []
    assert res.stored[0].address == urls[0]
    assert sorted(s.address for s in res.stored) == sorted(urls)
    for s in res.stored:
        r = tokens.verify_receipt(KEY, s.receipt, blob, len(data), crc32c(data), s.node_id)
        assert r.node_id == node_id_of(s.address)
    for url in urls:
        assert blobhttp.get_blob(client, url, blob, tok("read", blob)) == data
    for p in nodes[n:]:
        with pytest.raises(NotFound):
            blobhttp.get_blob(client, p.url, blob, tok("read", blob))


def test_quorum_not_met_when_a_peer_is_down(nodes: list[DataNodeProcess],
                                            client: httpx.Client) -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    urls = [nodes[0].url, nodes[1].url, dead]
    with pytest.raises(Unavailable) as ei:
        blobhttp.put_blob(client, urls[0], "q-1", os.urandom(50_000),
                         tok("write", "q-1", urls), replicas=urls[1:])
    err = ei.value
    assert "write quorum not met" in err.message and dead in err.message
    assert "2 of 3" in err.message
    assert [e["address"] for e in err.details["errors"]] == [dead]
    assert sorted(s["address"] for s in err.details["stored"]) == sorted(urls[:2])
    # with a quorum of 2 the same write succeeds, and still reports the dead peer
    res = blobhttp.put_blob(client, urls[0], "q-2", b"x" * 1000, tok("write", "q-2", urls),
                           replicas=urls[1:], quorum=2)
    assert len(res.stored) == 2 and [e.address for e in res.errors] == [dead]
    assert res.errors[0].code == "transport"
    # batch form: the same rule
    r = client.post(f"{urls[0]}/v1/blobs:batch-put",
                    content=payload.encode_frames([("q-3", b"a"), ("q-4", b"b")]),
                    params={"replicas": ",".join(urls[1:])},
                    headers=auth("write", ["q-3", "q-4"], urls))
    assert r.status_code == 503 and dead in r.json()["error"]["message"]


def test_peer_refusal_is_reported_not_swallowed(nodes: list[DataNodeProcess],
                                                client: httpx.Client) -> None:
    urls = [p.url for p in nodes]
    # node 2 already holds other bytes under this id: it refuses the copy (409)
    blobhttp.put_blob(client, urls[2], "clash", b"other", tok("write", "clash"))
    with pytest.raises(Unavailable) as ei:
        blobhttp.put_blob(client, urls[0], "clash", b"mine", tok("write", "clash", urls),
                         replicas=urls[1:])
    (e,) = ei.value.details["errors"]
    assert e["address"] == urls[2] and e["status"] == 409 and e["code"] == "conflict"


def test_corrupt_byte_in_the_lmdb_file_fails_reads_loudly(
        nodes: list[DataNodeProcess], client: httpx.Client) -> None:
    urls = [nodes[0].url, nodes[1].url]
    blobs = {b: os.urandom((2 << 20) + 500_000) for b in ("flip-first", "flip-mid")}
    for blob, data in blobs.items():  # chunks 0, 1, 2 on both nodes
        blobhttp.put_blob(client, urls[0], blob, data, tok("write", blob, urls),
                         replicas=urls[1:])
    mdb = data_file(nodes[1].data_dir)
    # chunk 0 damaged: a clean 500 data_corrupt answer before any byte is sent
    assert flip_bytes_in_file(mdb, blobs["flip-first"][1000:1064]) == 1
    with pytest.raises(DataCorrupt, match="CRC32C"):
        blobhttp.get_blob(client, urls[1], "flip-first", tok("read", "flip-first"))
    # chunk 2 damaged: right bytes until then, then the node cuts the connection
    data = blobs["flip-mid"]
    assert flip_bytes_in_file(mdb, data[(2 << 20) + 1000:(2 << 20) + 1064], 5) == 1
    got = bytearray()
    with pytest.raises(TransportError):
        for part in blobhttp.iter_blob(client, urls[1], "flip-mid", tok("read", "flip-mid")):
            got += part
    assert bytes(got) == data[:len(got)] and len(got) < len(data)
    # both bad replicas were dropped; the good copies on node 0 still read back whole
    for blob, data in blobs.items():
        with pytest.raises(NotFound):
            blobhttp.get_blob(client, urls[1], blob, tok("read", blob))
        assert blobhttp.get_blob(client, urls[0], blob, tok("read", blob)) == data
    metrics = client.get(urls[1] + "/metrics", headers=ADMIN).text
    assert "squall_datanode_corrupt_replicas_total 2.0" in metrics


def test_an_upload_cut_mid_body_is_stored_nowhere(nodes: list[DataNodeProcess],
                                                  client: httpx.Client) -> None:
    urls = [p.url for p in nodes]
    blob = "cut-upload"
    host, port = urls[0].removeprefix("http://").split(":")
    token = tok("write", blob, urls)
    head = (f"PUT /v1/blobs/{blob}?replicas={','.join(urls[1:])} HTTP/1.1\r\n"
            f"Host: {host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Length: {20 << 20}\r\n\r\n").encode()
    uploads = "squall_datanode_uploads_in_progress"
    with socket.create_connection((host, int(port))) as s:
        s.sendall(head)
        for _ in range(12):  # 12 of the 20 MiB promised, then the client is gone
            s.sendall(os.urandom(1 << 20))
        # the pipeline is streaming: an upload is open on every node of the replica set
        wait_for(lambda: all(_metric(client, u, uploads) == 1 for u in urls),
                 what="uploads open on all three nodes")
    wait_for(lambda: all(_metric(client, u, uploads) == 0 for u in urls),
             what="uploads aborted on all three nodes")
    assert all(_absent(client, u, blob) for u in urls)
    # every node is still fine, and the same blob id can be written afterwards
    data = os.urandom(3 << 20)
    res = blobhttp.put_blob(client, urls[0], blob, data, token, replicas=urls[1:])
    assert len(res.stored) == 3
    for u in urls:
        assert blobhttp.get_blob(client, u, blob, tok("read", blob)) == data


def _absent(client: httpx.Client, url: str, blob: str) -> bool:
    return client.head(f"{url}/v1/blobs/{blob}", headers=auth("read", blob)).status_code == 404


def _metric(client: httpx.Client, url: str, name: str) -> float:
    for line in client.get(url + "/metrics", headers=ADMIN).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return -1.0
