from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from squall.common.clock import ManualClock
from squall.master.app import create_master_app
from squall.master.service import Master, MasterSettings
from tests.helpers import ADMIN, MasterProcess


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
    app = create_master_app(master_settings, clock=clock, background=False)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1",
                                     headers=ADMIN) as c:
            yield c, app.state.master


@pytest.fixture
def master_proc(tmp_path) -> Iterator[MasterProcess]:  # type: ignore[no-untyped-def]
    m = MasterProcess(str(tmp_path / "master")).start()
    try:
        yield m
    finally:
        m.stop()
