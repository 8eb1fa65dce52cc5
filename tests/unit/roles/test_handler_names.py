"""Handler names are global to a play: two roles with a handler of one name both run when either notifies it,
each with the other role's facts missing. Every role's handlers therefore have names of their own."""

from __future__ import annotations

from collections import defaultdict

import pytest
import yaml

from tests.helpers import REPO

pytestmark = pytest.mark.unit


def handler_names() -> dict[str, list[str]]:
    """handler name -> the roles that define it."""
    owners: dict[str, list[str]] = defaultdict(list)
    for path in sorted((REPO / "roles").glob("*/handlers/main.yml")):
        for handler in yaml.safe_load(path.read_text()) or []:
            owners[handler["name"]].append(path.parts[-3])
    return owners


def test_no_two_roles_define_a_handler_of_one_name():
    assert {name: roles for name, roles in handler_names().items() if len(roles) > 1} == {}


def test_the_names_are_read_from_every_role():
    owners = handler_names()
    assert "Reload the host firewall" in owners and "Restart inference units" in owners
