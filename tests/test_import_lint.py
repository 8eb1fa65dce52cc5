"""Production packages never import the simulators (``sim``): a simulator reachable from production code
would ship inside the deployables and could stand in for hardware on a real node.

Allowed: an import inside a function of the CLI's ``virtual`` and ``demo`` commands (and the demo's traffic), which exist to run
the simulators and import them only when run (``clusterctl virtual up``, ``clusterctl demo``). Everything
else in the production packages (``PRODUCTION``: the controller's, the agent's, the edge's and the roles'
plugins) fails this test, at module level or not; every other top-level package is named in ``NOT_PRODUCTION``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import module_imports, python_packages

REPO = Path(__file__).resolve().parents[1]
PRODUCTION = ("cluster", "provision", "preflight", "eas_agent", "edge", "cli", "consul_io", "playbooks", "collections")
# The simulators themselves, what runs them (the benchmarks, the dev Consul server) and the tests.
NOT_PRODUCTION = {"sim", "bench", "devconsul", "tests"}
LAZY_ALLOWED = {"cli/commands/virtual.py", "cli/commands/demo.py"}


def sim_imports(tree: ast.AST) -> list[tuple[int, bool]]:
    """(line, inside a function) of every import of ``sim`` or ``sim.*``."""
    return sorted({(line, in_function) for name, line, in_function in module_imports(tree)
                   if name == "sim" or name.startswith("sim.")})


def production_files() -> list[Path]:
    return sorted(p for package in PRODUCTION for p in (REPO / package).rglob("*.py"))


def test_production_modules_never_import_sim():
    problems = []
    for path in production_files():
        rel = str(path.relative_to(REPO))
        for line, in_function in sim_imports(ast.parse(path.read_text(), rel)):
            if not (in_function and rel in LAZY_ALLOWED):
                problems.append(f"{rel}:{line}: imports sim" + ("" if in_function else " at module level"))
    assert problems == []


def test_every_python_package_is_production_or_named_as_not():
    """A package added to the repository (or left out of PRODUCTION) fails here until it is placed."""
    assert python_packages(REPO) == set(PRODUCTION) | NOT_PRODUCTION


@pytest.mark.parametrize(("source", "expected"), [
    ("import sim.hosts\n", [(1, False)]),
    ("from sim.hosts import simulate\n", [(1, False)]),
    ("def f():\n    from sim import hosts\n", [(2, True)]),
    ("import simplejson\nfrom simple import x\nfrom .sim import y\n", []),
])
def test_the_lint_sees_every_form_of_import(source, expected):
    assert sim_imports(ast.parse(source)) == expected
