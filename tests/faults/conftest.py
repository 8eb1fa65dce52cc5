"""The fault suite's tally: each test adds what it tried (``inputs``) and what it survived (``faults``);
the totals are printed at the end of the run (``pytest tests/faults -q``) and written to
``$FAULTS_TALLY`` when set, so the counts the issue asks for come from the run itself."""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest

INPUTS: Counter = Counter()
FAULTS: Counter = Counter()


class Tally:
    def inputs(self, kind: str, n: int) -> None:
        INPUTS[kind] += n

    def fault(self, kind: str, n: int = 1) -> None:
        FAULTS[kind] += n


@pytest.fixture
def tally() -> Tally:
    return Tally()


def pytest_terminal_summary(terminalreporter):
    if not INPUTS and not FAULTS:
        return
    # Every test asserts that nothing acknowledged was lost and nothing crashed; a failed one is a loss.
    failed = [r for key in ("failed", "error") for r in terminalreporter.stats.get(key, [])
              if "tests/faults/" in getattr(r, "nodeid", "")]
    write = terminalreporter.write_line
    write("")
    write(f"fault suite: {sum(INPUTS.values())} hostile inputs tried, {sum(FAULTS.values())} faults survived, "
          f"{len(failed)} tests saw something lost or crashed")
    for kind, n in sorted(INPUTS.items()):
        write(f"  inputs  {kind:<38} {n:>6}")
    for kind, n in sorted(FAULTS.items()):
        write(f"  fault   {kind:<38} {n:>6}")
    path = os.environ.get("FAULTS_TALLY")
    if path:
        with open(path, "w") as handle:
            json.dump({"inputs": INPUTS, "faults": FAULTS, "failed": [r.nodeid for r in failed]}, handle, indent=2)
