"""cluster/variables.py: every variable an inventory sets is one something reads (clusterctl, a role, a
playbook, the simulator, Ansible) or the site's own; anything else is named with its file and near miss.
Placeholders are refused, naming file and variable, never the value."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cluster import spec, variables
from tests.cluster.helpers import HOSTS, inline, password_file
from tests.helpers import run_cli, write_tree

REPO = Path(__file__).resolve().parents[2]
ROLES = sorted(p for p in (REPO / "roles").iterdir() if p.is_dir())


def _inventory(tmp_path: Path, all_vars: str = "gpu_model: h100-sxm\n", n2: str = "") -> str:
    files = {"hosts.yml": HOSTS, "group_vars/all.yml": all_vars}
    if n2:
        files["host_vars/n2.yml"] = n2
    return str(write_tree(tmp_path / "inventory", files))


def test_misspelt_layout_variables_are_named_with_file_line_and_near_miss(tmp_path, capsys):
    """``ui_size`` and ``gpu_modle`` would leave the node at iu_size 4 and the group's GPU model."""
    inventory = _inventory(tmp_path, n2="ansible_host: 127.0.77.2\ngpu_modle: a100-sxm\nui_size: 2\n")
    code, out, err = run_cli(capsys, "inventory", "validate", "-i", inventory)
    assert code == 2 and out == ""
    lines = err.splitlines()
    assert lines[0].startswith(f"{inventory}: host_vars/n2.yml:2: gpu_modle: unknown variable; did you mean 'gpu_model'?")
    assert lines[1].startswith(f"{inventory}: host_vars/n2.yml:3: ui_size: unknown variable; did you mean 'iu_size'?")
    assert lines[2] == f"2 problems in {inventory}"


def test_an_unknown_boolean_is_found_in_its_file(tmp_path, capsys):
    """Ansible records no origin on a boolean: the vars files are read for it."""
    inventory = _inventory(tmp_path, "gpu_model: h100-sxm\nnuma_tunning_enabled: true\n")
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", inventory)
    assert code == 2
    assert err.startswith(f"{inventory}: group_vars/all.yml:2: numa_tunning_enabled: unknown variable"), err


def test_the_sites_own_variables_are_left_alone(tmp_path, capsys):
    inventory = _inventory(tmp_path, "gpu_model: h100-sxm\nsite_rack_label: east\nasset_tag: A-17\n"
                                     "site_variables: [asset_tag]\n")
    code, out, err = run_cli(capsys, "inventory", "validate", "-i", inventory)
    assert code == 0 and "unknown" not in err, err
    assert out.strip().endswith("OK (2 hosts)")


def test_every_command_that_builds_the_model_refuses_an_unknown_variable(tmp_path, capsys):
    inventory = _inventory(tmp_path, "gpu_model: h100-sxm\nui_size: 2\n")
    code, _, err = run_cli(capsys, "inventory", "show", "-i", inventory)
    assert code == 2 and "group_vars/all.yml:2: ui_size: unknown variable; did you mean 'iu_size'?" in err


@pytest.mark.parametrize("role", ROLES, ids=lambda p: p.name)
def test_every_variable_a_role_declares_is_known(role):
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    declared = {name for entry in specs.values() for name in entry.get("options") or {}}
    declared |= set(yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {})
    assert declared and declared <= set(variables.known())


def test_known_names_their_readers():
    known = variables.known()
    assert known["iu_size"] == "clusterctl (cluster/spec.py)"
    assert known["bmc_address"] == "role cpu_cstates (read by its defaults)"  # through cpu_cstates_bmc
    assert known["clusterctl_batches"].startswith("playbook playbooks/")
    assert {known[n] for n in ("ansible_become", "ansible_ssh_pipelining", "group_names")} == {"Ansible"}
    assert not set(spec.RETIRED) & set(known)


def test_a_plain_placeholder_is_refused_without_a_vault_password(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    inventory = _inventory(tmp_path, "gpu_model: h100-sxm\nbmc_password: 'REPLACE-ME: the BMC password'\n")
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", inventory)
    assert code == 2 and "the BMC password" not in err
    assert err.splitlines()[0] == (
        f"{inventory}: group_vars/all.yml: bmc_password: still a placeholder (REPLACE-ME: ...), not real values: "
        "replace each (inventory/sample/README.md says how)"), err


def test_a_vault_placeholder_is_refused_by_validate_and_plan_with_the_password(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("ANSIBLE_VAULT_PASSWORD_FILE", raising=False)
    secret = password_file(tmp_path)
    inventory = _inventory(tmp_path, "gpu_model: h100-sxm\n",
                           n2="ansible_host: 127.0.77.2\n" + inline("bmc_password", "REPLACE-ME: n2's BMC password"))
    for command in (("inventory", "validate"), ("provision", "--plan")):
        code, out, err = run_cli(capsys, *command, "-i", inventory, "--vault-password-file", str(secret))
        assert code == 2 and "n2's BMC password" not in err and "plan:" not in out
        assert "host_vars/n2.yml: bmc_password: still a placeholder" in err, err
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", inventory)  # sealed: cannot be seen
    assert code == 0 and "1 vault-encrypted value not checked for placeholders" in err, err


def test_a_bad_value_names_the_file_that_sets_it(tmp_path, capsys):
    """A type or rule problem names the file and line (one line for a group_vars mistake every host sees)."""
    inventory = _inventory(tmp_path, "gpu_model: h100-sxm\ngpu_count: 6\n", n2="ansible_host: 127.0.77.2\niu_size: four\n")
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", inventory)
    assert code == 2
    assert err.splitlines()[:2] == [
        f"{inventory}: n1: gpu_count=6: not divisible by iu_size=4: 2 GPUs left over (group_vars/all.yml:2)",
        f"{inventory}: n2: iu_size='four': must be one of 1/2/4/8 (host_vars/n2.yml:2)"], err


def test_an_unknown_variable_with_no_near_miss_says_how_to_keep_it(tmp_path, capsys):
    inventory = _inventory(tmp_path, "gpu_model: h100-sxm\nasset_tag: A-17\n")
    code, _, err = run_cli(capsys, "inventory", "validate", "-i", inventory)
    assert code == 2 and err.splitlines()[0] == (
        f"{inventory}: group_vars/all.yml:2: asset_tag: unknown variable: nothing reads it (a site's own variable "
        "starts with 'site_' or is listed in site_variables)"), err


def test_the_simulators_variables_are_the_ones_sim_reads():
    sources = "\n".join(p.read_text() for p in (REPO / "sim").rglob("*.py"))
    assert all(name in sources for name in variables.SIMULATOR)
