"""The consul_agent role's consul.hcl, rendered by Ansible from the provisioning tests' virtual inventory as the
role renders it: it is the golden the machine test compares the servers' file with, and no server's file holds
the management token (the cluster's ACLs are bootstrapped from the controller through the HTTP API, and
root on a GPU node that is a Consul server must not hold global management)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

from tests.helpers import GOLDEN, REPO
from tests.helpers.provision import create_inventory

pytestmark = pytest.mark.integration

# The secrets a fresh `virtual create` draws; the golden holds "<secret>" in their place
SECRETS = re.compile(r'^(\s*(?:encrypt|agent|config_file_service_registration)\s*=\s*)"[^"]*"', re.M)

PLAYBOOK = """\
- name: Render consul.hcl as the consul_agent role does
  hosts: consul_servers:r02n01
  gather_facts: false
  roles:
    - role: render_consul
"""


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> tuple[dict[str, str], str]:
    """(host -> its consul.hcl, the inventory's management token) for a server and a client."""
    work = tmp_path_factory.mktemp("consul-hcl")
    create_inventory(work / "inventory")
    role = work / "roles" / "render_consul"
    (role / "tasks").mkdir(parents=True)
    (role / "defaults").symlink_to(REPO / "roles/consul_agent/defaults")
    (role / "tasks/main.yml").write_text(
        "- name: The role's consul.hcl\n  ansible.builtin.template:\n"
        f"    src: {REPO}/roles/consul_agent/templates/consul.hcl.j2\n"
        f"    dest: {work}/{{{{ inventory_hostname }}}}.hcl\n    mode: '0600'\n"
        "  vars:\n    ansible_managed: Ansible managed\n")
    (work / "play.yml").write_text(PLAYBOOK)
    extra = json.dumps({"ansible_connection": "local", "ansible_python_interpreter": sys.executable})
    playbook = REPO / ".venv/bin/ansible-playbook"
    done = subprocess.run([str(playbook) if playbook.exists() else "ansible-playbook", "-i", str(work / "inventory"),
                           str(work / "play.yml"), "-e", extra], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "ANSIBLE_ROLES_PATH": str(work / "roles")})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    values = yaml.safe_load((work / "inventory/group_vars/all.yml").read_text())
    return ({path.stem: path.read_text() for path in work.glob("*.hcl")},
            str(values["consul_agent_acl_management_token"]))


def test_a_servers_consul_hcl_is_the_golden(rendered):
    files, _ = rendered
    assert SECRETS.sub(r'\1"<secret>"', files["r01n01"]) == (GOLDEN / "consul.hcl").read_text()


def test_no_consul_hcl_holds_the_management_token(rendered):
    files, management = rendered
    assert set(files) == {"r01n01", "r02n01"} and "server     = true" in files["r01n01"]
    for host, text in files.items():
        assert management not in text and "initial_management" not in text, host
