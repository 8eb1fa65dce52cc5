"""inventory/sample/ (documentation, never provisioned): `inventory validate` accepts it with no warning,
it models 2 racks x 4 nodes and 3 dedicated Consul servers, its vault values are placeholders, and it names
no address to contact."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest
import yaml

from cluster.ansible import inventory as inv
from cluster.ansible import vault

pytestmark = pytest.mark.unit

SAMPLE = Path(__file__).resolve().parents[3] / "inventory" / "sample"
SAMPLE_VAULT_PASSWORD = "clusterctl-sample"  # inventory/sample/README.md says so; it guards placeholders only


@pytest.fixture
def vault_password_file(tmp_path):
    path = tmp_path / "vault-pass"
    path.write_text(SAMPLE_VAULT_PASSWORD + "\n")
    path.chmod(0o600)
    return path


def test_inventory_validate_accepts_the_sample_without_a_vault_password(clusterctl, monkeypatch):
    """No problem and no Consul security warning (every secret is set); the placeholders inside the vault
    values cannot be seen without the password, and the note says so."""
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    code, out, err = clusterctl("inventory", "validate", "-i", str(SAMPLE))
    assert code == 0
    assert err == (f"{SAMPLE}: note: 35 vault-encrypted values not checked for placeholders (no vault password: "
                   "pass --vault-password-file to check them)\n")
    assert out.splitlines() == [f"{SAMPLE}: Consul servers: consul01, consul02, consul03 (dedicated)",
                                f"{SAMPLE}: OK (11 hosts)"]


def test_validate_and_plan_refuse_the_sample_placeholders_naming_files_never_values(
        clusterctl, monkeypatch, vault_password_file):
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    for command in (("inventory", "validate"), ("provision", "--plan")):
        code, out, err = clusterctl(*command, "-i", str(SAMPLE), "--vault-password-file", str(vault_password_file))
        assert code == 2 and "REPLACE-ME: " not in err.replace("(REPLACE-ME: ...)", ""), err
        assert ("group_vars/all/vault.yml: consul_agent_gossip_key, consul_agent_acl_management_token, "
                "consul_token, consul_edge_token, consul_agent_tls_ca_pem, "
                "bmc_password, inference_unit_api_key: still placeholders (REPLACE-ME: ...)") in err, err
        assert ("host_vars/r01n01.yml, host_vars/r01n02.yml, host_vars/r01n03.yml, ... (+5) (8 files): "
                "consul_agent_acl_agent_token, consul_agent_acl_registration_token, eas_agent_consul_token: "
                "still placeholders") in err, err
        assert "plan:" not in out


def test_every_variable_of_the_sample_and_the_virtual_inventory_is_known():
    from cluster import variables

    for inventory in (SAMPLE, SAMPLE.parent / "virtual"):
        loaded = inv.load_inventory(str(inventory))
        unknown = sorted({name for hv in loaded.everyone.values() for name in hv} - set(variables.known()))
        assert unknown == [], f"{inventory}: {unknown}"
        assert inv.problems_of(loaded) == []


def test_plan_without_the_vault_password_is_one_line(clusterctl, monkeypatch):
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    code, out, err = clusterctl("provision", "-i", str(SAMPLE), "--plan")
    assert code == 2 and out == ""
    assert err.splitlines() == [
        f"error: {SAMPLE}: 35 values in 13 files (first: consul_agent_gossip_key (group_vars/all/vault.yml:6, "
        "hosts: r01n01, r01n02, r01n03 and 8 more)): vault-encrypted, and no vault password was given "
        "(--vault-password-file or ANSIBLE_VAULT_PASSWORD_FILE)"]


def test_plan_with_a_wrong_vault_password_is_one_line(clusterctl, monkeypatch, tmp_path):
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    wrong = tmp_path / "wrong-pass"
    wrong.write_text("not-the-sample-password\n")
    wrong.chmod(0o600)
    code, _, err = clusterctl("provision", "-i", str(SAMPLE), "--plan", "--vault-password-file", str(wrong))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {SAMPLE}: 35 values in 13 files (first: consul_agent_gossip_key") and \
        "cannot decrypt: Decryption failed" in err


def test_the_sample_models_two_racks_of_four_nodes_and_three_dedicated_consul_servers(vault_password_file):
    cluster = inv.load_cluster(str(SAMPLE), None, vault.secrets_for(vault_password_file))
    assert [(r.name, [n.name for n in r.nodes]) for r in cluster.racks] == [
        ("r01", ["r01n01", "r01n02", "r01n03", "r01n04"]), ("r02", ["r02n01", "r02n02", "r02n03", "r02n04"])]
    assert [(s.name, s.dedicated) for s in cluster.consul_servers] == [
        ("consul01", True), ("consul02", True), ("consul03", True)]
    node = cluster.racks[0].nodes[0]
    assert [iu.nics for iu in node.ius] == [("mlx5_0", "mlx5_1"), ("mlx5_2", "mlx5_3")]


def vault_values():
    """(file, variable, ciphertext) of every ``!vault`` value under inventory/sample."""

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!vault", lambda loader, node: ("VAULT", loader.construct_scalar(node)))
    found = []
    for path in sorted(SAMPLE.rglob("*.yml")):
        for key, value in (yaml.load(path.read_text(), Loader) or {}).items():
            if isinstance(value, tuple) and value[0] == "VAULT":
                found.append((path.relative_to(SAMPLE), key, value[1]))
    return found


def test_every_secret_is_a_vault_placeholder(vault_password_file):
    from ansible.parsing.vault import VaultLib

    lib = VaultLib(vault.secrets_for(vault_password_file))
    values = vault_values()
    assert len(values) >= 8 + 2 * 8  # the cluster's secrets, and per node its Consul agent and eas-agent tokens
    for path, key, ciphertext in values:
        plain = lib.decrypt(ciphertext).decode()
        assert plain.startswith("REPLACE-ME: "), f"{path}: {key} is not a placeholder"


def test_each_node_has_its_own_consul_agent_and_eas_agent_tokens(vault_password_file):
    from ansible.parsing.vault import VaultLib

    lib = VaultLib(vault.secrets_for(vault_password_file))
    per_node = {(str(path.parent), key): [] for path, key, _ in vault_values()}
    for path, key, ciphertext in vault_values():
        per_node[(str(path.parent), key)].append((path.stem, lib.decrypt(ciphertext).decode()))
    for key, hosts in (("consul_agent_acl_agent_token", 11), ("eas_agent_consul_token", 8)):
        owners = per_node[("host_vars", key)]
        assert len(owners) == hosts and all(node in plain for node, plain in owners), owners
        assert ("group_vars/all", key) not in per_node  # a group value would be one token for every node


def test_the_sample_names_no_address_that_could_be_contacted():
    text = "\n".join(p.read_text() for p in SAMPLE.rglob("*") if p.is_file())
    for candidate in re.findall(r"\b\d{1,3}(?:\.\d{1,3}){3}\b", text):
        assert ipaddress.ip_address(candidate).is_loopback, candidate
    hosts = re.findall(r"\b[a-z0-9-]+(?:\.[a-z0-9-]+)*\.([a-z]+)\b", text)
    assert "example" in hosts and not {"com", "net", "org", "io"} & set(hosts)


def test_scores_without_the_vault_password_says_so_in_the_plans_words(clusterctl, monkeypatch):
    """The operator token is sealed: one line, worded as provision's (no Consul is contacted)."""
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    code, out, err = clusterctl("scores", "-i", str(SAMPLE))
    assert (code, out) == (2, "")
    assert err == (f"error: {SAMPLE}: consul_token: vault-encrypted, and no vault password was given "
                   "(--vault-password-file or ANSIBLE_VAULT_PASSWORD_FILE)\n")
