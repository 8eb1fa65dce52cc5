"""docs/contracts/client-access.md says what each credential and network rule allows; every row names the
tests that exercise its claims. Here: every row names one, each named test exists, and the config fields
and commands the page names are the edge's own."""

from __future__ import annotations

import re

import pytest

from edge.access_config import ACCESS_FIELDS
from tests.helpers import REPO

pytestmark = pytest.mark.unit

PAGE = REPO / "docs" / "contracts" / "client-access.md"


def rows() -> list[str]:
    return [line for line in PAGE.read_text().splitlines()
            if line.startswith("| ") and not line.startswith(("| credential", "| rule", "|---"))]


def named_tests(row: str) -> list[tuple[str, str]]:
    """(file, function) for each `path::name` and each `::name` that continues the last path."""
    named, path = [], None
    for ref in re.findall(r"`([^`]*::test_\w+)`", row):
        head, _, name = ref.partition("::")
        path = head or path
        named.append((path, name))
    return named


def test_every_claim_names_a_test_that_exists():
    assert len(rows()) >= 7
    for row in rows():
        named = named_tests(row)
        assert named, f"a claim without a test: {row[:80]}"
        for path, name in named:
            source = (REPO / path).read_text()
            assert re.search(rf"^def {name}\(", source, re.M), f"{path}::{name} does not exist"


def test_the_fields_and_commands_the_page_names_are_the_edge_s():
    text = PAGE.read_text()
    for field in ("auth.keys_file", "upstream_api_key_file", "admin_listen", "tls.key_file", "tls.cert_file"):
        assert field in text and field.split(".")[0] in ACCESS_FIELDS
    assert "python -m edge.auth new TENANT" in text and "def main(" in (REPO / "edge/auth.py").read_text()
    assert "inference_unit_api_key" in (REPO / "roles/inference_unit/defaults/main.yml").read_text()
    for variable in ("host_firewall_edges", "host_firewall_controllers"):
        assert variable in text and variable in (REPO / "roles/host_firewall/defaults/main.yml").read_text()


def test_the_readme_s_security_section_points_here():
    readme = (REPO / "README.md").read_text()
    section = readme.split("### Security: who reaches the edge and the GPUs", 1)[1].split("\n#", 1)[0]
    assert "docs/contracts/client-access.md" in section
