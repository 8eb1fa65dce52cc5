"""Typed node settings: resolved (templated, vault values decrypted) once at load, checked with the layout,
and the only way production code reads host variables (the model's Node has no raw ``vars``)."""

from __future__ import annotations

import pytest

from cluster import load_cluster
from cluster.ansible import vault
from cluster.model import Node, build_node
from cluster.settings import node_settings
from tests.cluster.helpers import inline, password_file
from tests.helpers import run_cli, write_tree

HOSTS = """
all:
  children:
    rack_r1:
      hosts:
        n1: {ansible_host: 127.0.9.1}
"""


def test_settings_are_templated_and_typed_at_load(tmp_path):
    inventory = write_tree(tmp_path / "inventory", {"hosts.yml": HOSTS, "group_vars/all.yml": """
        gpu_model: h100-sxm
        ansible_port: "22{{ 22 }}"
        ansible_ssh_common_args: -o UserKnownHostsFile={{ inventory_dir }}/kh -o StrictHostKeyChecking=yes
        consul_http_addr: "{{ ansible_host }}:8501"
        consul_scheme: https
        consul_datacenter: lab
        eas_agent_listen: "{{ ansible_host }}:9105"
        roce_gid_index: 1
        preflight_version_pins: {cuda: "12.4"}
        nvidia_stack_driver_version: "550.{{ 127 }}.08"
    """})
    settings = load_cluster(inventory).node("n1").settings
    assert settings.connection.port == 2222 and settings.connection.kind == "ssh"
    assert settings.connection.ssh_common_args == (
        "-o", f"UserKnownHostsFile={inventory}/kh", "-o", "StrictHostKeyChecking=yes")
    assert (settings.consul.address, settings.consul.datacenter) == ("127.0.9.1:8501", "lab")
    assert settings.consul.url == "https://127.0.9.1:8501"
    assert settings.agent.listen == "127.0.9.1:9105"
    assert settings.preflight.roce_gid_index == 1 and settings.preflight.profile == "h100-sxm"
    assert settings.version_pins == {"driver": "550.127.08", "cuda": "12.4", "fabric_manager": "550.127.08"}


def test_defaults_come_from_the_spec_when_nothing_is_set():
    settings = build_node("n1", {"gpu_model": "a100-sxm", "rack": "r1"}).settings
    assert (settings.consul.http_addr, settings.consul.address, settings.consul.datacenter) == (
        None, "127.0.0.1:8500", "dc1")  # None: `clusterctl scores` can tell "not set" from the default
    assert settings.preflight.roce_gid_index == 3 and settings.preflight.profile == "a100-sxm"
    assert settings.connection.port is None and settings.connection.key_file is None
    assert not hasattr(build_node("n1", {"gpu_model": "a100-sxm", "rack": "r1"}), "vars")


def test_vault_values_decrypt_at_load_and_the_secrets_do_not_outlive_it(tmp_path):
    from ansible.parsing.vault import VaultSecretsContext

    inventory = write_tree(tmp_path / "inventory", {"hosts.yml": HOSTS, "group_vars/all.yml": "gpu_model: h100-sxm\n"})
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "n1.yml").write_text(inline("ansible_user", "operator") + inline("bmc_password", "x"))
    node = load_cluster(inventory, vault_secrets=vault.load_vault_secrets(password_file(tmp_path))).node("n1")
    assert node.settings.connection.user == "operator" and type(node.settings.connection.user) is str
    assert VaultSecretsContext.current().secrets == []  # nothing later decrypts with this load's password
    # A later load without the password neither changes the first node nor can decrypt its values.
    with pytest.raises(Exception, match="no vault password was given"):
        load_cluster(inventory)
    assert node.settings.connection.user == "operator"


def test_a_key_file_falls_back_to_ansible_private_key_file():
    assert node_settings({"ansible_private_key_file": "~/.ssh/k"}).connection.key_file == "~/.ssh/k"
    both = {"ansible_private_key_file": "~/.ssh/k", "ansible_ssh_private_key_file": "/keys/n1"}
    assert node_settings(both).connection.key_file == "/keys/n1"


