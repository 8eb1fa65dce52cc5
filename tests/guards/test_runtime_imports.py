"""What the installed packages import is what ``pip install .`` brings: `make demo` installs the runtime
dependencies only (docs/decisions/0016-demo-runtime-dependencies.md), so a module that imported a development
tool (pytest, matplotlib, ansible-lint...) would fail on a fresh machine's demo and nowhere else."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Imports of these are not the controller's: the module runs elsewhere.
ELSEWHERE = {"vllm": "sim/pypi/vllm_cli.py is the stand-in vllm wheel's entry point, run on a simulated node"}


def name_of(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_closure() -> set[str]:
    """The runtime dependencies and theirs (as installed here), normalized; requirements of extras or of other
    platforms and Pythons left out."""
    todo = [name_of(r) for r in PYPROJECT["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        name = normalized(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        for text in importlib.metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def installed_packages() -> list[Path]:
    patterns = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted({REPO / p.rstrip("*") for p in patterns if (REPO / p.rstrip("*")).is_dir()})


def _guarded(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside a ``try`` that catches ImportError: optional (uvloop, matplotlib), each
    with its own message when missing."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers):
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return guarded


def imported_names(path: Path) -> set[str]:
    """The top-level names ``path`` imports, optional imports (:func:`_guarded`) left out."""
    tree = ast.parse(path.read_text(), str(path))
    optional = _guarded(tree)
    names = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_installed_packages_import_only_runtime_dependencies():
    first_party = {p.name for p in REPO.iterdir() if (p / "__init__.py").exists() or p.suffix == ".py"}
    providers = importlib.metadata.packages_distributions()
    runtime = runtime_closure()
    outside = []
    for package in installed_packages():
        for path in package.rglob("*.py"):
            for name in sorted(imported_names(path) - set(sys.stdlib_module_names) - first_party - set(ELSEWHERE)):
                dists = {normalized(d) for d in providers.get(name, [name])}
                if not dists & runtime:
                    outside.append(f"{path.relative_to(REPO)}: import {name} ({', '.join(sorted(dists))})")
    assert outside == [], "imports a distribution `pip install .` does not bring:\n" + "\n".join(outside)


def test_the_dev_extra_holds_no_runtime_dependency_and_the_demo_installs_without_it():
    dev = {normalized(name_of(r)) for r in PYPROJECT["project"]["optional-dependencies"]["dev"]}
    assert dev.isdisjoint(normalized(name_of(r)) for r in PYPROJECT["project"]["dependencies"])
    makefile = (REPO / "Makefile").read_text()
    demo = re.search(r"^demo: (.*)$", makefile, re.M).group(1).split()
    assert "$(RUNTIME_STAMP)" in demo and "$(STAMP)" not in demo
    assert "$(call pip_install,.,clusterctl)" in makefile
