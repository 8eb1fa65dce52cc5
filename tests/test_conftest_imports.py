"""conftest.py files only declare fixtures (and the root one pytest's hooks): what tests share is in a
``helpers.py`` (or the area's own helper module), so no test module imports from a conftest. The one
exception, tests/test_xdist_groups.py, tests the root conftest's scheduling hooks themselves.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
HOOK_TESTS = {"tests/test_xdist_groups.py": "tests.conftest"}


def conftest_imports(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
        found += [(node.lineno, name) for name in names if name.split(".")[-1] == "conftest"]
    return found


def test_no_test_module_imports_from_a_conftest():
    problems = []
    for path in sorted(TESTS.rglob("*.py")):
        rel = path.relative_to(TESTS.parent).as_posix()
        for line, module in conftest_imports(ast.parse(path.read_text(), rel)):
            if HOOK_TESTS.get(rel) != module:
                problems.append(f"{rel}:{line}: imports {module} (move what it needs to a helpers module)")
    assert problems == []


def test_the_reader_sees_both_import_forms():
    tree = ast.parse("from tests.virtual.conftest import x\nimport tests.provision.conftest\nfrom tests.helpers import y\n")
    assert conftest_imports(tree) == [(1, "tests.virtual.conftest"), (2, "tests.provision.conftest")]
