"""The fault suite's tally: each fault test (one that takes the ``tally`` fixture, tests/conftest.py) adds what
it tried (``inputs``) and what it survived (``faults``); the totals are printed at the end of the run and
written to ``$FAULTS_TALLY`` when set, so the counts come from the run itself. Under pytest-xdist each worker
counts its own tests and hands its counts to the controller, which prints the sum (the hooks are in
tests/conftest.py). The fault tests live with their subjects; tests/FAULTS.md lists them."""

from __future__ import annotations

import json
import os
from collections import Counter

INPUTS: Counter = Counter()
FAULTS: Counter = Counter()
TESTS: set[str] = set()  # node ids of the tests that took the tally


class Tally:
    def __init__(self, nodeid: str = "") -> None:
        if nodeid:
            TESTS.add(nodeid)

    def inputs(self, kind: str, n: int) -> None:
        INPUTS[kind] += n

    def fault(self, kind: str, n: int = 1) -> None:
        FAULTS[kind] += n


def counts() -> dict:
    return {"inputs": dict(INPUTS), "faults": dict(FAULTS), "tests": sorted(TESTS)}


def add(worker_counts: dict) -> None:
    INPUTS.update(worker_counts.get("inputs", {}))
    FAULTS.update(worker_counts.get("faults", {}))
    TESTS.update(worker_counts.get("tests", []))


def write_summary(terminalreporter) -> None:
    if not INPUTS and not FAULTS:
        return
    # Every test asserts that nothing acknowledged was lost and nothing crashed; a failed one is a loss.
    failed = [r for key in ("failed", "error") for r in terminalreporter.stats.get(key, [])
              if getattr(r, "nodeid", "") in TESTS]
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
