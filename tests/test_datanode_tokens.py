"""Tokens, receipts, checksums, the batch frame codec and Range parsing (pure functions)."""

from __future__ import annotations

import base64
import random

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from squall.common.checksum import Crc32c, crc32c, crc32c_combine, crc_of, parse_crc
from squall.common.errors import BadRequest, DataCorrupt, Forbidden, Unauthorized
from squall.common.security import tokens
from squall.common.wire import payload
from squall.datanode.http.routes.blobs import parse_range

KEY = b"test-cluster-key-0123456789abcdef"
NOW = 1_800_000_000.0


def mutations(tok: str, rng: random.Random, n: int = 300) -> set[str]:
    """Many corruptions of a token: every single-character flip near the edges and a random
    sample elsewhere, truncations, extensions, swapped and dropped parts."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.="
    out: set[str] = set()
    positions = list(range(min(12, len(tok)))) + list(range(max(0, len(tok) - 12), len(tok)))
    positions += rng.sample(range(len(tok)), min(n, len(tok)))
    for i in positions:
        for c in rng.sample(alphabet, 3):
            if c != tok[i]:
                out.add(tok[:i] + c + tok[i + 1:])
    for k in (1, 2, 5, 20, len(tok) // 2, len(tok) - 1):
        out.add(tok[:-k])
        out.add(tok[k:])
    prefix, claims, mac = tok[:5], *tok[5:].split(".")
    out |= {tok + "A", tok + ".", tok + "." + mac, prefix + mac + "." + claims, prefix + claims,
            prefix + claims + ".", "." + mac, "", " " + tok, tok.upper(), tok.lower(),
            "sqr1." + tok[5:], "sqt2." + tok[5:]}
    out.discard(tok)
    return out


def test_sign_verify_roundtrip() -> None:
    tok = tokens.sign(KEY, "write", ["a", "b"], NOW + 60, replicas=["http://n2/", "http://n3"])
    c = tokens.verify(KEY, tok, "write", "a", NOW)
    assert c.op == "write" and c.covers("b") and not c.covers("c")
    assert c.replicas == ("http://n2", "http://n3")
    assert tokens.verify(KEY, tok, "write", ["a", "b"], NOW).expires_at == NOW + 60
    assert tokens.check_replicas(c, ["http://n3/"]) == ["http://n3"]
    with pytest.raises(Forbidden, match="forwarding"):
        tokens.check_replicas(c, ["http://evil:1"])


def test_many_mutations_of_a_valid_token_are_refused() -> None:
    rng = random.Random(4)
    tok = tokens.sign(KEY, "read", ["blob-1"], NOW + 60)
    muts = mutations(tok, rng)
    assert len(muts) > 300
    for m in muts:
        with pytest.raises(Unauthorized):
            tokens.verify(KEY, m, "read", "blob-1", NOW)


def test_tampered_claims_with_the_old_mac_are_forged() -> None:
    tok = tokens.sign(KEY, "read", ["blob-1"], NOW + 60)
    _, mac = tok[5:].split(".")
    for claims in ({"op": "write", "b": ["blob-1"], "exp": NOW + 60},
                   {"op": "read", "b": ["blob-1", "blob-2"], "exp": NOW + 60},
                   {"op": "read", "b": ["blob-1"], "exp": NOW + 1e6},
                   {"op": "read", "b": [], "p": "blob", "exp": NOW + 60}):
        raw = base64.urlsafe_b64encode(orjson.dumps(claims)).rstrip(b"=").decode()
        with pytest.raises(Unauthorized, match="signature"):
            tokens.verify(KEY, f"sqt1.{raw}.{mac}", "read", "blob-1", NOW)


def test_expired_wrong_key_wrong_op_wrong_blob() -> None:
    tok = tokens.sign(KEY, "read", ["blob-1"], NOW + 60)
    with pytest.raises(Unauthorized, match="expired"):
        tokens.verify(KEY, tok, "read", "blob-1", NOW + 60)
    with pytest.raises(Unauthorized, match="signature"):
        tokens.verify(b"another-cluster-key-0123456789ab", tok, "read", "blob-1", NOW)
    for op in ("write", "delete", "replicate", "heartbeat"):
        with pytest.raises(Forbidden, match="not"):
            tokens.verify(KEY, tok, op, "blob-1", NOW)
    with pytest.raises(Forbidden, match="blob-2"):
        tokens.verify(KEY, tok, "read", "blob-2", NOW)
    with pytest.raises(Forbidden):
        tokens.verify(KEY, tok, "read", ["blob-1", "blob-2"], NOW)
    for missing in (None, "", 42):
        with pytest.raises(Unauthorized):
            tokens.verify(KEY, missing, "read", "blob-1", NOW)


def test_prefix_scope_and_bearer_header() -> None:
    tok = tokens.sign(KEY, "write", [], NOW + 5, prefix="batch7-", count=3)
    assert tokens.verify(KEY, tok, "write", ["batch7-0", "batch7-1", "batch7-2"], NOW)
    # exactly the allocated ids: no extra blob under a write token
    for other in ("batch8-1", "batch7-3", "batch7-01", "batch7-", "batch7-1x", "batch7-99"):
        with pytest.raises(Forbidden):
            tokens.verify(KEY, tok, "write", other, NOW)
    with pytest.raises(ValueError):
        tokens.sign(KEY, "write", [], NOW, prefix="")
    with pytest.raises(ValueError):
        tokens.sign(KEY, "write", [], NOW, prefix="p-")  # a prefix needs its count
    with pytest.raises(ValueError):
        tokens.sign(KEY, "admin", [], NOW)
    assert tokens.bearer("Bearer abc") == "abc"
    assert tokens.bearer("bearer  abc ") == "abc"
    for bad in (None, "", "Basic abc", "Bearer", "Bearer  "):
        with pytest.raises(Unauthorized):
            tokens.bearer(bad)


def test_receipts() -> None:
    r = tokens.sign_receipt(KEY, "dn-1", "blob-1", 123, 456, NOW)
    got = tokens.verify_receipt(KEY, r, "blob-1", 123, 456, "dn-1")
    assert (got.node_id, got.size, got.crc32c, got.issued_at) == ("dn-1", 123, 456, NOW)
    for kw in ({"blob_id": "blob-2"}, {"size": 124}, {"crc32c": 457}, {"node_id": "dn-2"}):
        args = {"blob_id": "blob-1", "size": 123, "crc32c": 456, "node_id": "dn-1", **kw}
        with pytest.raises(Unauthorized):
            tokens.verify_receipt(KEY, r, **args)
    for m in mutations(r, random.Random(5), 100):
        with pytest.raises(Unauthorized):
            tokens.verify_receipt(KEY, m, "blob-1")
    # a token is never a receipt and a receipt never a token (domain separation)
    tok = tokens.sign(KEY, "write", ["blob-1"], NOW + 60)
    with pytest.raises(Unauthorized):
        tokens.verify_receipt(KEY, "sqr1." + tok[5:], "blob-1")
    with pytest.raises(Unauthorized):
        tokens.verify(KEY, "sqt1." + r[5:], "write", "blob-1", NOW)


def test_batch_receipts_name_exactly_their_set() -> None:
    blobs = [("b-1", 10, 1), ("b-2", 0, 2), ("b-3", 1024, 3)]
    r = tokens.sign_batch_receipt(KEY, "dn-1", blobs, NOW)
    assert r.startswith(tokens.BATCH_RECEIPT_PREFIX)
    assert tokens.verify_batch_receipt(KEY, r, list(reversed(blobs)), "dn-1") == ("dn-1", NOW)
    assert tokens.verify_batch_receipt(KEY, r, [*blobs, blobs[0]]) == ("dn-1", NOW)  # a set
    for other in (blobs[:2], [*blobs, ("b-4", 1, 4)], [("b-1", 11, 1), *blobs[1:]],
                  [("b-1", 10, 9), *blobs[1:]], [("b-9", 10, 1), *blobs[1:]], []):
        with pytest.raises(Unauthorized, match="covers 3 blob"):
            tokens.verify_batch_receipt(KEY, r, other)
    with pytest.raises(Unauthorized, match="not 'dn-2'"):
        tokens.verify_batch_receipt(KEY, r, blobs, "dn-2")
    with pytest.raises(Unauthorized):
        tokens.verify_batch_receipt(b"another-cluster-key-0123456789ab", r, blobs)
    for m in mutations(r, random.Random(6), 100):
        with pytest.raises(Unauthorized):
            tokens.verify_batch_receipt(KEY, m, blobs)
    # neither a blob receipt nor a token passes as a batch receipt, nor the other way round
    one = tokens.sign_receipt(KEY, "dn-1", "b-1", 10, 1, NOW)
    with pytest.raises(Unauthorized):
        tokens.verify_batch_receipt(KEY, "sqb1." + one[5:], blobs[:1])
    with pytest.raises(Unauthorized):
        tokens.verify_receipt(KEY, "sqr1." + r[5:], "b-1")


def test_load_cluster_key(tmp_path) -> None:  # type: ignore[no-untyped-def]
    f = tmp_path / "key"
    f.write_bytes(b"  " + b"x" * 32 + b"\n")
    assert tokens.load_cluster_key(str(f), {}) == b"x" * 32
    assert tokens.load_cluster_key(None, {"SQUALL_CLUSTER_KEY": "y" * 20}) == b"y" * 20
    assert tokens.load_cluster_key(None, {}) is None  # no built-in key
    with pytest.raises(ValueError, match="at least"):
        tokens.load_cluster_key(None, {"SQUALL_CLUSTER_KEY": "short"})
    # published key material is refused, from a file or a variable
    for published in tokens.PUBLISHED_KEYS:
        f.write_bytes(published + b"\n")
        with pytest.raises(ValueError, match="published"):
            tokens.load_cluster_key(str(f), {})
        with pytest.raises(ValueError, match="published"):
            tokens.load_cluster_key(None, {"SQUALL_CLUSTER_KEY": published.decode()})


def test_checksum_helpers() -> None:
    data = bytes(range(256)) * 1000
    c = Crc32c()
    for i in range(0, len(data), 777):
        c.update(data[i:i + 777])
    assert c.value == crc32c(data) == crc_of([data[:5], data[5:]])[0] and c.size == len(data)
    assert crc32c(b"") == 0 and crc32c(b"123456789") == 0xE3069283  # the CRC32C check value
    assert parse_crc(None) is None and parse_crc("17") == 17
    for bad in ("-1", "x", str(1 << 32), "1.5"):
        with pytest.raises(BadRequest):
            parse_crc(bad)


@given(st.binary(max_size=300), st.binary(max_size=300), st.sampled_from([0, 1, 4096, 1 << 20]))
def test_crc_of_joined_pieces_from_the_pieces_crcs(a: bytes, b: bytes, pad: int) -> None:
    b = b + bytes(pad)  # lengths whose operators the data node caches (a chunk's)
    assert crc32c_combine(crc32c(a), crc32c(b), len(b)) == crc32c(a + b)


def test_frame_codec() -> None:
    items = [("a", b""), ("b", b"x"), ("c" * 128, bytes(range(256)) * 10)]
    body = payload.encode_frames(items)
    assert [(f.blob_id, f.data) for f in payload.decode_frames(body)] == items
    bad = bytearray(body)
    bad[-1] ^= 1
    with pytest.raises(DataCorrupt):
        list(payload.decode_frames(bytes(bad)))
    sizes = [len(payload.encode_frame(b, d)) for b, d in items]
    bounds = [sum(sizes[:i + 1]) for i in range(len(sizes))]
    for cut in range(1, len(body)):
        frames = body[:cut]
        try:
            got = list(payload.decode_frames(frames, verify=False))
        except BadRequest:
            continue
        assert cut in bounds  # a cut parses only at a frame boundary
        assert len(got) == bounds.index(cut) + 1


@pytest.mark.parametrize(("header", "size", "want"), [
    (None, 10, None), ("bytes=0-4", 10, (0, 5)), ("bytes=5-", 10, (5, 10)),
    ("bytes=-3", 10, (7, 10)), ("bytes=-30", 10, (0, 10)), ("bytes=8-100", 10, (8, 10)),
    ("bytes=0-0", 1, (0, 1)), ("bytes=1-2,4-5", 10, None), ("items=0-1", 10, None),
    ("bytes=5-2", 10, None), ("bytes=a-b", 10, None), ("bytes=-", 10, None),
])
def test_parse_range(header: str | None, size: int, want: tuple[int, int] | None) -> None:
    assert parse_range(header, size) == want


@pytest.mark.parametrize(("header", "size"), [
    ("bytes=10-", 10), ("bytes=0-", 0), ("bytes=-0", 10), ("bytes=-5", 0), ("bytes=99-100", 5),
])
def test_parse_range_unsatisfiable(header: str, size: int) -> None:
    with pytest.raises(ValueError):
        parse_range(header, size)


def test_a_token_checked_once_is_remembered_by_key_and_text_and_still_expires(
        monkeypatch: pytest.MonkeyPatch) -> None:
    tok = tokens.sign(KEY, "journal", ["http://m1:7070"], NOW + 60)
    first = tokens.decode(KEY, tok, NOW)
    calls: list[object] = []
    real = tokens._decode

    def counted(key: bytes, token: object, now: float) -> tokens.TokenClaims:
        calls.append(token)
        return real(key, token, now)

    monkeypatch.setattr(tokens, "_decode", counted)
    assert tokens.decode(KEY, tok, NOW + 30) is first and calls == []  # remembered
    with pytest.raises(Unauthorized, match=r"token expired 1\.0s ago"):
        tokens.decode(KEY, tok, NOW + 61)  # remembered claims expire all the same
    other = b"another-cluster-key-0123456789abcdef"
    with pytest.raises(Unauthorized, match="invalid token signature"):
        tokens.decode(other, tok, NOW)  # remembered for KEY only: checked, and refused
    assert calls == [tok]
    with pytest.raises(Unauthorized, match="invalid token signature"):
        tokens.decode(other, tok, NOW)  # a refusal is not remembered as anything
    assert calls == [tok, tok]
    monkeypatch.setattr(tokens, "DECODED_MAX_CHARS", len(tok) + 1)
    tok2 = tokens.sign(KEY, "heartbeat", ["n1"], NOW + 60)
    tokens.decode(KEY, tok2, NOW)  # the memory is full: it starts over
    assert tokens._DECODED.get(KEY, tok) is None and tokens._DECODED.get(KEY, tok2) is not None
