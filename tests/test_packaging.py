"""Packaging: the wheel ships every sub-package, and the installs by role hold.

An editable install finds any folder, so a package missing from pyproject.toml only shows
up in a real wheel; these tests build one (once) and import from it in a clean interpreter,
then install it into a fresh virtual environment without the ``server`` extra (what
``pip install squall`` gives a client-only user) and use it there against a real master.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.helpers import MasterProcess

ROOT = Path(__file__).resolve().parent.parent
TOP = {"master": "squall/master", "datanode": "squall/datanode", "client": "squall/client",
       "common": "squall/common"}
# what only the master and the data node need: never in a client-only install
SERVER_ONLY = ("fastapi", "starlette", "uvicorn", "lmdb", "prometheus_client")


def source_packages() -> set[str]:
    out = set()
    for folder, dotted in TOP.items():
        for d, _, files in os.walk(ROOT / folder):
            if "__pycache__" in d:
                continue
            if any(f.endswith(".py") for f in files):
                rel = Path(d).relative_to(ROOT / folder)
                out.add(str(Path(dotted) / rel) if str(rel) != "." else dotted)
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # build from a clean copy: setuptools reuses a stale build/ and would hide a gap
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", "build", "*.egg-info", ".git", "__pycache__", ".squall", "bench", "tests",
        ".*_cache", ".hypothesis"))
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps",
                            "--no-build-isolation", "-w", str(tmp), str(src)],
                           check=True, capture_output=True, text=True, cwd=tmp)
    BUILD_LOG.append(build.stdout + build.stderr)
    return next(tmp.glob("squall-*.whl"))


BUILD_LOG: list[str] = []


def test_the_build_warns_of_no_ignored_package(wheel: Path) -> None:
    """setuptools warns (~40 lines each, on every install) about data folders it sees as
    importable packages that pyproject.toml does not list; there are none."""
    assert "would be ignored" not in BUILD_LOG[0], BUILD_LOG[0][-3000:]


def test_wheel_ships_every_package(wheel: Path, tmp_path: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {str(Path(n).parent) for n in names if n.endswith(".py")}
    missing = source_packages() - shipped
    assert not missing, f"packages missing from the wheel (add them to pyproject.toml): {missing}"
    for dotted in TOP.values():
        assert f"{dotted}/py.typed" in names
    assert not any(n.startswith(("tests/", "bench/")) for n in names)
    # the browser assets ship as package data (the dashboard and /docs serve them offline)
    assert {"squall/master/static/dashboard.html", "squall/master/static/dashboard.js",
            "squall/master/static/vendor/uPlot.iife.min.js",
            "squall/common/server/static/swagger-ui/swagger-ui-bundle.js"} <= set(names)
    assert "squall/__init__.py" not in names  # squall is a namespace of the four packages

    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = (
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path "
        "if 'editable' not in type(f).__module__.lower() and 'editable' not in repr(f)]; "
        f"sys.path.insert(0, {str(site)!r}); "
        "import importlib; "
        "mods = [importlib.import_module(m) for m in "
        "('squall.master.http.app', 'squall.common.wire.models', 'squall.client.cli', "
        "'squall.datanode')]; "
        f"assert all(m.__file__.startswith({str(site)!r}) for m in mods), "
        "[m.__file__ for m in mods]"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)


def test_extras_split_the_roles() -> None:
    """The base install is the client's; the servers' libraries are in the server extra
    (and the server image installs it)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {r.split(";")[0].split("[")[0].split(">")[0].split("=")[0].split("<")[0]
                .strip().lower().replace("_", "-") for r in reqs}

    base, extras = names(project["dependencies"]), project["optional-dependencies"]
    server = names(extras["server"])
    assert {"fastapi", "uvicorn", "lmdb", "prometheus-client"} <= server
    assert not base & (server | names(extras["spark"]))
    assert {"httpx", "pydantic", "typer"} <= base
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "'.[server]'" in dockerfile and "'squall[server]'" in dockerfile


def _run(argv: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    # the test session's environment: SQUALL_TOKEN holds the admin credential
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "SQUALL_DEBUG")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env,
                          stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]


def test_client_only_install(wheel: Path, tmp_path: Path, master_proc: MasterProcess) -> None:
    """`pip install squall` (the wheel and its base dependencies, from pip's cache or the
    index): the clients, the Worker and the user verbs work without any server library, and
    the server commands say what to install instead of failing with a traceback."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py, squall = str(venv / "bin" / "python"), str(venv / "bin" / "squall")
    r = _run([sys.executable, "-m", "pip", "--python", py, "install", "-q",
              "--disable-pip-version-check", str(wheel)])
    assert r.returncode == 0, r.stderr

    check = (
        "import importlib.util, sys\n"
        "import squall.client, squall.client.cli, squall.client.worker.runtime\n"
        "from squall.client import AsyncClient, Client, Worker\n"
        f"assert [m for m in {SERVER_ONLY!r} if importlib.util.find_spec(m)] == []\n"
        f"assert not [m for m in sys.modules if m.split('.')[0] in {SERVER_ONLY!r}]\n"
        "assert squall.client.__file__.startswith(sys.prefix), squall.client.__file__\n"
        "with Client(sys.argv[1]) as c:\n"
        "    tasks = c.lease('demo#jobs', max_tasks=10, lease_secs=30)\n"
        "    assert len(tasks) == 3, tasks\n"
        "    with c.transaction() as tx:\n"
        "        for t in tasks:\n"
        "            tx.dequeue(t)\n"
        "    assert c.stats('demo#jobs').available == 0\n"
    )
    r = _run([squall, "--help"])
    assert r.returncode == 0 and "put" in r.stdout and "lease" in r.stdout, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    assert "Unavailable in this install: pip install 'squall[server]'" in r.stdout, r.stdout
    r = _run([squall, "put", "--help"])
    assert r.returncode == 0 and "queue" in r.stdout, r.stdout + r.stderr
    # a user verb against a real master, then the Python client
    r = _run([squall, "put", "demo#jobs", "--count", "3", "--master", master_proc.url])
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run([py, "-c", check, master_proc.url], cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr

    for argv in (["master", "--help"], ["datanode", "--help"], ["master"], ["dev"]):
        r = _run([squall, *argv])
        out = " ".join((r.stdout + r.stderr).split())  # Rich may wrap the line
        assert r.returncode == 1, (argv, out)
        assert "pip install 'squall[server]'" in out, (argv, out)
        assert "Traceback" not in out, (argv, out)
