"""The stub tools run inside the simulated machines (``clusterctl-sim-tool``: systemctl, nvidia-smi, mokutil, ...)
with the machine's own python3, which has no pip packages, and only the ``sim`` and ``preflight`` packages
bound under /usr/local/lib/clusterctl-sim (sim/hosts/machines.py). An import of anything else anywhere in what
they import (``cluster``, a third-party package) fails every stub call on every machine, including the
``systemctl show`` that Ansible's systemd module reads, while every test on this side passes."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, module_imports

pytestmark = pytest.mark.unit

MACHINE_PACKAGES = ("sim", "preflight")
STUBS = REPO / "sim" / "hosts" / "stubs"


def module_file(name: str) -> Path | None:
    path = REPO.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def with_parents(name: str) -> list[str]:
    """Importing ``a.b.c`` runs ``a``, ``a.b`` and ``a.b.c``."""
    parts = name.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def foreign_imports(roots: list[str]) -> list[str]:
    """Every module-level import outside the standard library and the machine's packages, in the closure of
    ``roots``."""
    seen: set[str] = set()
    todo = [parent for root in roots for parent in with_parents(root)]
    problems = []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = module_file(name)
        if path is None:
            continue  # a name imported from a package (``from sim.hosts import limits``): its module is below
        for imported, line, in_function in module_imports(ast.parse(path.read_text(), str(path))):
            if in_function:  # run only when called: the controller-side helpers (hardware.resolve) import there
                continue
            top = imported.split(".")[0]
            if top in MACHINE_PACKAGES:
                todo.extend(with_parents(imported))
                todo.extend(f"{imported}.{alias}" for alias in _from_names(path, line, imported))
            elif top not in sys.stdlib_module_names and top != "__future__":
                problems.append(f"{path.relative_to(REPO)}:{line}: imports {imported}")
    return sorted(problems)


def _from_names(path: Path, line: int, module: str) -> list[str]:
    """The names of ``from module import a, b`` at ``line`` (submodules among them are followed)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.lineno == line and node.module == module:
            return [alias.name for alias in node.names]
    return []


def test_the_stub_tools_import_only_what_the_machines_have():
    roots = [f"sim.hosts.stubs.{path.stem}" for path in sorted(STUBS.glob("*.py")) if path.stem != "__init__"]
    assert foreign_imports(roots) == []


def test_the_walk_sees_a_foreign_import_two_modules_away():
    # sim.hosts.nvidia_module -> sim.hosts.state_dir -> cluster: the path that broke the machines' systemctl
    assert any("imports cluster" in p for p in foreign_imports(["sim.hosts.state_dir"]))
