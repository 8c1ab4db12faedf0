"""Queue names, groups, pids and their limits.

A queue is written ``group#name`` (``crawl#fetch``); without ``#`` the group is ``default``.
Names are 1-128 characters of ``A-Z a-z 0-9 _ . : -`` starting with a letter or digit, so
they are safe in URLs, file names and metric labels. A pid is any non-empty UTF-8 string of
at most :data:`PID_MAX_BYTES` bytes; queues are served in lexicographic order of the pid's
UTF-8 bytes (which is code point order).
"""

from __future__ import annotations

import hashlib
import re

from squall.common.errors import BadRequest, PayloadTooLarge

DEFAULT_GROUP = "default"
PID_MAX_BYTES = 1024
PID_KEY_CUT = 448  # LMDB keys are at most 511 bytes
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}")


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise BadRequest(
            f"invalid {kind} name {name!r}: use 1-128 characters of A-Z a-z 0-9 _ . : - "
            "starting with a letter or digit"
        )
    return name


def split_queue(full: str) -> tuple[str, str]:
    """``"crawl#fetch"`` → ``("crawl", "fetch")``; ``"fetch"`` → ``("default", "fetch")``."""
    group, sep, name = full.rpartition("#")
    if not sep:
        group = DEFAULT_GROUP
    return check_name("group", group), check_name("queue", name)


def join_queue(group: str, name: str) -> str:
    return f"{group}#{name}"


def check_pid(pid: str) -> bytes:
    """Validate a user pid and return its UTF-8 bytes."""
    if not isinstance(pid, str) or not pid:
        raise BadRequest("pid must be a non-empty string")
    try:
        raw = pid.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: the size limit is still said first
        raw = pid.encode("utf-8", "surrogatepass")
        if len(raw) > PID_MAX_BYTES:
            raise PayloadTooLarge(f"pid is {len(raw)} bytes; the limit is {PID_MAX_BYTES} "
                                  "bytes") from None
        raise BadRequest("pid must be valid UTF-8 (no lone surrogates)") from None
    if len(raw) > PID_MAX_BYTES:
        raise PayloadTooLarge(f"pid is {len(raw)} bytes; the limit is {PID_MAX_BYTES} bytes")
    if "\x00" in pid:
        raise BadRequest("pid must not contain NUL characters")
    return raw


def pid_key(pid: str) -> bytes:
    """The key that orders a pid in its queue, on the master and everywhere else: the
    pid's UTF-8 bytes when they are at most :data:`PID_KEY_CUT` bytes; a longer pid is cut
    there and followed by 16 bytes of its BLAKE2b hash. So pid order is exact except
    between two pids longer than the cut that share their first :data:`PID_KEY_CUT` bytes,
    which are ordered by hash. Compare these keys, never the pid strings, to follow the
    master's order (a test pins this to ``squall.master.storage.index.pidkey``)."""
    raw = pid.encode("utf-8")
    if len(raw) <= PID_KEY_CUT:
        return raw
    return raw[:PID_KEY_CUT] + hashlib.blake2b(raw, digest_size=16).digest()
