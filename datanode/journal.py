"""What changed since the last heartbeat: the incremental block report."""

from __future__ import annotations

import threading
from collections.abc import Iterable


class Journal:
    """Blob ids committed / removed since the last heartbeat took them, and replicas found
    corrupt. Thread-safe; ids are recorded only after their change is durable."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._added: set[str] = set()
        self._deleted: set[str] = set()
        self._corrupt: list[str] = []

    def added(self, ids: Iterable[str]) -> None:
        with self._lock:
            for i in ids:
                self._deleted.discard(i)
                self._added.add(i)

    def deleted(self, ids: Iterable[str], corrupt: bool = False) -> None:
        with self._lock:
            for i in ids:
                self._added.discard(i)
                self._deleted.add(i)
                if corrupt:
                    self._corrupt.append(i)

    def take(self) -> tuple[list[str], list[str], list[str]]:
        with self._lock:
            out = sorted(self._added), sorted(self._deleted), self._corrupt
            self._added, self._deleted, self._corrupt = set(), set(), []
            return out
