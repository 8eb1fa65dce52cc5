"""No module of the project over :data:`MAX_LINES` lines (tests excepted): past that, a module holds more
than one concern and a newcomer reads it whole to change a part (the architecture's "no module over ~430
lines"; the last ones over it, the machines, the dev server's framing, the pool view, the transports and
the report, were split along their seams)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
MAX_LINES = 450


def python_modules() -> list[str]:
    names = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    return [n for n in names if not n.startswith("tests/") and (REPO / n).exists()]


def too_long(paths: list[str], read=lambda p: (REPO / p).read_text()) -> list[str]:
    return [f"{p}: {n} lines (at most {MAX_LINES}: split it along a seam)"
            for p in paths if (n := len(read(p).splitlines())) > MAX_LINES]


def test_no_module_is_over_the_limit():
    assert too_long(python_modules()) == []


def test_the_limit_is_seen():
    texts = {"a.py": "x = 1\n" * MAX_LINES, "b.py": "x = 1\n" * (MAX_LINES + 1)}
    assert too_long(list(texts), read=texts.__getitem__) == [f"b.py: {MAX_LINES + 1} lines (at most {MAX_LINES}: split it along a seam)"]
