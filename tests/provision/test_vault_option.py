"""``clusterctl provision --vault-password-file``: checked before anything runs, feeds the inventory
loader and ansible-playbook, and the password never shows up in output or events.

The checks and ``--plan`` runs need no simulated host; one real run (``--tags eas_agent`` on a one-node
virtual cluster, a few seconds) proves that ansible-playbook decrypts a ``!vault`` token with the file.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from cluster.ansible import vault
from tests.helpers import run_cli
from tests.provision.helpers import PYTHON, clusterctl

PASSWORD = "vault-option-test-password-5e1d"  # must never be printed or logged
TOKEN = "c0ffee42-vault-option-token-eas-agent"  # the decrypted value, written only to the host's token file
BMC_PASSWORD = "bmc-secret-from-a-vault-file-77"

ANSIBLE_VAULT = str(Path(PYTHON).with_name("ansible-vault"))


def password_file(directory: Path, mode: int = 0o600, text: str = PASSWORD) -> Path:
    path = directory / "vault-password"
    path.write_text(text + "\n")
    path.chmod(mode)
    return path


def env_without_vault() -> dict[str, str]:
    """The environment minus any ambient vault password file: only the option may supply one."""
    return {k: v for k, v in os.environ.items() if k != "ANSIBLE_VAULT_PASSWORD_FILE"}


def encrypt_string(secret_file: Path, name: str, value: str) -> str:
    return subprocess.run(
        [ANSIBLE_VAULT, "encrypt_string", "--vault-password-file", str(secret_file), "--stdin-name", name],
        input=value, capture_output=True, text=True, check=True,
    ).stdout


def virtual_inventory(directory: Path) -> Path:
    inventory = directory / "inventory"
    created = clusterctl("virtual", "create", str(inventory), "--nodes", "1", "--racks", "1", "--faults", "none")
    assert created.returncode == 0, created.stderr
    return inventory


# ------------------------------------------------------------------------------- the file check

@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_password_file_readable_by_others_is_refused(tmp_path, mode):
    path = password_file(tmp_path, mode)
    with pytest.raises(vault.VaultPasswordFileError) as error:
        vault.check_vault_password_file(path)
    assert error.value.exit_code == 2
    assert str(path) in str(error.value) and f"mode {mode:04o}" in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_a_private_password_file_is_accepted(tmp_path, mode):
    path = password_file(tmp_path, mode)
    assert vault.check_vault_password_file(path) == path.resolve()


def test_an_executable_vault_script_may_be_readable_by_others(tmp_path):
    script = tmp_path / "vault-pass.sh"
    script.write_text(f"#!/bin/sh\necho {PASSWORD}\n")
    script.chmod(0o755)
    assert vault.check_vault_password_file(script) == script.resolve()
    secrets = vault.load_vault_secrets(script)
    assert secrets[0][1].bytes == PASSWORD.encode()  # Ansible ran the script, as ansible-playbook will


def test_a_missing_file_or_a_directory_is_refused(tmp_path):
    with pytest.raises(vault.VaultPasswordFileError, match="no such file"):
        vault.check_vault_password_file(tmp_path / "absent")
    with pytest.raises(vault.VaultPasswordFileError, match="not a regular file"):
        vault.check_vault_password_file(tmp_path)


def test_an_empty_password_file_is_a_usage_error(tmp_path):
    path = password_file(tmp_path, text="")
    with pytest.raises(vault.VaultPasswordFileError) as error:
        vault.load_vault_secrets(vault.check_vault_password_file(path))
    assert error.value.exit_code == 2 and str(path) in str(error.value)


# ----------------------------------------------------------------------------- the CLI, no host

def test_cli_refuses_a_0644_file_before_reading_the_inventory(tmp_path, capsys):
    path = password_file(tmp_path, 0o644)
    # The inventory does not exist: the password file is reported first, so nothing was loaded.
    code, out, err = run_cli(capsys, "provision", "-i", str(tmp_path / "no-inventory"), "--plan",
                             "--vault-password-file", str(path))
    assert code == 2
    assert err.strip() == (
        f"error: --vault-password-file {path}: mode 0644 lets group/others read the vault password; "
        f"run: chmod 600 {path}"
    )
    assert out == ""


def test_cli_refuses_a_missing_file(tmp_path, capsys):
    code, _, err = run_cli(capsys, "provision", "-i", str(tmp_path / "no-inventory"), "--plan",
                           "--vault-password-file", str(tmp_path / "absent"))
    assert code == 2
    assert err.strip() == f"error: --vault-password-file {tmp_path / 'absent'}: no such file"


def test_help_explains_where_secrets_come_from(capsys):
    code, out, _ = run_cli(capsys, "provision", "--help")
    assert code == 0
    text = "".join(out.split())  # click wraps the help text
    assert "--vault-password-file" in text and "mode0600" in text and "ansible-vault" in text


@pytest.fixture
def vaulted_inventory(tmp_path) -> tuple[Path, Path]:
    """A one-node inventory with a vars file encrypted as a whole and an inline !vault BMC password."""
    secret_file = password_file(tmp_path)
    inventory = virtual_inventory(tmp_path)
    with (inventory / "group_vars" / "all.yml").open("a") as f:
        f.write("cpu_cstates_redfish: true\nbmc_address: 127.0.9.11\nbmc_username: admin\n")
        f.write(encrypt_string(secret_file, "bmc_password", BMC_PASSWORD))
    host_vars = inventory / "host_vars" / "r01n01.yml"
    host_vars.parent.mkdir()
    host_vars.write_text("sim_command_delay_s: 0.0\n")
    subprocess.run([ANSIBLE_VAULT, "encrypt", "--vault-password-file", str(secret_file), str(host_vars)],
                   check=True, capture_output=True)
    return inventory, secret_file


def test_plan_decrypts_vault_files_and_values_with_the_option(vaulted_inventory):
    inventory, secret_file = vaulted_inventory
    result = clusterctl("provision", "-i", str(inventory), "--plan", "--vault-password-file", str(secret_file),
                        env=env_without_vault())
    assert result.returncode == 0, result.stderr
    assert "plan: site.yml on 1 host of" in result.stdout
    for text in (PASSWORD, BMC_PASSWORD):
        assert text not in result.stdout + result.stderr


def test_plan_without_the_password_is_an_inventory_error(vaulted_inventory):
    inventory, _ = vaulted_inventory
    result = clusterctl("provision", "-i", str(inventory), "--plan", env=env_without_vault())
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {inventory}") and "vault" in result.stderr
    assert "Traceback" not in result.stderr


def test_plan_with_a_wrong_password_is_an_inventory_error(vaulted_inventory, tmp_path):
    inventory, _ = vaulted_inventory
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    result = clusterctl("provision", "-i", str(inventory), "--plan", "--vault-password-file",
                        str(password_file(wrong, text="not-the-password")), env=env_without_vault())
    assert result.returncode == 2
    assert "Decryption failed" in result.stderr and "Traceback" not in result.stderr


def test_plan_with_an_undecryptable_inline_value_stops_before_any_host(tmp_path):
    """Only an inline !vault value the model never reads (eas_agent_consul_token): validation passes, but
    the playbook would fail on it, so provision stops before batch 1, naming variable and hosts."""
    secret_file = password_file(tmp_path)
    inventory = virtual_inventory(tmp_path)
    # host_vars: the virtual inventory's group_vars already set eas_agent_consul_token (a duplicate key there
    # would be Ansible's warning, not this test's error)
    (inventory / "host_vars").mkdir(exist_ok=True)
    with (inventory / "host_vars" / "r01n01.yml").open("a") as f:
        f.write("\n" + encrypt_string(secret_file, "eas_agent_consul_token", "inline-only-token"))
    result = clusterctl("provision", "-i", str(inventory), "--plan", env=env_without_vault())
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: {inventory}: eas_agent_consul_token (host_vars/r01n01.yml:")
    assert "hosts: r01n01): vault-encrypted, and no vault password was given" in result.stderr
    assert "Traceback" not in result.stderr and "inline-only-token" not in result.stderr
    ok = clusterctl("provision", "-i", str(inventory), "--plan", "--vault-password-file", str(secret_file),
                    env=env_without_vault())
    assert ok.returncode == 0, ok.stderr


# ------------------------------------------------------------------------------- a real run

def test_a_real_run_decrypts_the_token_and_never_shows_the_password(tmp_path):
    secret_file = password_file(tmp_path)
    inventory = virtual_inventory(tmp_path)
    with (inventory / "group_vars" / "all.yml").open("a") as f:
        f.write(encrypt_string(secret_file, "eas_agent_consul_token", TOKEN))
    up = clusterctl("virtual", "up", str(inventory))
    assert up.returncode == 0, up.stderr
    run_dir = tmp_path / "run"
    try:
        result = clusterctl("provision", "-i", str(inventory), "--tags", "eas_agent", "--batches", "100%",
                            "--run-dir", str(run_dir), "--vault-password-file", str(secret_file),
                            env=env_without_vault(), timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
        from sim.hosts.lifecycle import run_on  # over SSH into the machine, as the inventory reaches it

        token = run_on(inventory, "r01n01", "cat", "/etc/eas-agent/consul.token")
        assert token.stdout == TOKEN + "\n", token.stderr
        mode = run_on(inventory, "r01n01", "stat", "-c", "%a", "/etc/eas-agent/consul.token")
        assert mode.stdout.strip() == "600"
    finally:
        down = clusterctl("virtual", "down", str(inventory))
        assert down.returncode == 0, down.stderr
    events = (run_dir / "events.jsonl").read_text()
    assert events.strip()
    output = result.stdout + result.stderr
    for secret in (PASSWORD, TOKEN):
        assert secret not in events and secret not in output
        for path in run_dir.rglob("*"):  # runner artifacts too (its recorded command, stdout)
            if path.is_file():
                assert secret not in path.read_text(errors="replace"), path
    # Only the path went to ansible-playbook, as its own option.
    recorded = next(run_dir.glob("runner/artifacts/*/command")).read_text()
    assert f'"--vault-password-file", "{secret_file.resolve()}"' in recorded
