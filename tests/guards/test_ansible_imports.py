"""Only ``cluster/ansible/`` imports Ansible: the model, the typed settings, preflight, the agent, the edge
and the CLI work on plain values, so they load (and run on a GPU node) without ansible-core, and a change
in Ansible's internals has one place to land. ``ansible_runner`` (a separate program's driver) is not
Ansible's Python API and is not covered here.

The roles' own plugins (``playbooks/filter_plugins``, the ``clusterctl.infra`` collection) are Ansible
plugins, loaded by Ansible: they are outside these packages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import module_imports, python_packages

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("common", "cluster", "preflight", "provision", "consul_io", "eas_agent", "eas_wire", "edge", "cli", "devconsul",
            "sim", "demo", "operate",
            "bench")
ALLOWED = "cluster/ansible/"
# Ansible plugins (loaded by Ansible, so they import it) and the tests (which drive Ansible on purpose).
NOT_LINTED = {"playbooks", "collections", "tests"}


def ansible_imports(tree: ast.AST) -> list[int]:
    """Lines of every import of ``ansible`` or ``ansible.*``, at any depth (inside functions too)."""
    return sorted({line for name, line, _ in module_imports(tree) if name == "ansible" or name.startswith("ansible.")})


def test_only_cluster_ansible_imports_ansible():
    problems = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            if rel.startswith(ALLOWED):
                continue
            problems += [f"{rel}:{line}: imports ansible" for line in ansible_imports(ast.parse(path.read_text(), rel))]
    assert problems == []


def test_the_lint_covers_every_python_package():
    """A package added to the repository (or left out of PACKAGES) is linted or named here as not linted."""
    assert python_packages(REPO) == set(PACKAGES) | NOT_LINTED


def test_cluster_ansible_is_where_the_inventory_loader_lives():
    """The allowed package really holds the Ansible code (the lint would pass vacuously otherwise)."""
    found = [p for p in (REPO / ALLOWED).glob("*.py") if ansible_imports(ast.parse(p.read_text()))]
    assert {p.name for p in found} >= {"inventory.py", "vault.py"}


@pytest.mark.parametrize(("source", "expected"), [
    ("import ansible\n", [1]),
    ("from ansible.errors import AnsibleError\n", [1]),
    ("def f():\n    from ansible.template import Templar\n", [2]),
    ("import ansible_runner\nfrom ansiblelint import x\nfrom .ansible import vault\n", []),
])
def test_the_lint_sees_every_form_of_import(source, expected):
    assert ansible_imports(ast.parse(source)) == expected
