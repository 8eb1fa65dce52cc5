"""clusterctl.infra.apt_packages: dpkg's answer decides whether ansible.builtin.apt runs at all.

The roles' use on the machines (a rerun changes nothing, a downgraded package is put back at its pin) is in
test_site_virtual.py; here are the pure rules and the action on this machine's own dpkg database.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.integration.roles.test_config_files import load_action, playbook

pytestmark = pytest.mark.integration

action = load_action(Path(__file__).resolve().parents[3]
                     / "collections/ansible_collections/clusterctl/infra/plugins/action/apt_packages.py")
DPKG_QUERY = ("chrony\tii \t4.3-2+deb12u1\n"
              "consul\thi \t1.20.1-1\n"            # held: still installed
              "rdma-core\trc \t44.0-2\n"           # removed, config files left
              "perftest\tiU \t4.5-1\n"             # unpacked, not configured
              "libnccl2\tiiR\t2.21.5-1+cuda12.4\n")  # reinstall required


def test_installed_means_fully_installed():
    assert action.installed_versions(DPKG_QUERY) == {"chrony": "4.3-2+deb12u1", "consul": "1.20.1-1"}


@pytest.mark.parametrize(("specs", "missing"), [
    (["chrony", "consul=1.20.1-1"], []),
    (["chrony", "consul=1.20.0-1"], ["consul=1.20.0-1"]),       # another version: apt (with allow_downgrade)
    (["consul=1.20.*"], []),                                    # apt's version glob
    (["consul=1.2*-2"], ["consul=1.2*-2"]),
    (["rdma-core", "perftest", "libnccl2"], ["rdma-core", "perftest", "libnccl2"]),
    (["python3-venv"], ["python3-venv"]),                       # unknown to dpkg
])
def test_unsatisfied_specs(specs, missing):
    installed = action.installed_versions(DPKG_QUERY)
    assert action.unsatisfied(action.parse_specs(specs), installed) == missing


@pytest.mark.parametrize("spec", ["libc6:amd64", "consul>=1.20", "Consul", "a", "pkg=1.0 ; rm -rf /", "x=",
                                  "$(reboot)"])
def test_a_spec_dpkg_cannot_answer_goes_to_apt(spec):
    assert action.parse_specs(["chrony", spec]) is None


def test_a_package_named_twice_goes_to_apt():
    assert action.parse_specs(["consul=1.20.1-1", "consul=1.19.0-1"]) is None


# ------------------------------------------------------------------------------ the action, for real

def test_installed_packages_need_no_apt_run(tmp_path):
    version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "dpkg"], capture_output=True, text=True,
                             check=True).stdout
    for task in ({"name": ["dpkg", "coreutils"], "update_cache": True, "cache_valid_time": 1},
                 {"name": f"dpkg={version}"}):
        result = playbook(tmp_path, task, "--check", module="clusterctl.infra.apt_packages")
        assert result["changed"] is False and result["msg"].startswith("already installed: dpkg"), result


def test_anything_missing_runs_apt_with_the_tasks_arguments(tmp_path):
    # apt itself answers (python-apt's message), so the task went to ansible.builtin.apt
    result = playbook(tmp_path, {"name": ["dpkg", "clusterctl-no-such-package"]}, "--check",
                      module="clusterctl.infra.apt_packages")
    assert result["failed"] and "already installed" not in result.get("msg", ""), result


def test_other_states_are_refused(tmp_path):
    result = playbook(tmp_path, {"name": ["dpkg"], "state": "latest"}, module="clusterctl.infra.apt_packages")
    assert result["failed"] and "state must be present, got 'latest'" in result["msg"], result
