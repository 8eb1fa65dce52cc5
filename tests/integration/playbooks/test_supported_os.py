"""The supported-OS step (playbooks/tasks/supported_os.yml) run by ansible-playbook on localhost aliases, each
reading its own os-release: a host on an unsupported OS fails before anything on it changes, with one message
naming the host and its OS, and the other hosts go on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO

pytestmark = pytest.mark.integration

OS_RELEASES = REPO / "tests" / "fixtures" / "preflight" / "os_release"


def _run(tmp_path: Path, hosts: dict[str, str], play_keys: dict | None = None,
         host_vars: dict[str, dict] | None = None) -> subprocess.CompletedProcess:
    """The step, then a task that changes something on each host (a marker file): which hosts reached it."""
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "name": "supported OS step", "hosts": "all", "gather_facts": False, **(play_keys or {}),
        "pre_tasks": [{"name": "The OS step", "ansible.builtin.import_tasks": str(REPO / "playbooks/tasks/supported_os.yml")}],
        "tasks": [{"name": "Change the host", "ansible.builtin.copy": {
            "dest": str(tmp_path / "changed-{{ inventory_hostname }}"), "content": "x\n", "mode": "0644"}}],
    }]))
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"hosts": {
        name: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
               "clusterctl_os_release_path": str(OS_RELEASES / fixture), **(host_vars or {}).get(name, {})}
        for name, fixture in hosts.items()}}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory), str(play)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)


def test_a_host_on_an_unsupported_os_stops_before_any_change_naming_host_and_os(tmp_path):
    done = _run(tmp_path, {"r01n01": "ubuntu22.04.5-jammy.txt", "r01n02": "ubuntu20.04.6-focal.txt",
                           "r01n03": "debian12-bookworm.txt", "r01n04": "rocky9.4-blue-onyx.txt"})
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-2000:]
    out = " ".join(done.stdout.split())
    assert ("r01n02: Ubuntu 20.04.6 LTS (ID=ubuntu, VERSION_ID=20.04) is not a supported OS; the roles support "
            "Debian 12, Ubuntu 22.04, Ubuntu 24.04") in out
    assert "r01n04: Rocky Linux 9.4 (Blue Onyx) (ID=rocky, VERSION_ID=9.4) is not a supported OS" in out
    assert sorted(p.name for p in tmp_path.glob("changed-*")) == ["changed-r01n01", "changed-r01n03"]


def test_a_batch_with_no_failures_allowed_stops_at_the_os_step(tmp_path):
    """As the provisioning plays run it (max_fail_percentage 0): the batch stops, and nothing changed anywhere."""
    done = _run(tmp_path, {"r01n01": "ubuntu24.04.1-noble.txt", "r01n02": "debian11-bullseye.txt"},
                {"max_fail_percentage": 0})
    assert done.returncode == 2, done.stdout[-3000:]
    assert "r01n02: Debian GNU/Linux 11 (bullseye) (ID=debian, VERSION_ID=11) is not a supported OS" in done.stdout
    assert list(tmp_path.glob("changed-*")) == []


def test_an_unreadable_os_release_stops_the_host_naming_the_line(tmp_path):
    done = _run(tmp_path, {"r01n01": "garbage-no-such-file.txt"})
    assert done.returncode == 2, done.stdout[-3000:]
    assert "os-release: line 1: not a KEY=value line of os-release(5)" in done.stdout
    assert list(tmp_path.glob("changed-*")) == []


def test_a_repository_of_another_release_stops_the_host_naming_variable_and_release(tmp_path):
    """NVIDIA's and HashiCorp's repositories are per release: an Ubuntu 24.04 node left on the ubuntu2204/jammy
    defaults would install another release's driver and Consul packages."""
    done = _run(tmp_path, {"r01n01": "ubuntu24.04.1-noble.txt", "r01n02": "ubuntu24.04.1-noble.txt",
                           "r01n03": "debian12-bookworm.txt", "r01n04": "ubuntu22.04.5-jammy.txt"},
                host_vars={"r01n01": {"nvidia_stack_repo_distro": "ubuntu2204", "consul_agent_repo_suite": "jammy"},
                           "r01n02": {"nvidia_stack_repo_distro": "ubuntu2404", "consul_agent_repo_suite": "noble"},
                           "r01n03": {"nvidia_stack_repo_distro": "debian12", "consul_agent_repo_suite": "jammy"}})
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-2000:]
    out = " ".join(done.stdout.split())
    assert ("r01n01: Ubuntu 24.04.1 LTS runs here: nvidia_stack_repo_distro=ubuntu2204 is NVIDIA's repository for "
            "another release; this host's is ubuntu2404; consul_agent_repo_suite=jammy is HashiCorp's suite for "
            "another release; this host's is noble") in out
    assert "r01n03: Debian GNU/Linux 12 (bookworm) runs here: consul_agent_repo_suite=jammy" in out
    assert "nvidia_stack_repo_distro=debian12" not in out
    # r01n04 carries neither variable (a play without the roles that add the repositories): nothing to check
    assert sorted(p.name for p in tmp_path.glob("changed-*")) == ["changed-r01n02", "changed-r01n04"]
