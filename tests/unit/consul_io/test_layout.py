"""consul_io/layout.py is the only place the client side spells Consul's names; the roles' files agree with it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from consul_io import layout

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[3]
# Client-side code: it names Consul things only through consul_io.layout (devconsul is the server side and
# keeps Consul's own names; tests build fixtures by hand on purpose).
CLIENT_PACKAGES = ("consul_io", "eas_agent", "eas_wire", "edge", "preflight", "cli", "cluster", "provision", "bench", "sim",
                   "demo",
                   "playbooks", "collections")
# Literal spellings that must not appear in client code outside layout.py.
SPELLINGS = {
    "service name": re.compile(r"""["']vllm-iu["']"""),
    "maintenance prefix": re.compile(r"""["']_service_maintenance"""),
    "score KV prefix": re.compile(r"""["']clusterctl/eas"""),
    "preflight KV prefix": re.compile(r"""["']clusterctl/preflight"""),
    "rollout KV prefix": re.compile(r"""["']clusterctl/rollout"""),
    "IU id format": re.compile(r"""-iu\{"""),
    "ACL policy name": re.compile(r"""["'](vllm-iu-registration|clusterctl-operator|clusterctl-edge)["']"""
                                  r"""|f["'](consul-agent|eas-agent)-\{"""),
    "default datacenter": re.compile(r"""["']dc1["']"""),
    "default agent address": re.compile(r"""["']127\.0\.0\.1:8500["']"""),
    "IU service tag": re.compile(r"""f?["'](rack|node):(\{|["'])"""),
    "IU health check id": re.compile(r""":health["']"""),
}
# The same names in the roles' and playbooks' YAML and templates (full-line comments are prose, not names):
# they get them from the filters (consul_marker_key, consul_maintenance, cluster_node's consul block).
YAML_SPELLINGS = {
    "service name": re.compile(r"""["']vllm-iu["']"""),
    "maintenance prefix": re.compile(r"_service_maintenance"),
    "score KV prefix": re.compile(r"clusterctl/eas"),
    "preflight KV prefix": re.compile(r"clusterctl/preflight"),
    "default datacenter": re.compile(r"\bdc1\b"),
    "default agent address": re.compile(r"127\.0\.0\.1:8500"),
    "IU service tag": re.compile(r"\b(rack|node):\{\{"),
    "IU health check id": re.compile(r":health\b"),
    # a Consul API URL whose scheme is written by hand: consul_scheme would not reach it
    "Consul URL scheme": re.compile(r"https?://[^\n]*?/v1/(agent|kv|health|catalog|acl|status|operator)/"),
    # the node's Consul settings read raw, with a default of the role's own, instead of cluster_node's consul
    "raw Consul setting": re.compile(r"\{\{[^}]*\bconsul_(http_addr|scheme|datacenter)\b"),
}


# Consul's own side, like devconsul: the stand-in `consul` program keeps the Consul CLI's default address (and
# runs inside the machines with only devconsul beside it).
SERVER_SIDE = {"sim/aptrepo/consul_standin.py"}


def client_files() -> list[Path]:
    return sorted(p for package in CLIENT_PACKAGES for p in (REPO / package).rglob("*.py")
                  if p != REPO / "consul_io" / "layout.py" and p.relative_to(REPO).as_posix() not in SERVER_SIDE)


def test_client_code_spells_consul_names_only_through_layout():
    problems = []
    for path in client_files():
        text = path.read_text()
        for what, pattern in SPELLINGS.items():
            for match in pattern.finditer(text):
                line = text.count("\n", 0, match.start()) + 1
                problems.append(f"{path.relative_to(REPO)}:{line}: the {what} spelled by hand")
    assert problems == []


def yaml_files() -> list[Path]:
    return sorted(p for top in ("roles", "playbooks") for p in (REPO / top).rglob("*")
                  if p.suffix in (".yml", ".yaml", ".j2") and p.is_file())


def hand_written_names(name: str, text: str) -> list[str]:
    problems = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.lstrip().startswith("#"):
            problems += [f"{name}:{number}: the {what} spelled by hand"
                         for what, pattern in YAML_SPELLINGS.items() if pattern.search(line)]
    return problems


def test_roles_and_playbooks_spell_consul_names_only_through_the_filters():
    files = yaml_files()
    assert files and [p for path in files for p in hand_written_names(str(path.relative_to(REPO)), path.read_text())] == []


@pytest.mark.parametrize(("line", "what"), [
    ("      | select('match', '^_service_maintenance:') | list }}", "maintenance prefix"),
    ("eas_agent_kv_prefix: clusterctl/eas", "score KV prefix"),
    ("x: \"{{ consul_datacenter | default('dc1') }}\"", "default datacenter"),
    ("x: \"{{ consul_http_addr | default('127.0.0.1:8500') }}\"", "default agent address"),
    ("    url: \"http://{{ consul_agent_http_addr }}/v1/agent/checks\"", "Consul URL scheme"),
    ("    url: \"http://{{ addr }}/v1/kv/{{ key }}?keys\"", "Consul URL scheme"),
    ("x: \"{{ consul_scheme }}://{{ a }}\"", "raw Consul setting"),
    ("tags: [\"rack:{{ rack }}\"]", "IU service tag"),
    ("id: \"vllm-iu:{{ iu }}:health\"", "IU health check id"),
])
def test_the_yaml_scan_sees_each_form(line, what):
    found = hand_written_names("x.yml", f"---\n# {line} (a comment: prose, not a name)\n{line}\n")
    assert f"x.yml:3: the {what} spelled by hand" in found and not any(p.startswith("x.yml:2:") for p in found)


