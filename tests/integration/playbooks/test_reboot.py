"""The reboot step (playbooks/tasks/reboot.yml) run by ansible-playbook on localhost: it reports every role's
pending reasons, never reboots a Consul server in its batch, and is quiet without reasons."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO

pytestmark = pytest.mark.integration


def _reboot_play(tmp_path: Path, extra: dict, inventory: str = "localhost,") -> subprocess.CompletedProcess:
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{
        "name": "reboot step", "hosts": "localhost", "gather_facts": False,
        "tasks": [{"name": "The reboot step", "ansible.builtin.import_tasks": str(REPO / "playbooks/tasks/reboot.yml")}],
    }]))
    (tmp_path / "extra.json").write_text(json.dumps({"ansible_python_interpreter": sys.executable, **extra}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", inventory, "-c", "local",
                           str(play), "-e", f"@{tmp_path / 'extra.json'}"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=REPO)


def test_reboot_step_reports_pending_reasons_from_every_role(tmp_path):
    # Render-only: the reboot task must not run even with clusterctl_allow_reboot (this is the CI machine).
    done = _reboot_play(tmp_path, {"_nvidia_stack_reboot_reasons": ["NVIDIA driver 550.127.08 installed"],
                                   "_cpu_cstates_reboot_reasons": ["kernel arguments not active: x=1"],
                                   "clusterctl_allow_reboot": True, "clusterctl_render_only": True})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert ("reboot pending: kernel arguments not active: x=1; NVIDIA driver 550.127.08 installed"
            in done.stdout), done.stdout[-2000:]
    assert re.search(r"TASK \[Reboot the host\][^\n]*\n(skipping|.*skipping)", done.stdout)


def test_a_consul_server_is_not_rebooted_in_its_batch(tmp_path):
    """Two of three servers in one batch rebooting together would take the quorum down: a server's reboot is
    left to playbooks/consul-servers-reboot.yml (one at a time; tests/integration/roles/consul_agent/test_server_reboots.py).
    Here reboots are allowed and not render-only: had the task run on this local host, Ansible's reboot
    action would have failed the play ("would reboot the control node")."""
    inventory = tmp_path / "hosts.json"
    inventory.write_text(json.dumps({"all": {"children": {"consul_servers": {"hosts": {"localhost": {}}}}}}))
    done = _reboot_play(tmp_path, {"_nvidia_stack_reboot_reasons": ["NVIDIA driver 550.127.08 installed"],
                                   "clusterctl_allow_reboot": True, "clusterctl_render_only": False},
                        inventory=str(inventory))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"TASK \[Reboot the host\][^\n]*\n(skipping|.*skipping)", done.stdout), done.stdout[-2000:]
    assert ("reboot pending: NVIDIA driver 550.127.08 installed (a Consul server: rebooted by the last play, "
            "one server at a time)") in " ".join(done.stdout.split())


def test_reboot_step_is_quiet_without_reasons(tmp_path):
    if Path("/var/run/reboot-required").exists():
        pytest.skip("this machine itself has /var/run/reboot-required")
    done = _reboot_play(tmp_path, {"clusterctl_render_only": True})
    assert done.returncode == 0, done.stdout[-2000:]
    assert "reboot pending" not in done.stdout
