"""playbooks/consul-servers-reboot.yml, run unchanged by ansible-playbook on three Consul servers: a server
that needs a reboot goes down only while every other server is healthy, one server at a time, and a refused
server stops the run before the next is touched (tasks/reboot.yml leaves the servers' reboots to this play:
two of three servers in one batch rebooting together would take the quorum down).

What stands in, as in test_restart_handlers.py: each server's Consul API (``Leaders``: autopilot's health and
``/v1/status/leader``), and the reboot itself. The hosts are local connections, on which Ansible's reboot
action refuses to run ("would reboot the control node"): that refusal is how a test sees that a server's
turn reached its reboot, and on which server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.roles.consul_agent.test_restart_handlers import (
    OPERATOR,
    SERVERS,
    Leaders,
    ansible_playbook,
)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[4]
PLAY = REPO / "playbooks" / "consul-servers-reboot.yml"
LOCAL_REBOOT_REFUSED = "Running ansible.builtin.reboot with local connection would reboot the control node"


@pytest.fixture
def reboot_play(tmp_path):
    made: list[Leaders] = []

    def run(needs_reboot: dict[str, list[str]], down: str = "", allowed: bool = True,
            timeout_s: int = 3) -> tuple[subprocess.CompletedProcess, Leaders]:
        log = tmp_path / "systemctl.jsonl"
        if down:  # a server that went down (a restart it never came back from) before this run
            log.write_text(json.dumps({"host": down, "argv": ["restart"], "at": time.time()}) + "\n")
        leaders = Leaders(log, never_rejoins=down)
        made.append(leaders)
        hosts = {host: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                        "consul_http_addr": leaders.address(host),
                        # what tasks/reboot.yml set for the host in its batch
                        "_clusterctl_reboot": needs_reboot.get(host, []), "_clusterctl_reboot_allowed": allowed}
                 for host in SERVERS}
        inventory = tmp_path / "hosts.json"
        inventory.write_text(json.dumps({"all": {"children": {"consul_servers": {"hosts": hosts}}, "vars": {
            "consul_token": OPERATOR, "clusterctl_consul_healthy_timeout_s": timeout_s,
            "ansible_become": False}}}))
        return ansible_playbook(inventory, PLAY), leaders

    yield run
    for leaders in made:
        leaders.close()


def _out(done: subprocess.CompletedProcess) -> str:
    return " ".join(done.stdout.split())


def test_a_server_stays_up_while_another_server_is_unhealthy(reboot_play):
    done, _ = reboot_play({h: ["NVIDIA driver 550.127.08 installed"] for h in SERVERS}, down="srv2")
    out = _out(done)
    assert done.returncode != 0
    assert ("srv1 stays up: the other Consul servers are not all healthy, taking it down now could take the "
            "quorum down (unhealthy servers: srv2") in out, out[-3000:]
    assert LOCAL_REBOOT_REFUSED not in out  # no server got to its reboot
    assert "srv3" not in out.split("PLAY RECAP")[0]  # serial 1: the run stopped before the next server's turn
    assert OPERATOR not in done.stdout


def test_servers_take_their_turn_one_at_a_time_and_only_those_that_need_it(reboot_play):
    done, _ = reboot_play({"srv2": ["kernel arguments not active: intel_idle.max_cstate=1"],
                           "srv3": ["NVIDIA driver 550.127.08 installed"]})
    out = _out(done)
    assert done.returncode != 0
    # srv1 has nothing to reboot for; srv2's turn passed the health check and reached its reboot (refused
    # here only because the stand-in host is this machine); srv3 never started its turn
    turns = out.split("PLAY [Reboot the Consul servers one at a time]")[1:]
    assert len(turns) == 2, out[-3000:]
    assert "skipping: [srv1]" in turns[0]
    assert "ok: [srv2]" in turns[1] and LOCAL_REBOOT_REFUSED in turns[1], turns[1][-3000:]
    assert "srv3" not in out.split("PLAY RECAP")[0]


def test_a_run_without_allow_reboot_reboots_no_server(reboot_play):
    done, _ = reboot_play({h: ["packages asked for a reboot"] for h in SERVERS}, allowed=False)
    assert done.returncode == 0, done.stdout[-3000:]
    assert LOCAL_REBOOT_REFUSED not in done.stdout and "changed=0" in done.stdout
