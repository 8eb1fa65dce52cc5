"""Architecture as CI: what each package may import.

**The agent and the edge never import each other**: what crosses between them is ``eas_wire``, which imports
nothing of the project.

**Production never imports the simulators** (``sim``): a simulator reachable from production code would ship
inside the deployables and could stand in for hardware on a real node. Allowed: an import inside a function of
the CLI's ``virtual`` command, which exists to run the simulators and imports them only when run (``clusterctl
virtual up``). Everything else in the production packages (``PRODUCTION``: the controller's, the agent's, the
edge's and the roles' plugins) fails, at module level or not; every other top-level package is named in
``NOT_PRODUCTION``. Nor does production spell the simulators' state directory name (``.sim``): whether a
machine was provisioned is a fact the machine carries, not a record production keeps for the simulator.

**No package imports one above it** (``FLOORS``, lowest first): what the controller shares (``common``), the
Consul layer, the model and the agent, what works on them (preflight, provisioning, the edge, the roles'
plugins), the simulators (scaffolding: they drive all of that, and nothing of production imports them), the
CLI, and the applications on top (the demo and the benchmarks). The one import upward is the CLI's lazy command
table: a command module may import, inside its function, the application it runs (``clusterctl demo``). So the
simulators never import the CLI or the demo, and the demo reaches the CLI only through ``cli.views`` (the
renderings a command and the demo share); it runs commands as processes, as a person does.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import module_imports, python_packages

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PRODUCTION = ("common", "cluster", "provision", "preflight", "eas_agent", "eas_wire", "edge", "cli", "consul_io", "playbooks",
              "collections", "operate")
# The simulators themselves, what runs them (the demo, the benchmarks, the dev Consul server) and the tests.
NOT_PRODUCTION = {"sim", "demo", "bench", "devconsul", "tests"}
LAZY_ALLOWED = {"cli/commands/virtual.py"}

# Each package's floor: it imports packages on its floor or below, never above. Two packages on one floor may
# import each other unless a narrower rule forbids it (the agent and the edge: only through their protocol
# package, which imports nothing of the project and stands on the ground floor beside common).
FLOORS = {
    "common": 0,  # errors, exit codes, wording: depends on nothing of the project
    "eas_wire": 0,  # the agent-edge protocol: depends on nothing of the project
    "consul_io": 1, "devconsul": 1,  # the one Consul client and names; the dev Consul server
    "cluster": 2, "eas_agent": 2,  # the model; the node agent
    "preflight": 3, "provision": 3, "edge": 3, "playbooks": 3, "collections": 3,
    "operate": 3,  # operations on a running cluster: load tests, score calibration
    "sim": 4,  # scaffolding above everything it simulates, below what runs it
    "cli": 5,
    "demo": 6, "bench": 6,  # applications above the CLI
}
# A folder named like a standard library module (collections/: the Ansible collection, imported by Ansible as
# ``ansible_collections``) is never what an import of that name reaches: no edge between floors.
NOT_PROJECT_IMPORTS = set(sys.stdlib_module_names)
# The only imports upward: inside a function of a CLI command module (the lazy command table runs the
# application above it only when its command runs).
LAZY_UPWARD = re.compile(r"cli/commands/[^/]+\.py")
DEMO_MAY_IMPORT_FROM_CLI = "cli.views"
# The simulators' state directory under a virtual inventory (sim/hosts/state_dir.STATE_DIR_NAME), as a path
# component: '.sim' after nothing that continues a name (or a template's value), and not continued.
SIM_STATE_DIR = re.compile(r"(?<![\w.}-])\.sim(?![\w-])")


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


# The project packages each deployable of the scoring path may import (itself included). The agent and the
# edge are installed apart (provision/wheels.py), each with eas_wire and consul_io: an import of the other
# would fail on its host, and a change inside one must not reach the other except through the protocol.
DEPLOYABLE_IMPORTS = {
    "eas_agent": {"eas_agent", "eas_wire", "consul_io"},
    "edge": {"edge", "eas_wire", "consul_io"},
    "eas_wire": {"eas_wire"},
}


def project_imports_outside(tree: ast.AST, allowed: set[str], project: set[str]) -> list[tuple[int, str]]:
    """(line, module) of every import of a project package (``project``: top-level names) not in ``allowed``,
    at module level or inside a function."""
    return sorted({(line, name) for name, line, _in_function in module_imports(tree)
                   if name.split(".")[0] in project - allowed})


def test_the_agent_and_the_edge_import_each_other_only_through_eas_wire():
    project = python_packages(REPO) - set(sys.stdlib_module_names)  # collections/: Ansible's, not an import name
    problems = []
    for package, allowed in DEPLOYABLE_IMPORTS.items():
        for path in sorted((REPO / package).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            problems += [f"{rel}:{line}: imports {name}" for line, name in
                         project_imports_outside(ast.parse(path.read_text(), rel), allowed, project)]
    assert problems == []


@pytest.mark.parametrize(("source", "expected"), [
    ("from eas_agent.scorebody import ScoreBody\n", [(1, "eas_agent.scorebody")]),
    ("def f():\n    import eas_agent.http\n", [(2, "eas_agent.http")]),
    ("from eas_agent import config\n", [(1, "eas_agent")]),
    ("from eas_wire.scorebody import ScoreBody\nfrom consul_io import layout\nimport aiohttp\n", []),
    ("from edge.pool import pick\n", []),
])
def test_the_deployable_lint_sees_every_form_of_import(source, expected):
    project = {"eas_agent", "eas_wire", "edge", "consul_io", "cluster"}
    assert project_imports_outside(ast.parse(source), DEPLOYABLE_IMPORTS["edge"], project) == expected


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


def cli_imports(tree: ast.AST) -> list[tuple[str, int]]:
    """(name, line) of everything of ``cli`` an import reaches: ``import cli.x`` -> cli.x, ``from cli.x import
    y`` -> cli.x.y, at any depth."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if a.name.split(".")[0] == "cli"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "cli":
            found += [(f"{node.module}.{a.name}", node.lineno) for a in node.names]
    return sorted(found, key=lambda found: found[1])


