"""conftest.py files only declare fixtures (and the root one pytest's hooks): what tests share is in a
module of tests/helpers/, so no test module imports from a conftest. The exceptions, the guards
tests/guards/test_scheduling.py and test_test_classes.py, test the root conftest's scheduling hooks and the
mark reader they share (the root conftest holds what those hooks call).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parents[1]
HOOK_TESTS = {"tests/guards/test_scheduling.py": "tests.conftest", "tests/guards/test_test_classes.py": "tests.conftest"}


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


def non_fixtures(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of a conftest's top-level classes and of functions that are neither fixtures nor hooks."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            found.append((node.lineno, node.name))
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("pytest_"):
            decorators = [ast.unparse(d) for d in node.decorator_list]
            if not any(d.split("(")[0] in ("pytest.fixture", "fixture") for d in decorators):
                found.append((node.lineno, node.name))
    return found


def test_conftests_declare_only_fixtures():
    problems = []
    for path in sorted(TESTS.rglob("conftest.py")):
        rel = path.relative_to(TESTS.parent).as_posix()
        if rel == "tests/conftest.py":  # its hooks' helpers are tested by tests/guards/test_scheduling.py
            continue
        problems += [f"{rel}:{line}: {name} is not a fixture (move it to a helpers module)"
                     for line, name in non_fixtures(ast.parse(path.read_text(), rel))]
    assert problems == []


def test_the_reader_sees_classes_and_plain_functions():
    tree = ast.parse("import pytest\nclass A: pass\ndef helper(): pass\n@pytest.fixture\ndef f(): pass\n"
                     "@pytest.fixture(scope='module')\ndef g(): pass\ndef pytest_configure(config): pass\n")
    assert non_fixtures(tree) == [(2, "A"), (3, "helper")]