@pytest.mark.parametrize(("line", "expected"), [
    ("ansible_port: ssh", "n1: ansible_port='ssh': not a TCP port number"),
    ("consul_scheme: ftp", "n1: consul_scheme='ftp': must be http or https"),
    ("roce_gid_index: -1", "n1: roce_gid_index=-1: must be a GID table index (an integer >= 0)"),
    ("consul_datacenter: ''", "n1: consul_datacenter='': must be a non-empty string"),
    ("preflight_version_pins: [550]", "n1: preflight_version_pins=[550]: must be a mapping"),
    ("preflight_version_pins: {drivr: '550'}",
     "n1: preflight_version_pins.drivr='550': unknown component; expected one of driver, cuda, fabric_manager, nccl, ofed"),
    ("ansible_ssh_extra_args: \"-o 'ProxyJump=a\"",
     "n1: ansible_ssh_extra_args=\"-o 'ProxyJump=a\": not shell words: No closing quotation"),
    # the scheme is consul_scheme's: a scheme in the address was dropped, and the token went out over http
    ("consul_http_addr: https://127.0.9.1:8501", "n1: consul_http_addr='https://127.0.9.1:8501': HOST:PORT without "
     "a scheme: write the scheme as consul_scheme (consul_scheme: https), not in the address"),
    ("consul_http_addr: http://127.0.9.1:8500", "n1: consul_http_addr='http://127.0.9.1:8500': HOST:PORT without "
     "a scheme: write the scheme as consul_scheme (consul_scheme: https), not in the address"),
    ("consul_http_addr: 127.0.9.1", "n1: consul_http_addr='127.0.9.1': expected HOST:PORT (the Consul agent's HTTP "
     "API, e.g. 127.0.0.1:8500)"),
    ("cpu_cstates_extra_kernel_args: ['$(reboot)']", "n1: cpu_cstates_extra_kernel_args[0]='$(reboot)': not a kernel "
     "argument: one word of letters, digits and _ . , = : / + - (no spaces, quotes, '$' or newlines: update-grub "
     "sources it as shell)"),
])
def test_a_bad_setting_is_one_line_naming_host_variable_value(tmp_path, capsys, line, expected):
    inventory = write_tree(tmp_path / "inventory", {"hosts.yml": HOSTS, "group_vars/all.yml": f"gpu_model: h100-sxm\n{line}\n"})
    code, out, err = run_cli(capsys, "inventory", "validate", "-i", str(inventory))
    assert code == 2 and out == ""
    assert err.splitlines()[0] == f"{inventory}: {expected} (group_vars/all.yml:2)", err  # the file setting it


@pytest.mark.parametrize(("variables", "url"), [
    ({}, "http://127.0.0.1:8500"),
    ({"consul_http_addr": "127.0.9.1:8501", "consul_scheme": "https"}, "https://127.0.9.1:8501"),
    ({"consul_http_addr": "127.0.9.1:8500"}, "http://127.0.9.1:8500")])
def test_the_consul_settings_are_the_one_reading_of_address_and_scheme(variables, url):
    consul = node_settings(variables).consul
    assert consul.url == url and f"{consul.scheme}://{consul.address}" == url


def test_a_scheme_inside_the_address_is_refused_even_without_validation():
    """A node built without the rules (a transport test, a hand-built node) cannot carry one either: it was
    dropped, and preflight sent the operator token over http to an address written as https."""
    from cluster.spec import SpecError

    with pytest.raises(SpecError, match=r"^-: consul_http_addr='https://127.0.9.1:8501': HOST:PORT without a scheme"):
        node_settings({"consul_http_addr": "https://127.0.9.1:8501"})


def test_a_node_built_by_hand_carries_settings():
    node = Node("n1", "127.0.0.1", "r1", "h100-sxm", 8, 4, (0,) * 8, (), (),
                node_settings({"ansible_connection": "local"}))
    assert node.settings.connection.kind == "local"