def test_the_yaml_scan_lets_other_names_through():
    """Unit names (vllm-iu@N.service), Redfish's /redfish/v1/, vLLM's /health and a URL from the model."""
    text = ('name: "vllm-iu@{{ item.index }}.service"\n'
            'url: "https://{{ bmc }}/redfish/v1/Systems"\n'
            'url: "http://{{ node.address }}:{{ item.port }}/health"\n'
            'url: "{{ _rolling_restart_consul_url }}/v1/agent/checks"\n')
    assert hand_written_names("x.yml", text) == []


def test_only_the_client_imports_py_consul():
    importers = []
    for path in sorted(p for package in CLIENT_PACKAGES + ("devconsul",) for p in (REPO / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
            if any(n == "consul" or n.startswith("consul.") for n in names):
                importers.append(str(path.relative_to(REPO)))
    assert sorted(set(importers)) == ["consul_io/client.py"]  # the one module (it may import more than one name)


def test_the_roles_service_definition_agrees_with_layout():
    # the template renders what the consul_iu_services filter returns: cluster/services.py, from the model
    template = (REPO / "roles/consul_agent/templates/iu-service.json.j2").read_text()
    assert "consul_iu_services(" in template
    from cluster.model import build_node
    from cluster.services import iu_service_definitions

    node = build_node("r01n01", {"ansible_host": "127.0.1.11", "rack": "r01", "gpu_model": "h100-sxm"})
    definitions = iu_service_definitions(node, "10s", "2s")
    assert {d["service"]["name"] for d in definitions.values()} == {layout.iu_service("r01n01")} == {"vllm-iu-r01n01"}
    assert set(definitions) == {layout.iu_id("r01n01", 0), layout.iu_id("r01n01", 1)}
    tasks = (REPO / "roles/consul_agent/tasks/main.yml").read_text()
    assert layout.service_definition_file("{id}") in tasks
    assert layout.SERVICE_DEFINITION_GLOB in tasks


def test_key_and_id_formats():
    assert layout.iu_id("r01n01", 3) == "r01n01-iu3"
    assert layout.node_of_iu("r01n01-iu3") == "r01n01"
    assert layout.node_of_iu("a-iub-iu0") == "a-iub"
    assert layout.score_key("dc1", "r01n01") == "clusterctl/eas/dc1/r01n01"
    assert layout.score_key("dc2", "n", kv_prefix="/custom/") == "custom/dc2/n"
    assert layout.score_prefix("dc1") == "clusterctl/eas/dc1/"
    assert layout.marker_key("dc1", "r01n01-iu0") == "clusterctl/preflight/dc1/r01n01-iu0"
    assert layout.maintenance_check("n1-iu0") == "_service_maintenance:n1-iu0"
    assert layout.service_definition_file("n1-iu0") == "vllm-iu-n1-iu0.json"
    assert layout.acl_policy("agent", "n1") == "consul-agent-n1"
    assert layout.acl_policy("eas_agent", "n1") == "eas-agent-n1"
    assert layout.acl_policy("registration", "n1") == "vllm-iu-registration-n1"
    assert layout.iu_service("r01n01") == "vllm-iu-r01n01"
    assert layout.is_iu_service("vllm-iu-r01n01") and layout.is_iu_service("vllm-iu-a-b")
    assert not any(map(layout.is_iu_service, ("vllm-iu", "vllm-iu-", "vllm-iux", "ssh")))
    assert layout.health_check_id("n1-iu0") == "vllm-iu:n1-iu0:health"
    assert (layout.rack_tag("r01"), layout.node_tag("n1")) == ("rack:r01", "node:n1")
    assert (layout.tagged_node("node:n1"), layout.tagged_node("node:"), layout.tagged_node("rack:r01")) == (
        "n1", "", None)
    assert layout.maintained_service("_service_maintenance:n1-iu0") == "n1-iu0"
    assert layout.maintained_service("_node_maintenance") is None and layout.maintained_service("eas:n1-iu0") is None


@pytest.mark.parametrize(("check_id", "expected"), [
    ("_service_maintenance:n1-iu0", True), ("_node_maintenance", True), ("serfHealth", False),
    ("eas:n1-iu0", False), ("_node_maintenance:x", False), ("", False)])
def test_maintenance_checks(check_id, expected):
    assert layout.is_maintenance_check(check_id) is expected


@pytest.mark.parametrize(("iu", "node", "expected"), [
    ("n1-iu0", "n1", True), ("n1-iu12", "n1", True), ("n1-iu", "n1", False), ("n12-iu0", "n1", False),
    ("n1-iux", "n1", False), ("n1-iu0", "n1-iu0", False)])
def test_is_iu_of(iu, node, expected):
    assert layout.is_iu_of(iu, node) is expected
