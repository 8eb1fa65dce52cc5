"""Vault-encrypted inventory content: decrypted with --vault-password-file or what Ansible's configuration
names (ANSIBLE_VAULT_PASSWORD_FILE), else one clean line naming the file or value, exit 2.

Content is encrypted in-process with Ansible's VaultLib (no ansible-vault subprocess). In-process runs
see no ambient Ansible vault settings (``no_ambient_vault``); ANSIBLE_* variables are only ever set in
the environment of a child ``clusterctl``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cluster import InventoryError, load_cluster
from cluster.ansible import vault
from tests.cluster.helpers import HOSTS, PASSWORD, encrypt, inline, password_file
from tests.helpers import run_cli, write_tree

REPO = Path(__file__).resolve().parents[2]
@pytest.fixture
def vaulted(tmp_path) -> tuple[Path, Path]:
    """group_vars/all/vault.yml encrypted as a whole (gpu_model), plus an inline !vault BMC password."""
    inventory = write_tree(tmp_path / "inventory", {
        "hosts.yml": HOSTS,
        "group_vars/all/main.yml": "cpu_cstates_redfish: true\nbmc_address: 127.0.9.1\nbmc_username: admin\n",
    })
    (inventory / "group_vars" / "all" / "vault.yml").write_text(encrypt("gpu_model: h200-sxm\n"))
    with (inventory / "group_vars" / "all" / "main.yml").open("a") as f:
        f.write(inline("bmc_password", "bmc-secret"))
    return inventory, password_file(tmp_path)


def clusterctl(*args: str, **env: str) -> subprocess.CompletedProcess:
    """A child clusterctl with exactly the given ANSIBLE_* vault settings (none inherited)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_VAULT")}
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, env={**base, **env},
                          capture_output=True, text=True, timeout=120)


def _errors(err: str) -> list[str]:
    """stderr without the Consul security warnings (these inventories set no Consul secrets)."""
    return [line for line in err.splitlines() if ": warning: consul_" not in line]


def test_whole_file_vault_loads_with_the_option(vaulted, capsys):
    inventory, secret = vaulted
    code, out, err = run_cli(capsys, "inventory", "validate", "-i", str(inventory),
                             "--vault-password-file", str(secret))
    assert (code, _errors(err)) == (0, [])
    assert out.strip() == f"{inventory}: OK (2 hosts)"
    cluster = load_cluster(inventory, vault_secrets=vault.load_vault_secrets(secret))
    assert cluster.node("n1").gpu_model == "h200-sxm"  # from the file encrypted as a whole


def test_without_a_password_one_line_names_the_file(vaulted, capsys):
    inventory, _ = vaulted
    code, out, err = run_cli(capsys, "inventory", "validate", "-i", str(inventory))
    assert code == 2 and out == ""
    assert err == (
        f"error: {inventory}: {inventory / 'group_vars' / 'all' / 'vault.yml'}: vault-encrypted, and no vault "
        "password was given (--vault-password-file or ANSIBLE_VAULT_PASSWORD_FILE)\n"
    )


def test_a_wrong_password_names_the_file(vaulted, tmp_path, capsys):
    inventory, _ = vaulted
    (tmp_path / "wrong").mkdir()
    wrong = password_file(tmp_path / "wrong", "not-the-password")
    code, _, err = run_cli(capsys, "inventory", "show", "-i", str(inventory), "--vault-password-file", str(wrong))
    assert code == 2 and err.count("\n") == 1
    assert str(inventory / "group_vars" / "all" / "vault.yml") in err and "Decryption failed" in err


