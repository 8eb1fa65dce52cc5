"""The playbooks' plays as files: every play escalates privilege itself."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO

pytestmark = pytest.mark.unit


def test_every_play_escalates_privilege():
    """The roles write /etc, install packages and start units as root, logged in as an unprivileged user
    (the virtual inventory's ``deploy``, a cloud image's ``ubuntu``). The virtual inventory also sets
    ``ansible_become``, which would hide a play that lost its ``become: true``: hence this check of the files."""
    plays = [(path.name, play) for path in sorted((REPO / "playbooks").glob("*.yml"))
             for play in yaml.safe_load(path.read_text())]
    assert plays
    assert [(name, play.get("hosts")) for name, play in plays
            if not any(k.endswith("import_playbook") for k in play) and play.get("become") is not True] == []


def test_handlers_run_even_when_a_later_task_fails_the_host():
    """A failure after the grub drop-in was written would otherwise lose update-grub for good."""
    import configparser

    config = configparser.ConfigParser()
    config.read(REPO / "ansible.cfg")
    assert config.getboolean("defaults", "force_handlers")
    plays = [(path.name, play) for path in sorted((REPO / "playbooks").glob("*.yml"))
             for play in yaml.safe_load(path.read_text())]
    assert [(name, play.get("name")) for name, play in plays
            if not any(k.endswith("import_playbook") for k in play) and play.get("force_handlers") is not True] == []


def test_every_provisioning_play_checks_the_os_before_it_changes_anything():
    """Only the hold check may come before it: every pre_task before it is an assert that changes nothing."""
    plays = [(path.name, play) for path in sorted((REPO / "playbooks").glob("*.yml"))
             for play in yaml.safe_load(path.read_text()) if play.get("roles")]
    assert plays
    first = {name: [next(iter(v for k, v in task.items() if k.endswith("import_tasks")), None)
                    for task in play.get("pre_tasks", [])][:2] for name, play in plays}
    assert {name: steps for name, steps in first.items()
            if steps != ["tasks/hold.yml", "tasks/supported_os.yml"]} == {}


def _names_and_imports(tasks: list[dict]) -> list[str]:
    """Each task's import (tasks/*.yml) or, for others, its name; blocks flattened in order."""
    out = []
    for task in tasks:
        if "block" in task:
            out += _names_and_imports(task["block"])
            continue
        imported = next((v for k, v in task.items() if k.endswith("import_tasks")), None)
        out.append(Path(imported).name if imported else task.get("name", ""))
    return out


@pytest.mark.parametrize("tasks_of", [
    lambda: yaml.safe_load((REPO / "playbooks/tasks/reboot.yml").read_text()),
    lambda: yaml.safe_load((REPO / "playbooks/consul-servers-reboot.yml").read_text())[0]["tasks"],
    lambda: yaml.safe_load((REPO / "playbooks/node-reboot.yml").read_text())[0]["tasks"],
], ids=["tasks/reboot.yml", "consul-servers-reboot.yml", "node-reboot.yml"])
def test_every_reboot_is_drained_before_and_released_after(tasks_of):
    """A node with IUs in rotation never reboots under the edges: node maintenance before, cleared after."""
    steps = _names_and_imports(tasks_of())
    reboot = steps.index("Reboot the host")
    assert steps.count("Reboot the host") == 1
    assert steps[reboot - 1] == "node_drain.yml"
    assert "node_release.yml" in steps[reboot + 1:]


def test_the_remediation_reboot_refuses_what_provisioning_reboots_elsewhere():
    """A Consul server reboots one at a time while the others are healthy (consul-servers-reboot.yml), and a host
    on hold or in render-only mode is not touched: all before the drain."""
    [play] = yaml.safe_load((REPO / "playbooks/node-reboot.yml").read_text())
    pre = _names_and_imports(play["pre_tasks"])
    assert pre == ["Refuse to run in render-only mode", "hold.yml", "Refuse to reboot a Consul server here"]
    assert "groups['consul_servers']" in play["pre_tasks"][2]["ansible.builtin.assert"]["that"]
    assert play["serial"] == 1 and play["max_fail_percentage"] == 0


GPU_ROLES = {"cpu_cstates", "numa_tuning", "nvidia_stack", "rdma_network", "inference_unit", "eas_agent"}


def test_no_play_of_a_gpu_role_reaches_a_dedicated_consul_server():
    """A host of dedicated_consul_servers runs Consul, time sync and its firewall only (docs/decisions/0038): every
    play with a GPU, NUMA, network or inference role, and the two that act on IUs, leave the group out. (The roles'
    cluster_node filter would stop on such a host anyway; this keeps it out of the plan's batches.)"""
    from provision.plan import play_hosts

    everyone, groups = ["n1", "c1"], {"dedicated_consul_servers": ["c1"], "consul_servers": ["c1"]}
    reaching = []
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(path.read_text()):
            roles = {r if isinstance(r, str) else r["role"] for r in play.get("roles", [])}
            acts_on_ius = path.name in ("rolling-restart.yml", "node-reboot.yml")
            if ("hosts" in play and (roles & GPU_ROLES or acts_on_ius)
                    and "c1" in play_hosts(play["hosts"], everyone, groups, everyone, path.name)):
                reaching.append((path.name, play["name"]))
    assert reaching == []
    dedicated = [(path.name, play["name"]) for path in sorted((REPO / "playbooks").glob("*.yml"))
                 for play in yaml.safe_load(path.read_text()) if play.get("hosts") == "dedicated_consul_servers"]
    assert [name for name, _ in dedicated] == ["dedicated-consul-servers.yml", "network.yml"]
