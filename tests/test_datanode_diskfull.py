"""A data node on a tiny filesystem fills up: clean 507s, no acknowledged loss, recovery
after deletes and after kill -9. Needs root for a tmpfs mount (skipped otherwise)."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator

import httpx
import pytest

from squall.common.errors import InsufficientStorage
from tests import blobhttp
from tests.dn_kit import ENV, auth, chunks, tok
from tests.helpers import DataNodeProcess

MIB = 1 << 20


@pytest.fixture
def tiny_fs(tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    d = tmp_path / "tiny"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(d)],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a 16 MiB tmpfs (needs root): {r.stderr.strip()}")
    try:
        yield str(d)
    finally:
        subprocess.run(["umount", "-l", str(d)], check=False)


def _put_streamed(client: httpx.Client, url: str, blob: str, data: bytes) -> httpx.Response:
    """A chunked upload: no Content-Length, so the node cannot refuse it up front and has to
    meet the full disk while writing."""
    return client.put(f"{url}/v1/blobs/{blob}", content=iter([data[:MIB // 2], data[MIB // 2:]]),
                      headers=auth("write", blob))


def test_full_disk_gives_507_and_loses_nothing_acknowledged(tiny_fs: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = DataNodeProcess(os.path.join(tiny_fs, "dn"), env=ENV,
                           extra=["--scrub-bytes-per-s", "0"])
    node.log_path = str(tmp_path / "datanode.log")  # not on the tiny filesystem
    node.start()
    acked: dict[str, str] = {}
    try:
        with httpx.Client(timeout=60) as c:
            refusals = []
            for i in range(40):
                blob, data = f"fill-{i}", os.urandom(MIB)
                r = _put_streamed(c, node.url, blob, data)
                if r.status_code == 200:
                    acked[blob] = hashlib.sha256(data).hexdigest()
                    continue
                assert r.status_code == 507, r.text
                err = r.json()["error"]
                assert err["code"] == "insufficient_storage" and "disk full" in err["message"]
                refusals.append(blob)
                if len(refusals) == 3:
                    break
            assert 5 <= len(acked) < 16 and len(refusals) == 3
            # a declared length that cannot fit is refused before any byte is stored
            # ... and the answer names the node and the reserve
            with pytest.raises(InsufficientStorage, match=rf"data node dn-\S+ \({node.url}\) "
                               r"is full: .* does not fit with its \d+-byte reserve"):
                blobhttp.put_blob(c, node.url, "too-big", chunks(8 * MIB), tok("write", "too-big"),
                                 size=8 * MIB)
            assert c.get(node.url + "/readyz").status_code == 200
            _check(c, node.url, acked)
            for blob in refusals:  # nothing half-written became a blob
                assert c.head(f"{node.url}/v1/blobs/{blob}",
                              headers=auth("read", blob)).status_code == 404
            # deleting makes room again inside the same file
            for blob in list(acked)[:4]:
                assert blobhttp.delete_blob(c, node.url, blob, tok("delete", blob))
                del acked[blob]
            for i in range(2):
                blob, data = f"after-{i}", os.urandom(MIB)
                assert _put_streamed(c, node.url, blob, data).status_code == 200
                acked[blob] = hashlib.sha256(data).hexdigest()
            _check(c, node.url, acked)
        node.kill9()
        log_path = node.log_path
        node = DataNodeProcess(node.data_dir, env=ENV, port=node.port,
                               extra=["--scrub-bytes-per-s", "0"])
        node.log_path = log_path
        node.start()
        with httpx.Client(timeout=60) as c:
            _check(c, node.url, acked)
    finally:
        node.stop()


def _check(c: httpx.Client, url: str, acked: dict[str, str]) -> None:
    for blob, digest in acked.items():
        got = blobhttp.get_blob(c, url, blob, tok("read", blob))
        assert hashlib.sha256(got).hexdigest() == digest, blob


def test_map_bound_gives_507(tmp_path) -> None:  # type: ignore[no-untyped-def]
    node = DataNodeProcess(str(tmp_path / "dn"), env=ENV,
                           extra=["--scrub-bytes-per-s", "0", "--map-size-max",
                                  str(8 * MIB)]).start()
    try:
        with httpx.Client(timeout=60) as c:
            r = c.put(f"{node.url}/v1/blobs/big", content=chunks(12 * MIB),
                      headers=auth("write", "big"))
            assert r.status_code == 507 and "bound" in r.json()["error"]["message"]
            assert blobhttp.put_blob(c, node.url, "small", b"fits", tok("write", "small")).size
            assert blobhttp.get_blob(c, node.url, "small", tok("read", "small")) == b"fits"
            assert c.head(f"{node.url}/v1/blobs/big", headers=auth("read", "big")).status_code \
                == 404
    finally:
        node.stop()
