"""The host_firewall role's sources: addresses and prefixes kept, host names resolved on the controller to
every address they have, a name that does not resolve an error naming it (never a rule nft resolves at boot)."""

from __future__ import annotations

import importlib.util
import socket

import pytest
from ansible.errors import AnsibleFilterError

from tests.helpers import REPO

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def plugin():
    spec = importlib.util.spec_from_file_location("firewall_sources", REPO / "playbooks/filter_plugins/firewall_sources.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NAMES = {"r01n01.mgmt.dc1.example": ["127.0.7.1"], "edge.dc1.example": ["127.0.7.9", "::1"]}


def resolver(name, port, family, kind):
    if name not in NAMES:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return [(socket.AF_INET6 if ":" in a else socket.AF_INET, kind, 6, "", (a, 0)) for a in NAMES[name]]


def test_addresses_and_prefixes_are_kept_and_names_resolved(plugin):
    sources = ["127.0.0.1", "::1", "127.0.7.1", "r01n01.mgmt.dc1.example", "edge.dc1.example", "127.0.6.0/24",
               "127.0.6.5/24"]
    assert plugin.firewall_addresses(sources, resolve=resolver) == [
        "127.0.0.1", "::1", "127.0.7.1", "127.0.7.9", "127.0.6.0/24"]


def test_a_name_that_does_not_resolve_is_an_error_naming_each(plugin):
    with pytest.raises(AnsibleFilterError) as info:
        plugin.firewall_addresses(["127.0.0.1", "gone.dc1.example", "also-gone.dc1.example"], resolve=resolver)
    assert "cannot resolve gone.dc1.example, also-gone.dc1.example" in str(info.value)
    with pytest.raises(AnsibleFilterError) as info:
        plugin.firewall_addresses(["not/an/address"], resolve=resolver)
    assert "'not/an/address'" in str(info.value)


def test_the_role_uses_the_filter():
    assert "| firewall_addresses" in (REPO / "roles/host_firewall/tasks/sources.yml").read_text()
