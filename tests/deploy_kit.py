"""Shared pieces of the deploy/ tests: a Dockerfile parser, the server commands' options as
the code defines them, and rendering a kustomize overlay."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = ("dev", "production")


# -- Dockerfile --------------------------------------------------------------------------
@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, instr: str) -> list[str]:
        return [a for i, a in self.instructions if i == instr]


def parse_dockerfile(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """Global ARGs (with defaults) and the stages, each a list of (INSTRUCTION, args) with
    continuation lines joined and comments dropped."""
    lines: list[str] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        lines.append(buf + line)
        buf = ""
    assert not buf, "a continuation line ends the file"
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        instr, _, rest = line.partition(" ")
        instr, rest = instr.upper(), rest.strip()
        if instr == "FROM":
            words = rest.split()
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            base = words[0]
            for k, v in args.items():
                base = base.replace("${" + k + "}", v)
            stages.append(Stage(base, name))
        elif not stages and instr == "ARG":
            k, _, v = rest.partition("=")
            args[k] = v
        else:
            assert stages, f"{instr} before the first FROM"
            stages[-1].instructions.append((instr, rest))
    return args, stages


def env_of(stage: Stage) -> dict[str, str]:
    out: dict[str, str] = {}
    for a in stage.all("ENV"):
        for item in shlex.split(a):
            k, _, v = item.partition("=")
            out[k] = v
    return out


# -- the code's own options ----------------------------------------------------------------
@cache
def server_options() -> dict[str, dict[str, Any]]:
    """`squall master` / `squall datanode` options by name (defaults, env vars, flags)."""
    import typer

    from squall.client.cli import _load_plugins, app

    _load_plugins()
    cmd: Any = typer.main.get_command(app)  # typer may carry its own copy of click
    out: dict[str, dict[str, Any]] = {}
    for role in ("master", "datanode"):
        out[role] = {p.name: p for p in cmd.commands[role].params
                     if p.param_type_name == "option" and p.name}
    return out


def env_vars(role: str) -> set[str]:
    return {str(o.envvar) for o in server_options()[role].values() if o.envvar}


def console_scripts() -> dict[str, str]:
    import tomllib

    return dict(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


# -- kustomize ---------------------------------------------------------------------------
def kubectl() -> str | None:
    return shutil.which("kubectl")


@cache
def k8s_with_keys() -> Path:
    """A copy of deploy/k8s with the dev overlay's keys made as docs/kubernetes.md says
    (deploy/k8s/make-keys.sh), in a temporary folder (nothing is written to the sources)."""
    import sys
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="squall-k8s-")) / "k8s"
    shutil.copytree(K8S, root, ignore=shutil.ignore_patterns("keys"))
    squall = str(Path(sys.executable).parent / "squall")
    r = subprocess.run(["sh", str(root / "make-keys.sh")], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "SQUALL": squall})
    assert r.returncode == 0, f"make-keys.sh failed:\n{r.stdout}{r.stderr}"
    return root


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    """The overlay as `kubectl kustomize` builds it (offline), as a tuple of documents; the
    dev overlay with keys made for this run."""
    exe = kubectl()
    assert exe is not None
    base = k8s_with_keys() if overlay == "dev" else K8S
    r = subprocess.run([exe, "kustomize", str(base / "overlays" / overlay)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"kubectl kustomize {overlay} failed:\n{r.stderr}"
    return tuple(d for d in yaml.safe_load_all(r.stdout) if d)


def find(docs: tuple[dict[str, Any], ...], kind: str, name_part: str = "") -> dict[str, Any]:
    hits = [d for d in docs if d["kind"] == kind and name_part in d["metadata"]["name"]]
    assert len(hits) == 1, f"{len(hits)} {kind} named *{name_part}*"
    return hits[0]
