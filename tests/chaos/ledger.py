"""The independent ledger: what squall acknowledged, written by the harness, never by squall.

Every writer (the producers' threads, each worker process, the swarm) appends JSON lines
to its own file, one ``write`` per record, so a SIGKILLed worker leaves every record it
finished. Records (``k`` is the kind):

    put    q pid crc n       an acknowledged enqueue (the client returned)
    put?   q pid crc n err   an enqueue whose outcome is unknown (it raised)
    put-   q pid crc n err   an enqueue refused (a status promising nothing was applied,
                             from a client that does not retry): it must never be delivered
    got    q pid tok crc w   a delivery: a lease handed this payload to a handler
    done   q pid tok         an acknowledged dequeue (``task.done()`` returned)
    done?  q pid tok err     a dequeue whose outcome is unknown (transport failure, 5xx)
    done-  q pid tok err     a dequeue refused (lease lost): the task stays queued
    auto   q pid tok         left to the Worker's own acker (its outcome is not visible)

Payloads are a function of their pid (:func:`payload_of`), so a handler can check what it
read without asking anyone, and the checker compares against the producer's checksum too.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.helpers import lease_seq

Key = tuple[str, str]


def payload_of(pid: str, size: int) -> bytes:
    seed = hashlib.blake2b(pid.encode(), digest_size=32).digest()
    return (seed * (size // 32 + 1))[:size]


def crc(data: bytes) -> int:
    """zlib's CRC-32: independent of the CRC32C squall computes."""
    return zlib.crc32(data)


class Writer:
    """One ledger file; thread-safe; each record is one ``write`` system call."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.lock = threading.Lock()

    def write(self, kind: str, **rec: Any) -> None:
        line = json.dumps({"k": kind, **rec}, separators=(",", ":")) + "\n"
        with self.lock:
            os.write(self.fd, line.encode())

    def close(self) -> None:
        os.close(self.fd)


@dataclass
class Verdict:
    """The checks at the end, and the figures they rest on."""

    acked_puts: int = 0
    ambiguous_puts: int = 0
    tasks: int = 0  # distinct tasks that exist: acked puts + ambiguous ones that landed
    deliveries: int = 0
    duplicate_deliveries: int = 0  # deliveries beyond the first of each task
    acked_dones: int = 0
    ambiguous_dones: int = 0
    refused_dones: int = 0
    auto_dones: int = 0
    lost: list[Key] = field(default_factory=list)  # acked put, never delivered
    after_done: list[str] = field(default_factory=list)  # delivered after an acked done
    differing: list[str] = field(default_factory=list)  # payload checksum mismatch
    unknown_deliveries: list[str] = field(default_factory=list)  # a pid nobody put
    refused_puts: int = 0
    refused_applied: list[str] = field(default_factory=list)  # refused put, delivered

    def failures(self) -> list[str]:
        out = []
        if self.lost:
            out.append(f"{len(self.lost)} acknowledged puts lost, e.g. {self.lost[:5]}")
        if self.after_done:
            out.append(f"{len(self.after_done)} deliveries after an acknowledged done, "
                       f"e.g. {self.after_done[:5]}")
        if self.differing:
            out.append(f"{len(self.differing)} payloads differing, e.g. {self.differing[:5]}")
        if self.refused_applied:
            out.append(f"{len(self.refused_applied)} refused puts applied anyway (delivered),"
                       f" e.g. {self.refused_applied[:5]}")
        if self.unknown_deliveries:
            out.append(f"{len(self.unknown_deliveries)} deliveries of tasks nobody put, "
                       f"e.g. {self.unknown_deliveries[:5]}")
        return out


def read_all(folder: str) -> list[dict[str, Any]]:
    recs: list[dict[str, Any]] = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".jsonl"):
            continue
        with open(os.path.join(folder, name), "rb") as f:
            for line in f:
                if line.endswith(b"\n"):  # a torn last line of a killed writer is not a record
                    recs.append(json.loads(line))
    return recs


def check(recs: list[dict[str, Any]]) -> tuple[Verdict, set[Key]]:
    """The invariants over the whole ledger; also returns the set of tasks that exist."""
    v = Verdict()
    put_crc: dict[Key, int] = {}
    maybe_crc: dict[Key, int] = {}
    refused: dict[Key, str] = {}
    done_tok: dict[Key, int] = {}
    got: dict[Key, list[tuple[int, int, str]]] = defaultdict(list)
    for r in recs:
        k = r["k"]
        key = (r["q"], r["pid"])
        if k == "put":
            put_crc[key] = r["crc"]
        elif k == "put?":
            maybe_crc[key] = r["crc"]
        elif k == "put-":
            maybe_crc[key] = r["crc"]  # its checksum, should it show up anyway
            refused[key] = r["err"]
        elif k == "got":
            got[key].append((lease_seq(r["tok"]), r["crc"], r.get("w", "")))
        elif k == "done":
            done_tok[key] = max(done_tok.get(key, 0), lease_seq(r["tok"]))
    kinds = Counter(r["k"] for r in recs)
    v.acked_puts = len(put_crc)
    v.ambiguous_puts = len(set(maybe_crc) - set(put_crc) - set(refused))
    v.refused_puts = len(set(refused) - set(put_crc))
    v.acked_dones, v.ambiguous_dones = kinds["done"], kinds["done?"]
    v.refused_dones, v.auto_dones = kinds["done-"], kinds["auto"]
    v.deliveries = kinds["got"]
    for key, deliveries in got.items():
        v.duplicate_deliveries += len(deliveries) - 1
        want = put_crc.get(key, maybe_crc.get(key))
        if want is None:
            v.unknown_deliveries.append(f"{key}")
            continue
        for tok, c, w in deliveries:
            if c != want:
                v.differing.append(f"{key} token {tok} by {w}: crc {c} != {want}")
            if key in done_tok and tok > done_tok[key]:
                v.after_done.append(f"{key} token {tok} by {w} after done of token "
                                    f"{done_tok[key]}")
    v.refused_applied = [f"{key} refused with {refused[key][:120]}" for key in refused
                         if key in got and key not in put_crc]
    v.lost = sorted(key for key in put_crc if key not in got)
    exists = set(put_crc) | {key for key in maybe_crc if key in got}
    v.tasks = len(exists)
    return v, exists
