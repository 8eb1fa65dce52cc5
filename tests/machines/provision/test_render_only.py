"""Render-only mode (`clusterctl_render_only`, playbooks/README.md "Render only"), both ways.

Without machines: every task that installs a package, acts on a unit, changes the live kernel or firmware,
calls Consul or reboots sits behind the switch (a new such task that forgets it fails here), the old
unprefixed switches are gone, and rolling-restart.yml refuses the mode. The normal path (switch off) is what
test_site_virtual.py provisions.

On one fresh machine: a render-only site.yml run writes the rendered files, and installs no package,
creates no venv, and leaves every unit it would enable or start as it found it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim.hosts import create
from sim.hosts import lifecycle as simulate
from tests.helpers.machines import leftovers, needs_root
from tests.helpers.provision import clusterctl, stats_of

pytestmark = pytest.mark.machines(own_net=True)
# The machine's own 127.47.R.N (tests/conftest.py): this module runs beside the machine chain, not in it.
NET = 47

REPO = Path(__file__).resolve().parents[3]
SWITCH = "clusterctl_render_only"
GUARD = re.compile(r"\bnot\s+clusterctl_render_only\b")

# Modules that change packages, units, the kernel, firmware, Consul or the machine's power state.
ACTING_MODULES = {
    "ansible.builtin.apt", "ansible.builtin.pip", "ansible.builtin.systemd_service", "ansible.builtin.reboot",
    "ansible.builtin.unarchive", "clusterctl.infra.apt_packages", "clusterctl.infra.consul_acl",
    "clusterctl.infra.consul_restart",
}
# Acting tasks that render-only mode deliberately keeps (role, task name): none. cpu_cstates' Redfish PATCH of
# the BIOS pending settings was one until it applied at any next reboot was judged a change to what runs
# (playbooks/README.md, "Render only").
KEPT: set[tuple[str, str]] = set()


def _module(task: dict) -> str | None:
    return next((k for k in task if k.startswith(("ansible.builtin.", "clusterctl.infra."))), None)


def _acts(task: dict) -> bool:
    module = _module(task)
    if module in ACTING_MODULES:
        return True
    if module == "ansible.builtin.command":  # a read says so with changed_when: false
        return task.get("changed_when") is not False
    if module == "ansible.builtin.uri":
        return str(task[module].get("method", "GET")).upper() != "GET"
    return False


def _guarded(task: dict) -> bool:
    when = task.get("when", [])
    return any(GUARD.search(str(w)) for w in (when if isinstance(when, list) else [when]))


def _walk(tasks: list, where: Path, guarded: bool, found: list[tuple[str, str]]) -> None:
    """Acting tasks (file, name) among `tasks` of the file `where`, following includes and blocks, that no
    `when` of theirs or of an enclosing include or block guards with the switch."""
    for task in tasks or []:
        here = guarded or _guarded(task)
        for key in ("block", "rescue", "always"):
            _walk(task.get(key, []), where, here, found)
        module = _module(task)
        if module in ("ansible.builtin.include_tasks", "ansible.builtin.import_tasks"):
            target = task[module] if isinstance(task[module], str) else task[module]["file"]
            # From handlers/ (or tasks/), Ansible finds an include in the role's tasks/.
            path = where.parent / target
            path = path if path.exists() else where.parent.parent / "tasks" / target
            _walk(yaml.safe_load(path.read_text()), path, here, found)
        elif _acts(task) and not here:
            found.append((str(where), task.get("name", "?")))


def _unguarded(role: str) -> set[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for part in ("tasks/main.yml", "handlers/main.yml"):
        path = REPO / "roles" / role / part
        _walk(yaml.safe_load(path.read_text()), path, False, found)
    return {(role, name) for _, name in found}


ROLES = sorted(p.name for p in (REPO / "roles").iterdir() if p.is_dir())


@pytest.mark.parametrize("role", ROLES)
def test_every_acting_task_of_the_role_is_behind_the_switch(role):
    assert _unguarded(role) <= KEPT, f"{role}: acting tasks without `not {SWITCH}`: {_unguarded(role) - KEPT}"


def test_the_walk_finds_acting_tasks(tmp_path):
    # The check above can fail: the walk finds an unguarded acting task behind an include, not one behind a
    # guarded include, and tells acting tasks from reads and from guarded ones.
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "bios.yml").write_text(yaml.safe_dump([
        {"name": "patch", "ansible.builtin.uri": {"url": "https://bmc/x", "method": "PATCH"}}]))
    main = tmp_path / "tasks" / "main.yml"
    included: list[tuple[str, str]] = []
    _walk([{"name": "i", "ansible.builtin.include_tasks": "bios.yml"},
           {"name": "j", "ansible.builtin.include_tasks": "bios.yml", "when": "not clusterctl_render_only | bool"}],
          main, False, included)
    assert [name for _, name in included] == ["patch"]
    assert ("cpu_cstates", "Write the differing attributes to the pending BIOS settings") not in _unguarded("cpu_cstates")
    found: list[tuple[str, str]] = []
    _walk([{"name": "x", "ansible.builtin.systemd_service": {"name": "a"}},
           {"name": "y", "ansible.builtin.command": "sysctl --system", "changed_when": True},
           {"name": "z", "ansible.builtin.command": "cat /x", "changed_when": False},
           {"name": "v", "block": [{"name": "u", "ansible.builtin.pip": {"name": "a"}}]},
           {"name": "w", "ansible.builtin.apt": {"name": "a"}, "when": ["not clusterctl_render_only | bool"]}],
          REPO / "roles" / "x.yml", False, found)
    assert [name for _, name in found] == ["x", "y", "u"]


@pytest.mark.parametrize("role", ROLES)
def test_the_role_declares_the_switch_with_a_false_default(role):
    base = REPO / "roles" / role
    spec = yaml.safe_load((base / "meta/argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    assert spec[SWITCH]["type"] == "bool"
    assert yaml.safe_load((base / "defaults/main.yml").read_text())[SWITCH] is False
    assert f"`{SWITCH}`" in (base / "README.md").read_text()


def test_a_switch_value_that_is_not_a_boolean_stops_the_role_before_its_first_task(tmp_path):
    play = tmp_path / "play.yml"
    play.write_text(yaml.safe_dump([{"hosts": "localhost", "gather_facts": False, "roles": ["numa_tuning"]}]))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local", str(play),
         "-e", f"{SWITCH}=maybe", "-e", f"ansible_python_interpreter={sys.executable}"],
        capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode != 0
    assert re.search(r"clusterctl_render_only.*\bbool\b", done.stdout), done.stdout[-2000:]
    assert "TASK [numa_tuning : Check the sysctl names]" not in done.stdout


def test_the_old_switches_are_gone():
    old = re.compile(r"clusterctl_manage_packages|clusterctl_live_actions|consul_agent_live_actions")
    paths = [*REPO.glob("roles/**/*"), *REPO.glob("playbooks/**/*"), *REPO.glob("collections/**/*.md"),
             *REPO.glob("sim/**/*.py"), *REPO.glob("inventory/**/*")]
    hits = [str(p.relative_to(REPO)) for p in paths if p.is_file() and old.search(p.read_text(errors="replace"))]
    assert hits == []


def test_rolling_restart_refuses_render_only_naming_the_switch(tmp_path):
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run(
        [str(Path(sys.executable).with_name("ansible-playbook")), "-i", "localhost,", "-c", "local",
         "playbooks/rolling-restart.yml", "-e", f"{SWITCH}=true",
         "-e", f"ansible_python_interpreter={sys.executable}"],
        capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert done.returncode != 0
    assert "localhost: clusterctl_render_only is on: rolling-restart.yml only drains and restarts" in done.stdout
    assert "TASK [Read which of the node's inference units" not in done.stdout  # no Consul call was made


# ------------------------------------------------------------------------------- on one machine

HOST = "r01n01"
RENDERED = ["/etc/nccl.conf", "/etc/apt/preferences.d/clusterctl-nvidia.pref",
            "/etc/systemd/system/nvidia-persistenced.service.d/10-clusterctl-persistence.conf",
            "/etc/systemd/system/vllm-iu@.service", "/etc/systemd/system/vllm-iu@0.service.d/10-numa.conf",
            "/etc/vllm-iu/0.env", "/etc/eas-agent/config.yml", "/etc/systemd/system/eas-agent.service",
            "/etc/consul.d/consul.hcl", "/etc/consul.d/vllm-iu-r01n01-iu0.json", "/etc/chrony/chrony.conf",
            "/etc/sysctl.d/60-clusterctl-numa.conf", "/etc/default/grub.d/60-clusterctl-cstates.cfg",
            "/etc/systemd/system/cpu-dma-latency.service", "/etc/systemd/system/roce-dcqcn.service",
            "/usr/local/sbin/roce-dcqcn", "/etc/clusterctl/firewall.nft",
            "/etc/systemd/system/clusterctl-firewall.service", "/etc/eas-edge/edge.yml",
            "/etc/systemd/system/eas-edge.service", "/etc/consul.d/eas-edge.json", "/etc/haproxy/haproxy.cfg"]
# Every unit a normal run enables or starts, restarts or reloads.
UNITS = ["vllm-iu@0.service", "vllm-iu@1.service", "eas-agent.service", "consul.service", "chrony.service",
         "nvidia-persistenced.service", "nvidia-fabricmanager.service", "cpu-dma-latency.service",
         "roce-dcqcn.service", "clusterctl-firewall.service", "eas-edge.service", "haproxy.service"]
NOT_RUNNING = ["vllm-iu@0.service", "vllm-iu@1.service", "eas-agent.service", "consul.service", "chrony.service"]
# What a normal run installs: stand-in vendor packages and Debian's own.
PACKAGES = ["chrony", "consul", "cuda-keyring", "nvidia-headless-550-open", "nvidia-utils-550",
            "nvidia-fabricmanager-550", "cuda-toolkit-12-4", "libnccl2", "rdma-core", "perftest", "nftables", "haproxy"]
VENVS = ["/opt/vllm/venv", "/opt/eas-agent/venv", "/opt/eas-edge/venv"]


def _state(inventory: Path) -> dict:
    """What render-only must leave alone: dpkg's package list, each unit's enabled and active state, venvs."""
    def sh(script: str) -> str:
        done = simulate.run_on(inventory, HOST, "sh", "-c", script)
        assert done.returncode == 0, done.stderr
        return done.stdout

    # is-enabled of a unit file that render-only wrote goes from nothing to "disabled": only "enabled" counts.
    units = sh("for u in " + " ".join(UNITS) + "; do e=$(systemctl is-enabled $u 2>/dev/null || true);"
               " [ \"$e\" = enabled ] || e=not-enabled; echo \"$u $e $(systemctl is-active $u || true)\"; done")
    return {
        "dpkg": sh("dpkg-query -W -f '${Package} ${Version} ${db:Status-Status}\\n'"),
        "installed": sh("for p in " + " ".join(PACKAGES) + "; do dpkg-query -W -f '${Package} ${db:Status-Status}\\n'"
                        " $p 2>/dev/null | grep ' installed$' || true; done"),
        "units": dict(line.split(" ", 1) for line in units.splitlines()),
        "venvs": sh("for v in " + " ".join(VENVS) + "; do test -e $v && echo $v || true; done"),
    }


@pytest.fixture(scope="module")
def render_only(tmp_path_factory):
    """One fresh RoCE machine (RoCE: its boot unit and firmware writes are behind the switch too), the
    switch in its host_vars, state read before and after one site.yml run."""
    inventory = tmp_path_factory.mktemp("render-only") / "inventory"
    create.write(inventory, 1, 1, fabric="roce", faults="none", net=NET)
    (inventory / "host_vars").mkdir(exist_ok=True)
    (inventory / "host_vars" / f"{HOST}.yml").write_text(
        "# Render only: files, directories and users; no package, service or Consul action.\n"
        f"{SWITCH}: true\n")
    simulate.up(inventory)
    try:
        before = _state(inventory)
        run_dir = inventory.parent / "run"
        run = clusterctl("provision", "-i", str(inventory), "--run-dir", str(run_dir), "--yes")
        yield inventory, before, _state(inventory), run, run_dir
    finally:
        simulate.down(inventory)
        assert leftovers(inventory) == [], f"left behind under {inventory}"


@needs_root
def test_render_only_run_succeeds(render_only):
    _, _, _, run, run_dir = render_only
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    stats = stats_of(run_dir / "events.jsonl")
    assert not stats["failures"] and not stats["dark"] and stats["changed"][HOST] > 10
    assert "rollout complete: 1 host" in run.stdout


@needs_root
@pytest.mark.parametrize("path", RENDERED)
def test_render_only_writes_the_file(render_only, path):
    inventory = render_only[0]
    done = simulate.run_on(inventory, HOST, "cat", path)
    assert done.returncode == 0 and done.stdout.strip(), f"{HOST}:{path}: {done.stderr}"


@needs_root
def test_render_only_renders_what_a_normal_run_renders(render_only):
    # A RoCE node's /etc/nccl.conf, as site.yml's normal run renders it (test_site_virtual.py's golden).
    text = simulate.run_on(render_only[0], HOST, "cat", "/etc/nccl.conf").stdout
    assert text == (Path(__file__).resolve().parents[2] / "fixtures" / "golden" / "provision" / "nccl-roce.conf").read_text()


@needs_root
def test_render_only_installs_no_package(render_only):
    _, before, after, _, _ = render_only
    assert after["installed"] == "", f"installed by a render-only run: {after['installed']}"
    assert after["dpkg"] == before["dpkg"]
    assert after["venvs"] == "", f"venvs created: {after['venvs']}"


@needs_root
def test_render_only_enables_and_starts_no_unit(render_only):
    _, before, after, _, _ = render_only
    assert after["units"] == before["units"]
    started = [u for u in NOT_RUNNING if after["units"][u].split()[-1:] == ["active"]]
    assert started == [], f"running after a render-only run: {started}"
