"""The docs stay reference: no run logs in the reference pages, no issue numbers in code or
docs (a comment says its reason itself), and every design decision page is indexed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DECISIONS = ROOT / "docs" / "decisions"

# measurement diaries: machine loads, clock times, "alternating with ..." run notes
RUN_LOG = re.compile(r"load average|load ~|[0-9]{2}:[0-9]{2} UTC|alternating (with|runs)")
ISSUE = re.compile(r"issue [0-9]+|issue-[0-9]+|issues? #?[0-9]+", re.IGNORECASE)


def _files(*globs: str) -> list[Path]:
    out: list[Path] = []
    for g in globs:
        out += [p for p in ROOT.glob(g) if p.is_file() and "__pycache__" not in p.parts]
    return sorted(set(out))


def _hits(pattern: re.Pattern[str], files: list[Path]) -> list[str]:
    hits = []
    for p in files:
        rel = p.relative_to(ROOT).as_posix()
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                hits.append(f"{rel}:{n}: {line.strip()[:100]}")
    return hits


def test_reference_pages_hold_no_run_logs() -> None:
    pages = [p for p in _files("docs/**/*.md") if DECISIONS not in p.parents]
    assert pages
    assert _hits(RUN_LOG, pages) == []


def test_no_issue_numbers_in_code_or_docs() -> None:
    files = _files("master/**/*.py", "datanode/**/*.py", "client/**/*.py", "common/**/*.py",
                   "tests/**/*.py", "bench/*.py", "bench/README.md", "docs/**/*.md",
                   "README.md", "CHANGELOG.md", "Makefile")
    assert len(files) > 100
    assert _hits(ISSUE, files) == []


def test_every_decision_page_is_indexed_once() -> None:
    index = (DECISIONS / "README.md").read_text(encoding="utf-8")
    pages = sorted(p.name for p in DECISIONS.glob("[0-9][0-9][0-9][0-9]-*.md"))
    numbers = [name[:4] for name in pages]
    assert len(numbers) == len(set(numbers)), "two pages share a number"
    for name in pages:
        assert index.count(f"({name})") == 1, f"{name} is not linked once from the index"
