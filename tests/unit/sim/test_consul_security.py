"""`inventory validate` and `provision --plan` warn when an inventory weakens Consul's security (ACLs, default
deny, gossip encryption, TLS) or leaves a secret unset that a switch (on by default) needs; exit 0."""

import pytest

from sim import consul_security
from tests.helpers import run_cli, write_tree

pytestmark = pytest.mark.unit

HOSTS = """
all:
  children:
    rack_r1:
      hosts:
        n1: {ansible_host: 127.0.9.31}
        n2: {ansible_host: 127.0.9.32}
    consul_servers:
      hosts:
        n1:
      vars:
        consul_servers_running_ius: {n1: a test inventory of two nodes}
"""
SECURE = "gpu_model: h100-sxm\n" + consul_security.render()


def _inventory(tmp_path, all_vars: str) -> str:
    return str(write_tree(tmp_path, {"hosts.yml": HOSTS, "group_vars/all.yml": all_vars}))


def test_a_secure_inventory_has_no_warning(tmp_path, capsys):
    code, out, err = run_cli(capsys, "inventory", "validate", "-i", _inventory(tmp_path, SECURE))
    assert code == 0 and "warning" not in err and "OK (2 hosts)" in out


def test_each_switch_turned_off_is_a_warning_naming_variable_and_hosts(tmp_path, capsys):
    weak = SECURE + ("consul_agent_acl_enabled: false\nconsul_agent_gossip_encryption: false\n"
                     "consul_agent_tls_enabled: false\n")
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", _inventory(tmp_path, weak))
    assert code == 0
    assert "warning: consul_agent_acl_enabled=False: ACLs are off" in err
    assert "warning: consul_agent_gossip_encryption=False: gossip is unencrypted" in err
    assert "warning: consul_agent_tls_enabled=False: RPC is not TLS-protected" in err
    assert err.count("(hosts: n1, n2)") == 3


def test_default_policy_allow_is_a_warning(tmp_path, capsys):
    code, _, err = run_cli(capsys, "inventory", "validate", "-i",
                           _inventory(tmp_path, SECURE + "consul_agent_acl_default_policy: allow\n"))
    assert code == 0 and "consul_agent_acl_default_policy='allow': requests without a token may do everything" in err


def test_missing_secrets_are_named_and_the_plan_shows_them(tmp_path, capsys):
    inv = _inventory(tmp_path, "gpu_model: h100-sxm\n")
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", inv)
    assert code == 0
    for var in ("consul_agent_gossip_key", "consul_agent_acl_management_token", "consul_agent_acl_agent_token",
                "consul_agent_acl_registration_token", "consul_token", "consul_agent_tls_ca_pem"):
        assert f"warning: {var}: " in err, var
    assert "the consul_agent role will stop on this host" in err
    code, out, _ = run_cli(capsys, "provision", "-i", inv, "--plan")
    assert code == 0
    flat = " ".join(out.split())
    assert "warning: consul_agent_gossip_key:" in flat and "warning: consul_agent_tls_ca_pem:" in flat


def test_a_token_file_counts_as_the_operator_token(tmp_path, capsys):
    # The token rule (roles/consul_agent/README.md): consul_token OR consul_token_file, never both required.
    without = SECURE.replace("\nconsul_token: ", "\nsite_unused_token: ")
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", _inventory(tmp_path / "a", without))
    assert code == 0 and "warning: consul_token:" in err
    code, _, err = run_cli(capsys, "inventory", "validate", "-i",
                           _inventory(tmp_path / "b", without + "consul_token_file: /etc/clusterctl/consul.token\n"))
    assert code == 0 and "warning: consul_token:" not in err, err
