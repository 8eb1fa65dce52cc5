"""Documents the code cites are in the repository, and the tree describes the code as it
is. Every ``*.md`` path a tracked file names exists here; no file cites the workspace's ``shared/`` folder (a
reader of the repository does not have it) or a design document kept outside it; no file names an issue
number, a review finding's id, a work session or the commit ``main`` was at. What an issue or a finding asked
for is said in the file's own words (the threat, the reason); which finding a change closed, and when, is
history, and history lives in CHANGELOG.md (the one file allowed to name findings) and docs/decisions/.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TEXT = (".py", ".md", ".j2", ".yml", ".yaml", ".toml", ".cfg", ".sh", "Makefile")
SHARED = re.compile(r"(?<![\w.-])(?:\.\./|/work/)?shared/[\w./-]+")
MARKDOWN_PATH = re.compile(r"(?<![\w/.-])((?:[\w-]+/)+[\w.-]+\.md)\b")
ISSUE = re.compile(r"\bissue\s+#?\d+", re.IGNORECASE)
# History markers: a review finding's id ("security review L5", "review M1", "findings M1 and M2", "roles
# review #10", a bare "(L8)"), a work session ("session 14", "the session-13 path"), the commit main was at
# ("main at 6e1dab8", "main `8d93d52`") and documents outside the repository ("the design article").
HISTORY = {
    "a review finding's id": re.compile(
        r"\b(?:review|findings?)\s+(?:[HMLNR]\d{1,2}\b|#\d+)|\((?:[HMLNR]\d{1,2})\)"
        r"|\b[HMLNR]\d{1,2}(?:\s*-\s*|\s+and\s+)[HMLNR]\d{1,2}\b", re.IGNORECASE),
    "a work session": re.compile(r"\bsessions?[\s-]+\d+\b", re.IGNORECASE),
    "the commit main was at": re.compile(r"\bmain\s+(?:at\s+)?`?[0-9a-f]{7,40}\b"),
    "a document outside the repository": re.compile(r"\bdesign article\b|\bthe shared interfaces\b",
                                                     re.IGNORECASE),
}
HISTORY_HOME = ("CHANGELOG.md",)  # the changelog names the findings its entries close


SELF = "tests/docs/test_cited_documents.py"  # its examples below are citations on purpose


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


def history_in(rel: str, text: str) -> list[str]:
    if rel in HISTORY_HOME:
        return []
    return [f"{rel}:{number}: names {m.group(0)!r}, {what}: say the reason, keep the history in CHANGELOG.md"
            for number, line in enumerate(text.splitlines(), 1)
            for what, pattern in HISTORY.items() for m in pattern.finditer(line)]


def _problems(select) -> list[str]:
    problems = []
    for path in tracked_text_files():
        rel = path.relative_to(REPO).as_posix()
        if select(rel):
            text = path.read_text(errors="replace")
            problems += problems_in(rel, text) + history_in(rel, text)
    return problems


def test_every_cited_document_is_in_the_repository_and_no_file_outside_tests_tells_history():
    assert _problems(lambda rel: not rel.startswith("tests/")) == []


@pytest.mark.xfail(strict=False, reason="test files are being cleaned")
def test_no_test_file_tells_history():
    assert _problems(lambda rel: rel.startswith("tests/")) == []


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


@pytest.mark.parametrize(("rel", "line", "expected"), [
    ("a.py", "# secrets in env files included (security review L4).", 1),
    ("a.py", "# Review L3: off loopback without ACLs", 1),
    ("a.py", "Limits (findings M1 and M2 of the security review)", 1),
    ("a.py", "(each one a finding of the security review, M1-M3 and L1)", 1),
    ("a.py", "# leaves persistence off (roles review #10).", 1),
    ("a.py", "# fuzzing found int()/IndexError here (L8)", 1),
    ("a.md", "4.6 us (session 15); 2.30% in session 11", 2),
    ("a.md", "without a token (push only) it is the session-13 path", 1),
    ("a.md", '"before" = main at 6e1dab8', 1),
    ("a.md", "4 hosts: `--sizes 4`, main `8d93d52`", 1),
    ("a.py", "the design article's production mix", 1),
    ("a.md", "Config schema (the one agreed in the shared interfaces)", 1),
    ("CHANGELOG.md", "- Templates: interface names are matched whole (security review L5).", 0),
    ("a.py", '("L2 cache", f"{cores * 2} MiB")', 0),
    ("a.py", "a session of SSH, sessions are not implemented", 0),
    ("a.md", "the edge's main loop at 200 req/s", 0),
    ("a.md", "NVIDIA/DCGM#284 and linux-rdma/perftest#132, #240", 0),
    ("a.py", "c0, c1, m0, m1 = coeffs", 0),
])
def test_the_reader_sees_each_kind_of_history(rel, line, expected):
    assert len(history_in(rel, line)) == expected
