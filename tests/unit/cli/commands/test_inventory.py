"""`clusterctl inventory validate` (cli/commands/inventory.py) on broken inventories: one line per mistake with
the file, line and column, the INI plugin's reason, Ansible's warnings summarized once each."""

from __future__ import annotations

import pytest

from tests.helpers.cli import one_line

pytestmark = pytest.mark.unit


@pytest.fixture
def broken(tmp_path, virtual_inventory):
    """A copy of the virtual inventory to break."""
    import shutil

    def copy(name: str):
        target = tmp_path / name
        shutil.copytree(virtual_inventory, target)
        return target

    return copy


def test_group_vars_yaml_error_names_file_line_and_column(clusterctl, broken):
    inventory = broken("yamlerr")
    with open(inventory / "group_vars" / "all.yml", "a") as f:
        f.write("\nbroken: [1, 2\nnext: value\n")
    lines = (inventory / "group_vars" / "all.yml").read_text().splitlines()
    code, _, err = clusterctl("inventory", "validate", "-i", str(inventory))
    assert code == 2
    line = one_line(err)
    assert line.startswith(f"error: {inventory}/group_vars/all.yml:{len(lines)}:5: YAML: expected ',' or ']'"), line


def test_hosts_yaml_error_is_one_line_with_the_location_and_no_ansible_warnings(clusterctl, broken):
    inventory = broken("yamlerr2")
    (inventory / "hosts.yml").write_text("all:\n  children:\n    rack_r01:\n      hosts:\n        r01n01: {ansible_host: x\n")
    code, _, err = clusterctl("inventory", "validate", "-i", str(inventory))
    assert code == 2
    assert one_line(err) == f"error: {inventory}/hosts.yml:6:1: YAML: expected ',' or '}}', but got '<stream end>'"


def test_ini_error_names_the_file_and_the_ini_plugins_reason(clusterctl, broken):
    inventory = broken("inierr")
    (inventory / "hosts.yml").unlink()
    (inventory / "hosts.ini").write_text("[rack_r01]\nr01n01 ansible_host=127.0.1.11 oops\n")
    code, _, err = clusterctl("inventory", "validate", "-i", str(inventory))
    assert code == 2
    line = one_line(err)
    # the line too: Ansible 2.19's ini plugin drops it from its own error (its Origin's line_num is reset)
    assert line == f"error: {inventory}/hosts.ini:2: INI: Expected key=value host variable assignment, got: oops"
    (inventory / "hosts.ini").write_text("# a comment\n\n[rack_r01:bogus]\nr01n01\n")
    code, _, err = clusterctl("inventory", "validate", "-i", str(inventory))
    assert code == 2 and one_line(err).startswith(f"error: {inventory}/hosts.ini:3: INI: Section [rack_r01:bogus]")


def test_empty_directory_says_what_an_inventory_is(clusterctl, tmp_path):
    (tmp_path / "empty").mkdir()
    code, _, err = clusterctl("inventory", "validate", "-i", str(tmp_path / "empty"))
    assert code == 2 and "no inventory source here" in one_line(err) and "clusterctl virtual create" in err


def test_ansible_warnings_are_summarized_once_each(clusterctl, broken):
    inventory = broken("warn")
    text = (inventory / "hosts.yml").read_text().replace("rack_r01:", "rack-r01:")
    (inventory / "hosts.yml").write_text(text)
    code, out, err = clusterctl("inventory", "show", "-i", str(inventory), "--json")
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warnings and all(": ansible: " in line for line in warnings), err
    assert len(warnings) == len(set(warnings)) and "[WARNING]" not in err and "<<< caused by >>>" not in err


def test_validate_json_gives_each_problem_its_file_and_line(clusterctl, broken):
    """A CI annotation needs the file and line the text output shows after each problem."""
    import json

    inventory = broken("json")
    (inventory / "host_vars").mkdir(exist_ok=True)
    (inventory / "host_vars" / "r02n01.yml").write_text("# r02n01\niu_size: four\nui_size: 2\n")
    code, out, _ = clusterctl("inventory", "validate", "-i", str(inventory), "--json")
    problems = {p["variable"]: p for p in json.loads(out)["problems"]}
    assert code == 2 and set(problems) == {"iu_size", "ui_size"}
    assert (problems["iu_size"]["file"], problems["iu_size"]["line"]) == ("host_vars/r02n01.yml", 2)
    assert (problems["ui_size"]["file"], problems["ui_size"]["line"]) == ("host_vars/r02n01.yml", 3)
