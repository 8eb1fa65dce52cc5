"""provision/run.py: what goes on ansible-playbook's command line and into its environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from provision.run import playbook_args, runner_env

pytestmark = pytest.mark.integration


def test_only_the_vault_password_file_path_goes_on_the_command_line(tmp_path):
    secret = tmp_path / "vault-pass"
    secret.write_text("hunter2\n")
    args = playbook_args(check=True, diff=True, vault_password_file=secret)
    assert args == f"--check --diff --vault-password-file {secret}"
    assert "hunter2" not in args


def test_no_flags_is_an_empty_command_line():
    assert playbook_args(check=False, diff=False, vault_password_file=None) == ""


def test_a_path_with_a_space_is_quoted_for_the_runner(tmp_path):
    secret = tmp_path / "my vault"
    assert playbook_args(check=False, diff=False, vault_password_file=secret) == f"--vault-password-file '{secret}'"


def test_host_keys_are_checked_and_this_checkout_is_on_the_path():
    env = runner_env()
    assert env["ANSIBLE_HOST_KEY_CHECKING"] == "True"  # ansible-runner would default it to False
    root = Path(__file__).resolve().parents[3]
    assert env["ANSIBLE_CONFIG"] == str(root / "ansible.cfg")
    assert env["PYTHONPATH"].split(":")[0] == str(root)


def test_module_arguments_are_not_logged_to_the_hosts_syslog():
    """every module logs 'Invoked with <arguments>' to the target's journal unless
    no_target_syslog is set; config_files' arguments are the rendered files (an env file's HF_TOKEN=...).
    ansible.cfg sets it, and Ansible reads it from there (asked through ansible-config)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    dump = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-config")), "dump", "--only-changed"],
        env={**os.environ, "ANSIBLE_CONFIG": str(root / "ansible.cfg")},
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout
    assert "DEFAULT_NO_TARGET_SYSLOG(" in dump and "DEFAULT_NO_TARGET_SYSLOG(default)" not in dump
    assert [line for line in dump.splitlines() if line.startswith("DEFAULT_NO_TARGET_SYSLOG(")][0].endswith("= True")
