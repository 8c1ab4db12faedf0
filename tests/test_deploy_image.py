"""deploy/Dockerfile cannot be built here (no container runtime or base images), so this
checks it against the code instead, and runs its builder step: the stages, the files it
copies (they exist, they are all the wheel needs, and the .dockerignore lets them in), the
non-root user, the `squall` entrypoint, the exposed ports (the servers' default --port) and
the data directory (the one the manifests mount)."""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from tests.deploy_kit import (
    DEPLOY,
    ROOT,
    Stage,
    console_scripts,
    env_of,
    parse_dockerfile,
    server_options,
)

DOCKERFILE = DEPLOY / "Dockerfile"
BUILD_TOOLS = ("gcc", "build-essential", "g++", "make", "cc ", "git")


def stages() -> tuple[dict[str, str], Stage, Stage]:
    args, st = parse_dockerfile(DOCKERFILE)
    assert len(st) == 2, "a builder stage and a final stage"
    return args, st[0], st[1]


def copied_sources(stage: Stage) -> list[str]:
    """Context paths the stage COPYs (not --from another stage)."""
    out = []
    for a in stage.all("COPY"):
        words = shlex.split(a)
        assert not any(w.startswith("--from") for w in words)
        out.extend(w for w in words[:-1] if not w.startswith("--"))
    return out


def test_stages_and_bases() -> None:
    args, builder, final = stages()
    assert builder.name == "builder"
    assert final.name is None
    assert re.fullmatch(r"python:3\.\d+-slim", final.base), final.base
    assert builder.base == final.base  # the wheels' ABI matches the interpreter
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    minor = int(args["PYTHON_VERSION"].split(".")[1])
    assert requires == ">=3.11" and minor >= 11, (requires, args)
    assert any("pip wheel" in r for r in builder.all("RUN"))
    # nothing gets compiled or fetched in the final stage: no build tools, no package index
    final_runs = " ".join(final.all("RUN"))
    assert "apt-get" not in final_runs
    assert not any(t in final_runs for t in BUILD_TOOLS)
    assert "--no-index" in final_runs and "from=builder" in final_runs
    assert not final.all("COPY") and not final.all("ADD")


def test_builder_copies_what_the_wheel_needs(tmp_path: Path) -> None:
    """Run the builder's wheel step on exactly the files it copies: the wheel builds and
    ships the `squall` command and both server plugins."""
    _, builder, _ = stages()
    sources = copied_sources(builder)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    package_dirs = {v.split("/")[0] for v in
                    pyproject["tool"]["setuptools"]["package-dir"].values()}
    assert {s.rstrip("/") for s in sources} == {"pyproject.toml", pyproject["project"]["readme"],
                                                 *package_dirs}
    ignore = [ln.strip() for ln in (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    for s in sources:
        assert (ROOT / s).exists(), s
        assert _included(s.rstrip("/"), ignore), f"{s} is excluded by the .dockerignore"
        dst = tmp_path / "src" / s.rstrip("/")
        if (ROOT / s).is_dir():
            shutil.copytree(ROOT / s, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / s, dst)
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(tmp_path / "wheels"),
                        str(tmp_path / "src")], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    wheel = next((tmp_path / "wheels").glob("squall-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        ep = next(n for n in z.namelist() if n.endswith("entry_points.txt"))
        entry_points = z.read(ep).decode()
    assert "squall = squall.client.cli:main" in entry_points
    assert "master = squall.master.cli:register" in entry_points
    assert "datanode = squall.datanode.cli:register" in entry_points
    # the final stage installs the wheel by this name
    assert fnmatch.fnmatch(wheel.name, "squall-*.whl")


def _included(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    keep = True
    for p in patterns:
        neg = p.startswith("!")
        pat = p[1:] if neg else p
        pat = pat.rstrip("/")
        if pat == "**" or fnmatch.fnmatch(path, pat) or path.startswith(pat + "/"):
            keep = neg
    return keep


def test_user_entrypoint_ports_and_data_dir() -> None:
    _, _, final = stages()
    user = final.all("USER")[-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0, "numeric non-root user (runAsNonRoot needs it)"
    runs = " ".join(final.all("RUN"))
    assert f"--uid {uid}" in runs and f"--gid {gid}" in runs
    entry = final.all("ENTRYPOINT")[-1]
    assert shlex.split(entry.strip("[]").replace(",", " ")) == ["squall"]
    assert "squall" in console_scripts()
    opts = server_options()
    exposed = {int(p) for a in final.all("EXPOSE") for p in a.split()}
    assert exposed == {opts["master"]["port"].default, opts["datanode"]["port"].default}
    env = env_of(final)
    # the image's env vars are ones the servers read
    for k in env:
        if k.startswith("SQUALL_"):
            assert any(o.envvar == k for role in opts.values() for o in role.values()), k
    data = env["SQUALL_DATA_DIR"]
    assert f"mkdir -p {data}" in runs and f"chown squall:squall {data}" in runs
    assert final.all("WORKDIR")[-1] == data
    assert final.all("VOLUME")[-1] == f'["{data}"]'
    assert env["SQUALL_HOST"] == "0.0.0.0"  # reachable from other pods
    assert env.get("PYTHONDONTWRITEBYTECODE") == "1"  # the root filesystem is read-only