def outside_the_views(tree: ast.AST) -> list[tuple[str, int]]:
    return [(name, line) for name, line in cli_imports(tree)
            if name != DEMO_MAY_IMPORT_FROM_CLI and not name.startswith(DEMO_MAY_IMPORT_FROM_CLI + ".")]


def upward_imports(rel: str, tree: ast.AST) -> list[str]:
    """Imports in ``rel`` (a path under the repository) of a package on a floor above its own."""
    package = rel.split("/", 1)[0]
    found = []
    for name, line, in_function in module_imports(tree):
        top = name.split(".")[0]
        if top in NOT_PROJECT_IMPORTS or top not in FLOORS or FLOORS[top] <= FLOORS[package]:
            continue
        if in_function and LAZY_UPWARD.fullmatch(rel):
            continue
        found.append(f"{rel}:{line}: {package} (floor {FLOORS[package]}) imports {top} (floor {FLOORS[top]})"
                     + ("" if in_function else " at module level"))
    return found


def package_files(*packages: str) -> Iterator[tuple[str, ast.AST]]:
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            yield rel, ast.parse(path.read_text(), rel)


def test_every_python_package_has_a_floor():
    """A package added to the repository fails here until it is placed among the layers."""
    assert python_packages(REPO) - {"tests"} == set(FLOORS)


def test_no_package_imports_a_package_above_it():
    problems = []
    for rel, tree in package_files(*FLOORS):
        problems += upward_imports(rel, tree)
    assert problems == []


def test_the_simulators_never_import_the_cli_or_the_demo():
    """Not even inside a function: the simulators sit under the CLI, which runs them."""
    problems = [f"{rel}:{line}: imports {name}" for rel, tree in package_files("sim")
                for name, line, _ in module_imports(tree) if name.split(".")[0] in {"cli", "demo"}]
    assert problems == []


def test_the_demo_reaches_the_cli_only_through_its_views():
    trees = dict(package_files("demo"))
    problems = [f"{rel}:{line}: imports {name}" for rel, tree in trees.items() for name, line in outside_the_views(tree)]
    assert problems == []
    assert any(cli_imports(tree) for tree in trees.values())  # the demo draws with the views: the lint sees them


@pytest.mark.parametrize(("source", "expected"), [
    ("from cli.views.scores import rows, table\nfrom cli import views\n", []),
    ("def f():\n    import cli.views.scores\n", []),
    ("from common.errors import ClusterctlError\nimport click\n", []),
    ("from cli.errors import ClusterctlError\n", [("cli.errors.ClusterctlError", 1)]),
    ("import cli\n", [("cli", 1)]),
    ("def f():\n    from cli.commands import provision\n", [("cli.commands.provision", 2)]),
    ("from cli import app, views\n", [("cli.app", 1)]),
])
def test_the_demo_lint_sees_every_way_into_the_cli(source, expected):
    assert outside_the_views(ast.parse(source)) == expected


def test_production_never_spells_the_simulators_state_dir():
    """Not in code, comments or the roles' files: production keeps no record for the simulator."""
    files = [*production_files(), *(p for top in ("roles", "playbooks") for p in (REPO / top).rglob("*")
                                    if p.is_file() and p.suffix in {".yml", ".yaml", ".j2", ".py", ".md", ".cfg"})]
    problems = [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for p in sorted(set(files))
                for n, line in enumerate(p.read_text().splitlines(), 1) if SIM_STATE_DIR.search(line)]
    assert problems == []


@pytest.mark.parametrize(("rel", "source", "expected"), [
    ("sim/demo.py", "from cli.views.scores import rows\n", ["sim/demo.py:1: sim (floor 4) imports cli (floor 5) "
                                                            "at module level"]),
    ("sim/x.py", "def f():\n    import demo.scenario\n", ["sim/x.py:2: sim (floor 4) imports demo (floor 6)"]),
    ("cluster/x.py", "from preflight import runner\n", ["cluster/x.py:1: cluster (floor 2) imports preflight "
                                                         "(floor 3) at module level"]),
    ("common/x.py", "import collections\nfrom collections.abc import Iterable\n", []),
    ("cli/commands/demo.py", "def command():\n    from demo import scenario\n", []),
    ("cli/commands/demo.py", "from demo import scenario\n", ["cli/commands/demo.py:1: cli (floor 5) imports demo "
                                                              "(floor 6) at module level"]),
    ("cli/views/scores.py", "def f():\n    from demo import scenario\n",
     ["cli/views/scores.py:2: cli (floor 5) imports demo (floor 6)"]),
    ("demo/scenario.py", "from cli.views.scores import rows\nfrom sim.hosts import lifecycle\n", []),
])
def test_the_floor_lint_sees_every_way_up(rel, source, expected):
    assert upward_imports(rel, ast.parse(source)) == expected


@pytest.mark.parametrize(("line", "spelled"), [
    ('VIRTUAL_STATE_DIR = ".sim"', True),
    ("# under <inventory>/.sim/run-state.json", True),
    ('key: "{{ inventory_dir }}/.sim/ssh/id_ed25519"', True),
    ("from routesim.sim import Pool", False),
    ("return f'edge{index}.sim'", False),
    ("import sim.hosts  # .simulate is gone", False),
])
def test_the_state_dir_lint_sees_the_name_as_a_path_part(line, spelled):
    assert bool(SIM_STATE_DIR.search(line)) == spelled
