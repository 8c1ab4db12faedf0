"""What changed since the last heartbeat: the incremental block report."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator


class Journal:
    """Blob ids committed / removed since the last heartbeat took them, and replicas found
    corrupt. Thread-safe; ids are recorded only after their change is durable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._added: dict[str, int] = {}  # blob id -> size (-1: not known)
        self._deleted: set[str] = set()
        self._corrupt: list[str] = []

    def added(self, ids: Iterable[str], sizes: Iterable[int] | None = None) -> None:
        with self._lock:
            for i, size in zip(ids, sizes if sizes is not None else _unknown(), strict=False):
                self._deleted.discard(i)
                self._added[i] = size

    def deleted(self, ids: Iterable[str], corrupt: bool = False) -> None:
        with self._lock:
            for i in ids:
                self._added.pop(i, None)
                self._deleted.add(i)
                if corrupt:
                    self._corrupt.append(i)

    def take(self) -> tuple[list[str], list[str], list[str]]:
        added, _, deleted, corrupt = self.take_sized()
        return added, deleted, corrupt

    def take_sized(self) -> tuple[list[str], list[int], list[str], list[str]]:
        """(added ids, their sizes or [] if any is unknown, deleted ids, corrupt ids)."""
        with self._lock:
            added = sorted(self._added)
            sizes = [self._added[i] for i in added]
            out = added, sizes if all(s >= 0 for s in sizes) else [], sorted(self._deleted), \
                self._corrupt
            self._added, self._deleted, self._corrupt = {}, set(), []
            return out


def _unknown() -> Iterator[int]:
    while True:
        yield -1
