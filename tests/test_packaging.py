"""The wheel (a non-editable install) must ship every sub-package and its py.typed.

An editable install finds any folder, so a package missing from pyproject.toml only shows
up in a real wheel; this test builds one and imports from it in a clean interpreter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOP = {"master": "squall/master", "datanode": "squall/datanode", "client": "squall/client",
       "common": "squall/common"}


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


def test_wheel_ships_every_package(tmp_path: Path) -> None:
    # build from a clean copy: setuptools reuses a stale build/ and would hide a gap
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", "build", "*.egg-info", ".git", "__pycache__", ".squall", "bench", "tests"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path), str(src)],
                   check=True, capture_output=True, cwd=tmp_path)
    wheel = next(tmp_path.glob("squall-*.whl"))
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
