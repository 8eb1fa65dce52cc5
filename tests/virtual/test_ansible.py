"""Ansible against simulated machines over SSH with become: facts describe the GPU server, modules write
into the machine's overlay, systemd units really start."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from sim.hosts import lifecycle as simulate
from tests.virtual.helpers import needs_root

pytestmark = needs_root
ANSIBLE = str(Path(sys.executable).with_name("ansible"))


def ansible(directory: Path, pattern: str, *args: str) -> dict[str, dict]:
    """Run an ad-hoc module; host -> result (``-o``: one ``host | STATUS => {json}`` line per host)."""
    env = {**os.environ, "ANSIBLE_CALLBACK_RESULT_FORMAT": "json", "ANSIBLE_NOCOLOR": "1"}
    result = subprocess.run([ANSIBLE, "-i", str(directory), pattern, "-o", *args], capture_output=True,
                            text=True, env=env, timeout=120)
    results = {}
    for line in result.stdout.splitlines():
        host, _, rest = line.partition(" | ")
        results[host] = json.loads(rest.split(" => ", 1)[1])
    assert results, result.stdout + result.stderr
    return results


def test_gathered_facts_are_the_simulated_servers(up_inventory):
    directory = up_inventory(2, 1, faults="none", gpu_model="a100-sxm")
    results = ansible(directory, "all", "-m", "ansible.builtin.setup", "-a", "gather_subset=min,hardware")
    assert set(results) == {"r01n01", "r01n02"}
    facts = results["r01n02"]["ansible_facts"]
    assert facts["ansible_hostname"] == "r01n02"
    assert facts["ansible_user_id"] == "root" and facts["ansible_env"]["SUDO_USER"] == "deploy"  # become
    assert facts["ansible_distribution"] == "Ubuntu" and facts["ansible_distribution_version"] == "22.04"
    assert facts["ansible_processor_vcpus"] == 256  # DGX A100: 2x 64-core EPYC 7742, SMT on
    assert facts["ansible_processor_count"] == 2
    assert facts["ansible_processor"][2] == "AMD EPYC 7742 64-Core Processor"
    assert facts["ansible_memtotal_mb"] == (2048 - 16) * 1024
    assert facts["ansible_product_name"] == "DGXA100"
    assert facts["ansible_cmdline"]["iommu"] == "pt"


PLAYBOOK = """
- hosts: all
  gather_facts: false
  tasks:
    - ansible.builtin.copy: {dest: /etc/clusterctl-sim-copy, content: "x"}
    - ansible.builtin.copy:
        dest: /etc/systemd/system/clusterctl-sim-test.service
        content: "[Unit]\\nDescription=x\\n[Service]\\nExecStart=/bin/true\\n[Install]\\nWantedBy=multi-user.target\\n"
    - ansible.builtin.systemd_service: {name: clusterctl-sim-test, enabled: true}
      register: first
    - ansible.builtin.systemd_service: {name: clusterctl-sim-test, enabled: true}
      register: again
    - ansible.builtin.copy:
        dest: /etc/systemd/system/clusterctl-sim-sleep.service
        content: "[Service]\\nExecStart=/bin/sleep infinity\\n"
    - ansible.builtin.systemd_service: {name: clusterctl-sim-sleep, state: started, daemon_reload: true}
    # /usr/bin/systemctl: the simulated host's systemctl front answers is-active from unit files.
    - ansible.builtin.command: /usr/bin/systemctl is-active clusterctl-sim-sleep
      register: active
      changed_when: false
    - ansible.builtin.assert:
        that: [first.changed, not again.changed, first.status.LoadState == "loaded", active.stdout == "active"]
"""


def test_modules_write_into_the_machines_overlay_and_systemd_runs_units(up_inventory, tmp_path):
    """copy (with become) lands in the machine's /etc overlay; systemd_service enables units idempotently
    and starts them under the machine's own systemd."""
    directory = up_inventory(1, 1, faults="none")
    playbook = tmp_path / "play.yml"
    playbook.write_text(PLAYBOOK)
    result = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(directory),
                             str(playbook)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not Path("/etc/clusterctl-sim-copy").exists()
    upper = simulate.layout(directory).host("r01n01").upper / "etc"
    assert (upper / "clusterctl-sim-copy").read_text() == "x"
    assert (upper / "systemd/system/multi-user.target.wants/clusterctl-sim-test.service").is_symlink()
