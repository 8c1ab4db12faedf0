from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from squall.common.clock import ManualClock
from squall.master.service import Master, MasterSettings
from tests.helpers import MasterProcess, asgi_master


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def master_settings(tmp_path) -> MasterSettings:  # type: ignore[no-untyped-def]
    # semantics tests use made-up payload references; test_cluster checks real receipts
    return MasterSettings(data_dir=str(tmp_path / "master"), require_receipts=False)


@pytest.fixture
async def api(master_settings: MasterSettings, clock: ManualClock
              ) -> AsyncIterator[tuple[httpx.AsyncClient, Master]]:
    """An in-process master (injected clock, no background loops) and an httpx client."""
    async with asgi_master(master_settings, clock) as (c, m):
        yield c, m


@pytest.fixture(params=["fast", "framework"])
def fast_dispatch(request: pytest.FixtureRequest) -> bool:
    """Both ways a server serves its hot routes: the fast dispatcher, and FastAPI's stack
    (``common/server/layered.py``); the same handlers either way."""
    return bool(request.param == "fast")


@pytest.fixture
def master_proc(tmp_path) -> Iterator[MasterProcess]:  # type: ignore[no-untyped-def]
    m = MasterProcess(str(tmp_path / "master")).start()
    try:
        yield m
    finally:
        m.stop()
