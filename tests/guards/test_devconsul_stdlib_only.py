"""devconsul imports nothing but the standard library: the virtual cluster's consul package runs it with the
machine's own python3, which has no pip packages (sim/aptrepo/consul_standin.py copies its sources to
/usr/lib/consul-standin). A third-party import passed every unit test and failed only on the machines,
where consul.service then never started on any node."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.helpers import module_imports

pytestmark = pytest.mark.unit

DEVCONSUL = Path(__file__).resolve().parents[2] / "devconsul"


def foreign_imports(tree: ast.AST) -> list[tuple[int, str]]:
    return [(line, name) for name, line, _ in module_imports(tree)
            if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] != "devconsul"]


def test_devconsul_imports_only_the_standard_library():
    problems = [f"devconsul/{path.name}:{line}: imports {name}"
                for path in sorted(DEVCONSUL.rglob("*.py"))
                for line, name in foreign_imports(ast.parse(path.read_text(), str(path)))]
    assert problems == []


def test_the_reader_sees_a_foreign_import():
    tree = ast.parse("import json\nimport re2\nfrom devconsul.kvstore import KVStore\nfrom requests import get\n")
    assert foreign_imports(tree) == [(2, "re2"), (4, "requests")]
