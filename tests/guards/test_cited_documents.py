"""Documents the code cites are in the repository (architecture item 9): every ``*.md`` path a tracked file
names exists here, no file cites the workspace's ``shared/`` folder (a reader of the repository does not have
it), and no file names an issue number, in code or in prose such as the READMEs (what an issue asked for,
or the work it names, is said in the file's own words).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
TEXT = (".py", ".md", ".j2", ".yml", ".yaml", ".toml", ".cfg", ".sh", "Makefile")
SHARED = re.compile(r"(?<![\w.-])(?:\.\./|/work/)?shared/[\w./-]+")
MARKDOWN_PATH = re.compile(r"(?<![\w/.-])((?:[\w-]+/)+[\w.-]+\.md)\b")
ISSUE = re.compile(r"\bissue\s+#?\d+", re.IGNORECASE)


SELF = "tests/guards/test_cited_documents.py"  # its examples below are citations on purpose


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [REPO / n for n in names if n.endswith(TEXT) and not n.startswith("tests/fixtures/") and n != SELF]


def problems_in(rel: str, text: str, exists=lambda p: (REPO / p).exists()) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [f"{rel}:{number}: cites {m.group(0)}, outside the repository" for m in SHARED.finditer(line)]
        found += [f"{rel}:{number}: cites {m.group(1)}, which the repository does not have"
                  for m in MARKDOWN_PATH.finditer(SHARED.sub("", line))
                  if not exists(m.group(1)) and not exists(str(Path(rel).parent / m.group(1)))]
        found += [f"{rel}:{number}: names {m.group(0)!r}" for m in ISSUE.finditer(line)]
    return found


def test_every_cited_document_is_in_the_repository():
    problems = []
    for path in tracked_text_files():
        problems += problems_in(path.relative_to(REPO).as_posix(), path.read_text(errors="replace"))
    assert problems == []


@pytest.mark.parametrize(("rel", "line", "expected"), [
    ("a.py", "see shared/reviews/x.md", 1),
    ("a.py", "see ../shared/reviews/x.md", 1),
    ("a.py", "(design article /work/shared/seeds/002)", 1),
    ("a.py", "see docs/contracts/missing.md", 1),
    ("a.py", "see docs/contracts/present.md", 0),
    ("a.py", "until issue 12's scale work", 1),
    ("a.md", "Latest (issue 16)", 1),
    ("README.md", "the routing targets of Issue #16", 1),
    ("a.md", "upstream issues #273 and #234", 0),
    ("a.py", "the shared/ library", 0),
    ("a.py", "nvshared/y", 0),
])
def test_the_reader_sees_each_kind_of_citation(rel, line, expected):
    assert len(problems_in(rel, line, exists=lambda p: p == "docs/contracts/present.md")) == expected
