"""The eas_edge and edge_balancer roles' files, rendered by Ansible from the provisioning tests' virtual inventory
as the roles render them: they are the goldens, the edge reads its config without a complaint, HAProxy accepts
its configuration (``haproxy -c``, as the role's ``validate`` runs it), and a bad edges or balancers group stops
the play with host, variable and value."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from edge.auth import hash_key, read_keys_file
from edge.config import load_edge_config
from tests.helpers import GOLDEN, REPO, haproxy
from tests.helpers.provision import create_inventory

pytestmark = pytest.mark.integration

EDGE_TEMPLATES = REPO / "roles/eas_edge/templates"
BALANCER_TEMPLATES = REPO / "roles/edge_balancer/templates"
# rendered file -> (template, golden)
FILES = {
    "edge.yml": (EDGE_TEMPLATES / "edge.yml.j2", "eas-edge-config-r01n01.yml"),
    "eas-edge.service": (EDGE_TEMPLATES / "eas-edge.service.j2", "eas-edge.service"),
    "eas-edge.json": (EDGE_TEMPLATES / "edge-service.json.j2", "consul-eas-edge-r01n01.json"),
    "haproxy.cfg": (BALANCER_TEMPLATES / "haproxy.cfg.j2", "haproxy.cfg"),
}
PLAYBOOK = """\
- name: Render the edge's and the balancer's files as the roles do
  hosts: r01n01
  gather_facts: false
  tasks:
    - name: The edge as the model reads it
      ansible.builtin.include_role: {{name: eas_edge, tasks_from: facts, public: true}}
    - name: The balancer and its edges as the model reads them
      ansible.builtin.include_role: {{name: edge_balancer, tasks_from: facts, public: true}}
    - name: The roles' templates
      ansible.builtin.template:
        src: "{{{{ item.value }}}}"
        dest: "{work}/{{{{ item.key }}}}"
        mode: "0644"
      loop: "{{{{ templates | dict2items }}}}"
      vars:
        ansible_managed: Ansible managed
        templates: {files}
"""


def render(work, host_vars: str = "", files: dict = FILES) -> subprocess.CompletedProcess:
    create_inventory(work / "inventory")
    if host_vars:
        (work / "inventory/host_vars").mkdir(exist_ok=True)
        (work / "inventory/host_vars/r01n01.yml").write_text(host_vars)
    templates = json.dumps({name: str(template) for name, (template, _) in files.items()})
    (work / "play.yml").write_text(PLAYBOOK.format(work=work, files=templates))
    extra = json.dumps({"ansible_connection": "local", "ansible_python_interpreter": sys.executable})
    playbook = REPO / ".venv/bin/ansible-playbook"
    return subprocess.run([str(playbook) if playbook.exists() else "ansible-playbook", "-i", str(work / "inventory"),
                           str(work / "play.yml"), "-e", extra], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    work = tmp_path_factory.mktemp("edge-roles")
    done = render(work)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return work


@pytest.mark.parametrize("name", sorted(FILES))
def test_the_virtual_inventory_s_files_are_the_goldens(rendered, name):
    assert (rendered / name).read_text() == (GOLDEN / FILES[name][1]).read_text()


def test_the_edge_reads_its_rendered_config(rendered):
    config = load_edge_config(rendered / "edge.yml")
    assert config.listen == "127.0.1.11:8080" and config.access.admin_listen == "127.0.1.11:9180"
    assert config.consul.address == "127.0.1.11:8500" and config.consul.token_file == "/etc/eas-edge/consul.token"
    assert config.announce.key_file == "/etc/eas-edge/announce.key"
    assert config.access.upstream_api_key_file == "/etc/eas-edge/iu-api-key"
    assert config.drain_timeout_s == 30.0 and config.max_connections == 4096


def test_the_balancer_sends_to_both_edges_and_checks_their_healthz(rendered):
    text = (rendered / "haproxy.cfg").read_text()
    assert "bind 127.0.1.5:8080" in text and "option httpchk GET /healthz" in text
    assert "server r01n01 127.0.1.11:8080" in text and "server r02n01 127.0.2.11:8080" in text
    service = json.loads((rendered / "eas-edge.json").read_text())["service"]
    assert service["checks"][0]["http"] == "http://127.0.1.11:8080/healthz"


def test_haproxy_accepts_the_configuration_and_refuses_a_broken_one(rendered, tmp_path):
    binary = haproxy.binary()
    checked = subprocess.run([binary, "-c", "-f", str(rendered / "haproxy.cfg")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    broken = tmp_path / "haproxy.cfg"
    broken.write_text((rendered / "haproxy.cfg").read_text().replace("balance leastconn", "balance leastconnections"))
    refused = subprocess.run([binary, "-c", "-f", str(broken)], capture_output=True, text=True)
    assert refused.returncode != 0 and "balance only supports" in refused.stdout + refused.stderr


@pytest.mark.parametrize(("host_vars", "expected"), [
    ("eas_edge_listen: 127.0.1.11:8000\n",
     "r01n01: eas_edge_listen='127.0.1.11:8000': port 8000 is an IU's vLLM's on this node"),
    ("edge_balancer_listen: 127.0.2.11:8080\n",
     "r01n01: edge_balancer_listen='127.0.2.11:8080': 127.0.2.11 is the address of host r02n01"),
])
def test_a_bad_group_input_stops_the_play_naming_host_variable_value(tmp_path, host_vars, expected):
    done = render(tmp_path, host_vars)
    assert done.returncode != 0 and expected in done.stdout + done.stderr, done.stdout[-2000:]


def test_the_rendered_config_is_yaml_with_no_secret_in_it(rendered):
    config = yaml.safe_load((rendered / "edge.yml").read_text())
    inventory = yaml.safe_load((rendered / "inventory/group_vars/all.yml").read_text())
    text = (rendered / "edge.yml").read_text()
    for secret in ("consul_edge_token", "eas_edge_announce_private_key", "inference_unit_api_key"):
        assert str(inventory[secret]) not in text
    assert config["auth"] is None  # the virtual edges listen on loopback: no client keys needed there


def test_client_keys_reach_the_edge_as_their_hashes_only(tmp_path):
    keys = {"demo": "sk-eas-" + "a" * 43, "team-b.2": "sk-eas-" + "b" * 43}
    host_vars = yaml.safe_dump({"eas_edge_client_keys": [{"tenant": t, "key": k} for t, k in keys.items()],
                                "eas_edge_debug_headers": True})
    done = render(tmp_path, host_vars, {**FILES, "api-keys": (EDGE_TEMPLATES / "api-keys.j2", None)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = (tmp_path / "api-keys").read_text()
    assert text == (GOLDEN / "eas-edge-api-keys").read_text()
    assert not any(key in text for key in keys.values())
    (tmp_path / "api-keys").chmod(0o600)  # as the role writes it
    table = read_keys_file(tmp_path / "api-keys")  # the edge's own reader, as it starts
    assert sorted(table.entries) == sorted((t, bytes.fromhex(hash_key(k).split(":")[1])) for t, k in keys.items())
    config = load_edge_config(tmp_path / "edge.yml")
    assert config.debug_headers is True

