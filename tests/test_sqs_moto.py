"""moto's own SQS test suite, run in its server mode against squall's SQS endpoint.

The suite comes from moto's source distribution on PyPI (a pinned version, fetched at test
time into build/compat, never copied into this repository). Its tests run unchanged with
``TEST_SERVER_MODE=true`` and ``TEST_SERVER_MODE_ENDPOINT`` naming squall's endpoint;
squall serves no reset API (``MOTO_CALL_RESET_API=false``). moto signs with its fixed fake
key pair, so the master imports that pair (``squall auth mint --sqs --import-sqs-key``)
for one group named as moto's account, and the data nodes take every region
(``SQUALL_SQS_REGION=*``), as moto's tests use several. One thing is injected beside the
suite, not into it: the ``account_id`` fixture (moto asks STS, which squall does not
serve).

``sqs_compat/moto_expected_failures.txt`` lists the tests expected to fail, each with its
reason. A test failing that is not listed fails this test; a listed test that passes is
reported, so the list can shrink.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import cluster_fixture
from tests.sqs_compat.harness import CACHE, Endpoint, endpoint_for

MOTO_VERSION = "5.1.18"
SUITE = ["tests/test_sqs/test_sqs.py", "tests/test_sqs/test_sqs_multiaccount.py"]
EXPECTED = Path(__file__).parent / "sqs_compat" / "moto_expected_failures.txt"

_CONFTEST = '''
import os

import pytest


@pytest.fixture
def account_id():
    return os.environ["SQUALL_SQS_ACCOUNT"]
'''


def _suite() -> Path:
    """moto's tests of the pinned version, extracted once under build/compat."""
    root = CACHE / f"moto-{MOTO_VERSION}"
    if not (root / SUITE[0]).exists():
        _extract(root)
    (root / "tests" / "test_sqs" / "conftest.py").write_text(_CONFTEST)
    return root


def _extract(root: Path) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    sdist = CACHE / f"moto-{MOTO_VERSION}.tar.gz"
    if not sdist.exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--no-binary", ":all:", f"moto=={MOTO_VERSION}", "-d", str(CACHE)],
                       check=True, timeout=600)
    wanted = ("tests/__init__.py", "tests/conftest.py", "tests/markers.py", "tests/test_sqs/")
    prefix = f"moto-{MOTO_VERSION}/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers()
                   if m.isfile() and m.name.removeprefix(prefix).startswith(wanted)]
        for m in members:
            m.name = m.name.removeprefix(prefix)
        tar.extractall(root, members=members, filter="data")


def _expected() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in EXPECTED.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, reason = line.partition("  # ")
            out[name.strip()] = reason.strip()
    return out


def _outcomes(junit: Path) -> dict[str, str]:
    """test id (module.Class::name, as junit names it) -> passed, failed, error or skipped."""
    out: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        out[name] = ("failed" if "failure" in kinds else "error" if "error" in kinds
                     else "skipped" if "skipped" in kinds else "passed")
    return out


def test_moto_sqs_suite(sqs_endpoint: Endpoint, tmp_path: Path) -> None:
    pytest.importorskip("moto", reason="moto (the dev extra) runs its own suite")
    root = _suite()
    junit = tmp_path / "moto.xml"
    env = sqs_endpoint.env(TEST_SERVER_MODE="true", TEST_SERVER_MODE_ENDPOINT=sqs_endpoint.url,
                           MOTO_CALL_RESET_API="false", SQUALL_SQS_ACCOUNT=sqs_endpoint.account)
    env.pop("AWS_ENDPOINT_URL_SQS")  # moto points its clients at the endpoint itself
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    "-p", "no:randomly", "-o", "addopts=", "-W", "ignore",
                    f"--junitxml={junit}", "--rootdir", str(root), *SUITE],
                   cwd=root, env=env, timeout=1200, capture_output=True)
    shutil.copy(junit, CACHE / "moto-last.xml")  # the last run's report, for a look at it
    outcomes = _outcomes(junit)
    failed = {name for name, kind in outcomes.items() if kind in ("failed", "error")}
    expected = _expected()
    passed = sum(kind == "passed" for kind in outcomes.values())
    print(f"moto {MOTO_VERSION} SQS suite against squall: {passed} passed, "
          f"{len(failed)} failed as listed of {len(outcomes)}")
    newly = sorted(failed - set(expected))
    assert not newly, f"{len(newly)} moto tests fail that are not expected to: {newly}"
    fixed = sorted(set(expected) - failed)
    if fixed:
        print("listed as expected failures but passing now (shorten the list):", fixed)
    assert passed > 0, "moto's suite passed no test"


cluster = cluster_fixture("sqsmoto", nodes=2, extra_env={"SQUALL_SQS_REGION": "*"})
MOTO_KEY = ("FOOBARKEY", "FOOBARSECRET")  # what moto's mock_aws signs with
MOTO_ACCOUNT = "123456789012"


@pytest.fixture(scope="module")
def sqs_endpoint(cluster: Any) -> Endpoint:
    return endpoint_for(cluster, key=MOTO_KEY, group=MOTO_ACCOUNT)