def test_an_inline_vault_model_variable_names_host_variable_and_line(tmp_path, capsys):
    inventory = write_tree(tmp_path / "inventory", {"hosts.yml": HOSTS, "group_vars/all.yml": "gpu_model: h100-sxm\n"})
    (inventory / "host_vars").mkdir()
    (inventory / "host_vars" / "n2.yml").write_text("gpu_count: 4\n" + inline("ansible_host", "127.0.77.99"))
    with pytest.raises(InventoryError) as error:
        load_cluster(inventory)
    assert str(error.value) == (
        f"{inventory}: n2: ansible_host: {inventory / 'host_vars' / 'n2.yml'}:2: vault-encrypted, and no vault "
        "password was given (--vault-password-file or ANSIBLE_VAULT_PASSWORD_FILE)"
    )
    assert error.value.exit_code == 2
    cluster = load_cluster(inventory, vault_secrets=vault.load_vault_secrets(password_file(tmp_path)))
    assert cluster.node("n2").address == "127.0.77.99"  # decrypted, as the model needs it


def test_a_template_using_a_vault_value_names_host_variable_and_line(tmp_path):
    inventory = write_tree(tmp_path / "inventory", {
        "hosts.yml": HOSTS,
        "group_vars/all.yml": 'gpu_model: h100-sxm\niu_port_base: "{{ base }}"\n' + inline("base", "9100"),
    })
    with pytest.raises(InventoryError, match=rf"^{re.escape(str(inventory))}: n1: iu_port_base: .*all\.yml:3: vault-encrypted, "):
        load_cluster(inventory)
    cluster = load_cluster(inventory, vault_secrets=vault.load_vault_secrets(password_file(tmp_path)))
    assert cluster.node("n1").ius[0].port == 9100


def test_an_inline_vault_bmc_password_is_present_without_being_decrypted(tmp_path, capsys):
    """Validation only checks that the BMC password is set: no password needed, no ReferenceError."""
    inventory = write_tree(tmp_path / "inventory", {
        "hosts.yml": HOSTS,
        "group_vars/all.yml": "gpu_model: h100-sxm\ncpu_cstates_redfish: true\nbmc_address: 127.0.9.1\n"
                              "bmc_username: admin\n" + inline("bmc_password", "bmc-secret"),
    })
    code, out, err = run_cli(capsys, "inventory", "validate", "-i", str(inventory))
    assert (code, _errors(err)) == (0, []) and "OK (2 hosts)" in out


def test_ansible_vault_password_file_is_honoured(vaulted):
    inventory, secret = vaulted
    result = clusterctl("inventory", "show", "-i", str(inventory), "--json", ANSIBLE_VAULT_PASSWORD_FILE=str(secret))
    assert result.returncode == 0, result.stderr
    assert {n["name"] for r in json.loads(result.stdout)["racks"] for n in r["nodes"]} == {"n1", "n2"}
    assert PASSWORD not in result.stdout + result.stderr


def test_an_unsafe_ansible_vault_password_file_is_one_line(vaulted, tmp_path):
    inventory, _ = vaulted
    (tmp_path / "open").mkdir()
    unsafe = password_file(tmp_path / "open", mode=0o644)
    result = clusterctl("inventory", "validate", "-i", str(inventory), ANSIBLE_VAULT_PASSWORD_FILE=str(unsafe))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"error: ANSIBLE_VAULT_PASSWORD_FILE {unsafe}: mode 0644 lets group/others read the vault password; "
        f"run: chmod 600 {unsafe}\n"
    )


def test_virtual_up_takes_the_vault_password_file(tmp_path):
    """`virtual up` loads the inventory too: a file encrypted as a whole needs the password there as well."""
    inventory = tmp_path / "virtual"
    created = clusterctl("virtual", "create", str(inventory), "--nodes", "1", "--racks", "1", "--faults", "none")
    assert created.returncode == 0, created.stderr
    vault_file = inventory / "group_vars" / "rack_r01" / "vault.yml"
    vault_file.parent.mkdir(parents=True, exist_ok=True)
    vault_file.write_text(encrypt("eas_agent_consul_token: virtual-up-token\n"))
    secret = password_file(tmp_path)
    try:
        refused = clusterctl("virtual", "up", str(inventory))
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert str(vault_file) in refused.stderr and "no vault password" in refused.stderr
        started = clusterctl("virtual", "up", str(inventory), "--vault-password-file", str(secret))
        assert started.returncode == 0, started.stderr
        assert "1 machine up" in started.stdout
    finally:
        assert clusterctl("virtual", "down", str(inventory)).returncode == 0
