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

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
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


# The stand-in nvidia-ml-py (sim/nvml_standin) by any name production could reach it: its package, its data
# file's variable and default path. Production imports the bindings as ``pynvml`` in one module.
STANDIN_MARKS = ("nvml_standin", "CLUSTERCTL_SIM_NVML_FILE", "/run/clusterctl-sim/nvml.json")
PYNVML_IMPORTER = "eas_agent/collectors/gpu.py"


def standin_uses(tree: ast.AST, rel: str) -> list[str]:
    """Imports and string constants (docstrings aside) of ``tree`` that reach the stand-in, and imports of
    ``pynvml`` outside PYNVML_IMPORTER."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [f"{node.module or ''}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            found += [f"{rel}:{node.lineno}: names {mark}" for mark in STANDIN_MARKS if mark in node.value]
        found += [f"{rel}:{node.lineno}: imports {n}" for n in names if "nvml_standin" in n]
        found += [f"{rel}:{node.lineno}: imports pynvml" for n in names
                  if n.split(".")[0] == "pynvml" and rel != PYNVML_IMPORTER]
    return found


def test_production_reads_gpus_through_pynvml_and_never_reaches_the_standin():
    """The virtual machines' agent imports the stand-in as nvidia-ml-py's ``pynvml`` from their package index,
    as a GPU node imports the real one: production must not know the stand-in exists (a module that read its
    file or its variable would be a simulator switch in production)."""
    problems = []
    for path in production_files():
        rel = str(path.relative_to(REPO))
        problems += standin_uses(ast.parse(path.read_text(), rel), rel)
    assert problems == []
    assert "import pynvml" in (REPO / PYNVML_IMPORTER).read_text()


@pytest.mark.parametrize(("source", "expected"), [
    ("from sim import nvml_standin\n", ["x.py:1: imports sim.nvml_standin"]),
    ("import sim.nvml_standin.pynvml as p\n", ["x.py:1: imports sim.nvml_standin.pynvml"]),
    ("import pynvml\n", ["x.py:1: imports pynvml"]),
    ("def f():\n    from pynvml import nvmlInit\n", ["x.py:2: imports pynvml"]),
    ("import os\nPATH = os.environ.get('CLUSTERCTL_SIM_NVML_FILE')\n", ["x.py:2: names CLUSTERCTL_SIM_NVML_FILE"]),
    ("def f():\n    return open('/run/clusterctl-sim/nvml.json')\n",
     ["x.py:2: names /run/clusterctl-sim/nvml.json"]),
    ('"""Reads GPUs through NVML; the machines get sim/nvml_standin."""\nimport json\n', []),
])
def test_the_standin_lint_sees_every_way_in(source, expected):
    assert standin_uses(ast.parse(source), "x.py") == expected
