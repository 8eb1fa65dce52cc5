"""The benchmarks call `clusterctl virtual` as the README documents it (-i DIR), not the deprecated positional
form (which still works but prints a deprecation note into every bench log)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[3] / "bench"
# "virtual", then a subcommand, then anything but "-i" as the next argument
POSITIONAL = re.compile(r'"virtual",\s*"(?:create|up|down|status)",(?!\s*"-i")')


def test_benchmarks_pass_the_inventory_with_dash_i():
    found = [f"{path.name}:{text[:m.start()].count(chr(10)) + 1}" for path in sorted(BENCH.rglob("*.py"))
             for text in [path.read_text()] for m in POSITIONAL.finditer(text)]
    assert found == []
