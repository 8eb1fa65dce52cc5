"""``ansible_managed`` exists only while a template file is rendered: a task argument that names it fails
on the host ("'ansible_managed' is undefined"), so managed headers live in the roles' templates/."""

from __future__ import annotations

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.unit


def tasks_naming_ansible_managed() -> list[str]:
    return [f"{path.relative_to(REPO)}:{n}" for path in sorted((REPO / "roles").glob("*/tasks/*.yml"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if "ansible_managed" in line]


def test_no_task_argument_names_ansible_managed():
    assert tasks_naming_ansible_managed() == []


def test_the_templates_carry_the_managed_header():
    assert "ansible_managed" in (REPO / "roles/eas_agent/templates/edge-keys.pub.j2").read_text()
