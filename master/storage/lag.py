"""The index behind the WAL: durable records whose index commit failed.

An index commit can fail after its WAL group is durable (a full disk). The group's
requests are acknowledged then: a restart would replay them from the WAL. Until the index
holds them again it lacks acknowledged records, so
:class:`~squall.master.storage.commit.GroupCommit`
refuses writes (a plan made on it could undo them) and reads (they would answer as if the
records were not there), with :attr:`IndexLag.reason`. The background tick calls
:meth:`IndexLag.catch_up`, which applies the records again (an idempotent replay) once
the disk accepts writes. docs/master.md, "Refused means not applied".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from squall.master.storage.index import Index

log = logging.getLogger("squall.master")
Records = list[tuple[int, bytes]]


class IndexLag:
    def __init__(self, index: Index, reapply: Callable[[Records], None]) -> None:
        self.index = index
        self._reapply = reapply  # replays records onto the index
        self.reason: str | None = None  # why requests are refused while the index is behind
        self.records: Records = []  # durable records the index lacks, in ticket order

    def fell_behind(self, records: Records, e: Exception) -> None:
        """The index commit of `records` (durable in the WAL) failed with `e`."""
        self.records.extend(records)
        self.reason = (f"the index cannot be written ({e}); {len(self.records)} acknowledged "
                       "record(s) wait in the WAL and are applied again as soon as the disk "
                       "accepts writes")
        log.error("%s", self.reason)

    async def catch_up(self, thread: ThreadPoolExecutor) -> int | None:
        """Apply the records again on the index's writer `thread` (no write transaction may
        be open there). Returns the last ticket applied, or None while the index still
        cannot be written (or had nothing to catch up)."""
        if not self.records:
            return None
        try:
            await asyncio.get_running_loop().run_in_executor(thread, self._reapply,
                                                             list(self.records))
        except Exception as e:
            self.index.freed_pending.clear()
            self.index.reload()
            log.warning("index still cannot be written: %s", e)
            return None
        self.index.reload()
        last = self.records[-1][0]
        self.records.clear()
        self.reason = None
        log.info("the index caught up with the WAL: writes are accepted again")
        return last
