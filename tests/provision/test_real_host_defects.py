"""The roles-on-real-hosts review's defects, tested without a real host: each test fails on the code before the
fix (#N: the defect's number in that review, which this repository does not keep; each item says what it was).

- #4 DeviceAllow against /proc/devices of R550 and R535 drivers (tests/fixtures/proc_devices);
- #6 the driver/FM version expressions of nvidia_stack evaluated by Ansible's own templar on the role's text;
- #1/#16/#5 the package tasks' shape (cuda-keyring, forced refresh, FM started);
- #7 the RoCE boot script run against an MLNX_OFED-style and an inbox-style sysfs tree;
- #15 the Redfish attribute planning filter;
- the reboot path: tasks/reboot.yml on localhost (never rebooting it) and the recap's "reboot pending" line.
"""

from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from provision.plan import Plan
from provision.rollout import Rollout

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
FIXTURES = REPO / "tests" / "fixtures" / "proc_devices"


def char_groups(proc_devices: str) -> dict[str, int]:
    groups, section = {}, None
    for line in proc_devices.splitlines():
        if line.endswith("devices:"):
            section = line
        elif line.strip() and section == "Character devices:":
            major, name = line.split(None, 1)
            groups[name] = int(major)
    return groups


def allowed_majors(unit: str, proc_devices: str) -> set[int]:
    """Majors a unit's DeviceAllow=char-<glob> lines grant (systemd matches /proc/devices names with fnmatch)."""
    groups = char_groups(proc_devices)
    majors = set()
    for spec in re.findall(r"^DeviceAllow=char-(\S+)\s", unit, re.M):
        majors |= {major for name, major in groups.items() if fnmatch.fnmatchcase(name, spec)}
    return majors


@pytest.mark.parametrize("fixture", ["r550-hgx.txt", "r535.txt"])
def test_eas_agent_device_allow_covers_the_gpus_on_r550_and_r535(fixture):
    unit = (GOLDEN / "eas-agent.service").read_text()
    assert "DevicePolicy=closed" in unit
    assert 195 in allowed_majors(unit, (FIXTURES / fixture).read_text()), (
        f"no DeviceAllow=char-... of eas-agent.service names major 195 (/dev/nvidia0..N) in {fixture}")


def test_the_old_frontend_name_alone_misses_r550():
    """Negative control: what the role had before (char-nvidia-frontend only) grants nothing on R550."""
    assert allowed_majors("DeviceAllow=char-nvidia-frontend rw\n", (FIXTURES / "r550-hgx.txt").read_text()) == set()


# ----------------------------------------------------------------------------------- nvidia_stack

def _templar(variables: dict):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    templar = Templar(loader=DataLoader(), variables=variables)
    return lambda text: templar.template(trust_as_template(text))


def _role_tasks(role: str, file: str) -> list[dict]:
    return yaml.safe_load((REPO / "roles" / role / "tasks" / file).read_text())


def _task(tasks: list[dict], name: str) -> dict:
    return next(t for t in tasks if t["name"] == name)


def _nvidia_vars(nvswitch: bool) -> dict:
    defaults = yaml.safe_load((REPO / "roles/nvidia_stack/defaults/main.yml").read_text())
    variables = {**defaults, "nvidia_stack_nvswitch": nvswitch}
    render = _templar(variables)
    variables["nvidia_stack_driver_packages"] = [render(p) for p in defaults["nvidia_stack_driver_packages"]]
    facts = _task(_role_tasks("nvidia_stack", "main.yml"),
                  "Read this node's layout from the cluster model and name the packages")["ansible.builtin.set_fact"]
    for name in ("_nvidia_stack_driver_specs", "_nvidia_stack_fm_pair"):
        variables[name] = _templar(variables)(facts[name])
    return variables


@pytest.mark.parametrize("nvswitch", [True, False])
def test_every_driver_package_and_fm_is_asked_for_at_exactly_the_driver_version(nvswitch):
    specs = _nvidia_vars(nvswitch)["_nvidia_stack_driver_specs"]
    assert specs == ["nvidia-headless-550-open=550.127.08-*", "nvidia-utils-550=550.127.08-*"] + (
        ["nvidia-fabricmanager-550=550.127.08-*"] if nvswitch else [])
    install = _task(_role_tasks("nvidia_stack", "packages.yml"),
                    "Install the driver and Fabric Manager at the exact driver version")["clusterctl.infra.apt_packages"]
    assert install["name"] == "{{ _nvidia_stack_driver_specs }}" and install["allow_downgrade"] is True


SKEW_TASK = "Check that the driver and Fabric Manager are exactly the pinned version"


@pytest.mark.parametrize(("lines", "skewed"), [
    (["nvidia-kernel-common-550\t550.127.08-0ubuntu1", "nvidia-fabricmanager-550\t550.127.08-1"], []),
    (["nvidia-kernel-common-550\t550.90.07-0ubuntu1", "nvidia-fabricmanager-550\t550.127.08-1"],
     ["nvidia-kernel-common-550=550.90.07-0ubuntu1"]),
    (["nvidia-kernel-common-550\t550.127.08-0ubuntu1"], ["nvidia-fabricmanager-550=(none)"]),
    (["nvidia-kernel-common-550\t550.127.080-1", "nvidia-fabricmanager-550\t550.127.08-1"],
     ["nvidia-kernel-common-550=550.127.080-1"]),
])
def test_the_skew_check_names_every_package_off_the_pin(lines, skewed):
    variables = _nvidia_vars(True)
    variables["_nvidia_stack_versions"] = {"stdout_lines": lines}
    task = _task(_role_tasks("nvidia_stack", "packages.yml"), SKEW_TASK)
    assert _templar(variables)(task["vars"]["_skewed"]) == skewed


def test_installed_packages_are_read_from_dpkg_query():
    variables = {"_nvidia_stack_dpkg": {"stdout_lines": [
        "cuda-keyring\t1.1-1\tinstalled", "nvidia-kernel-common-550\t550.90.07-0ubuntu1\tinstalled",
        "nvidia-fabricmanager-550\t550.127.08-1\tconfig-files", "garbage line"]}}
    task = _task(_role_tasks("nvidia_stack", "packages.yml"), "Work out what is installed")
    found = _templar(variables)(task["ansible.builtin.set_fact"]["_nvidia_stack_installed"])
    assert found == {"cuda-keyring": "1.1-1", "nvidia-kernel-common-550": "550.90.07-0ubuntu1"}


def test_cuda_keyring_files_deleted_by_hand_are_reinstalled_with_force_confmiss():
    """dpkg --verify's "missing" lines (in the dpkg-query run) name what to restore; nothing else does."""
    lines = ["cuda-keyring\t1.1-1\tinstalled", "missing   c /etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list",
             "??5??????   /usr/share/keyrings/cuda-archive-keyring.gpg"]
    tasks = _role_tasks("nvidia_stack", "packages.yml")
    restore = _task(tasks, "Restore the cuda-keyring files deleted by hand")
    missing = _templar({"_nvidia_stack_dpkg": {"stdout_lines": lines}})(restore["vars"]["_nvidia_stack_keyring_missing"])
    assert missing == ["/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list"]
    assert _templar({"_nvidia_stack_dpkg": {"stdout_lines": lines[:1]}})(
        restore["vars"]["_nvidia_stack_keyring_missing"]) == []
    found = _templar({"_nvidia_stack_dpkg": {"stdout_lines": lines}})(
        _task(tasks, "Work out what is installed")["ansible.builtin.set_fact"]["_nvidia_stack_installed"])
    assert found == {"cuda-keyring": "1.1-1"}, "dpkg --verify's lines are not packages"
    reinstall = restore["block"][-1]["ansible.builtin.command"]["argv"]
    assert reinstall[:3] == ["dpkg", "--install", "--force-confmiss"]
    refresh = _task(tasks, "Refresh the apt lists after the repository entry changed")
    assert "_nvidia_stack_keyring_restored is changed" in refresh["when"]


def test_nvidia_repository_comes_from_cuda_keyring_with_a_forced_refresh():
    tasks = _role_tasks("nvidia_stack", "packages.yml")
    assert not [t for t in tasks if "ansible.builtin.deb822_repository" in t], "no raw key + own .sources (#16)"
    keyring = _task(tasks, "Install cuda-keyring (NVIDIA's repository entry and signing key)")
    assert keyring["ansible.builtin.apt"]["deb"].endswith("/{{ nvidia_stack_keyring_deb }}")
    refresh = _task(tasks, "Refresh the apt lists after the repository entry changed")
    assert refresh["ansible.builtin.apt"] == {"update_cache": True}, "no cache_valid_time: it would skip (#1)"
    assert "_nvidia_stack_keyring is changed" in refresh["when"]
    names = [t["name"] for t in tasks]
    assert names.index(refresh["name"]) < names.index("Install the driver and Fabric Manager at the exact driver version")
    enable = _task(tasks, "Enable nvidia-persistenced and, on NVSwitch systems, Fabric Manager")
    assert enable["loop"] == "{{ _nvidia_stack_daemons }}" and enable["ansible.builtin.systemd_service"]["enabled"]
    daemons = _task(_role_tasks("nvidia_stack", "main.yml"), "Read this node's layout from the cluster model and "
                    "name the packages")["ansible.builtin.set_fact"]["_nvidia_stack_daemons"]
    assert "nvidia-fabricmanager.service" in daemons


def _driver_state(loaded: str, installed: dict[str, str], pin: str = "550.127.08") -> dict:
    """What the role works out from its first command's output on a host with ``loaded`` (the module's version,
    "" for none) and ``installed`` packages, pinned to ``pin``."""
    tasks = _role_tasks("nvidia_stack", "packages.yml")
    lines = ([f"{name}\t{version}\tinstalled" for name, version in installed.items()]
             + ["running-kernel\t6.8.0-45-generic", f"loaded-nvidia-module\t{loaded}"])
    variables = {"_nvidia_stack_dpkg": {"stdout_lines": lines}, "nvidia_stack_driver_version": pin,
                 "_nvidia_stack_fm_pair": ["nvidia-kernel-common-550", "nvidia-fabricmanager-550"]}
    work_out = _task(tasks, "Work out what is installed")
    render = _templar(variables)
    render = _templar({**variables, **{k: render(v) for k, v in work_out["vars"].items()}})
    facts = {k: render(v) for k, v in work_out["ansible.builtin.set_fact"].items()}
    note = _task(tasks, "Note whether the loaded NVIDIA driver is the pinned one")["ansible.builtin.set_fact"]
    render = _templar({**variables, **facts})
    return {**facts, **{k: render(v) for k, v in note.items()}}


@pytest.mark.parametrize(("loaded", "reason"), [
    ("550.90.07", "NVIDIA driver: loaded 550.90.07, pinned 550.127.08"),  # the packages are at the pin already
    ("", "NVIDIA driver: loaded none, pinned 550.127.08"),
])
def test_the_driver_reboot_reason_comes_from_the_loaded_module_on_every_run(loaded, reason):
    """A run that failed after the install, or a node that came with another driver, still needs the reboot:
    the reason is the loaded module against the pin, not whether this run's apt changed something."""
    state = _driver_state(loaded, {"nvidia-kernel-common-550": "550.127.08-0ubuntu1",
                                   "nvidia-fabricmanager-550": "550.127.08-1"})
    assert state["_nvidia_stack_reboot_reasons"] == [reason]
    assert state["_nvidia_stack_driver_ready"] is False and state["_nvidia_stack_at_pin"] is True
    assert state["_nvidia_stack_kernel"] == "6.8.0-45-generic"
    ready = _driver_state("550.127.08", {"nvidia-kernel-common-550": "550.90.07-0ubuntu1"})
    assert ready["_nvidia_stack_reboot_reasons"] == [] and ready["_nvidia_stack_driver_ready"] is True
    assert ready["_nvidia_stack_at_pin"] is False


def test_the_daemons_are_enabled_but_started_only_on_the_pinned_driver_and_verified_after_the_reboot():
    tasks = _role_tasks("nvidia_stack", "packages.yml")
    names = [t["name"] for t in tasks]
    headers = _task(tasks, "Install the running kernel's headers before the driver")
    assert headers["clusterctl.infra.apt_packages"]["name"] == ["linux-headers-{{ _nvidia_stack_kernel }}"]
    assert names.index(headers["name"]) < names.index("Install the driver and Fabric Manager at the exact driver "
                                                      "version")
    assert "state" not in _task(tasks, "Enable nvidia-persistenced and, on NVSwitch systems, Fabric Manager")[
        "ansible.builtin.systemd_service"]
    start = _task(tasks, "Start nvidia-persistenced and Fabric Manager on the pinned driver")
    assert "_nvidia_stack_driver_ready | bool" in start["when"]
    handler = yaml.safe_load((REPO / "roles/nvidia_stack/handlers/main.yml").read_text())[0]
    assert any("_nvidia_stack_driver_ready" in condition for condition in handler["when"])
    reboot = yaml.safe_load((REPO / "playbooks/tasks/reboot.yml").read_text())
    verify = _task(reboot, "Verify the NVIDIA driver the node booted into")
    assert verify["ansible.builtin.include_role"] == {"name": "nvidia_stack", "tasks_from": "verify.yml",
                                                       "apply": {"tags": ["always"]}}
    assert [t["name"] for t in reboot].index("Reboot the host") < [t["name"] for t in reboot].index(verify["name"])


def test_check_mode_previews_a_driver_bump_without_the_skew_check_or_unit_lookups():
    tasks = _role_tasks("nvidia_stack", "packages.yml")
    # the old pin file stays in check mode: apt would find no candidate for the new pin
    for name in ("Install the driver and Fabric Manager at the exact driver version", "Install the CUDA toolkit and NCCL"):
        assert _task(tasks, name)["when"] == "not ansible_check_mode or _nvidia_stack_apt_resolves | bool"
    note = _task(tasks, "Note whether the loaded NVIDIA driver is the pinned one")["ansible.builtin.set_fact"]
    assert "_nvidia_stack_pins is not changed" in note["_nvidia_stack_apt_resolves"]
    assert _task(_role_tasks("nvidia_stack", "main.yml"), "Pin the driver, Fabric Manager and NCCL versions and write "
                 "/etc/nccl.conf")["register"] == "_nvidia_stack_pins"
    assert _task(tasks, "Check that the driver and Fabric Manager are exactly the pinned version")["when"] == (
        "not ansible_check_mode")
    for name in ("Enable nvidia-persistenced and, on NVSwitch systems, Fabric Manager",
                 "Start nvidia-persistenced and Fabric Manager on the pinned driver"):
        when = _task(tasks, name)["when"]
        assert "not ansible_check_mode or _nvidia_stack_at_pin | bool" in ([when] if isinstance(when, str) else when)


def test_iu_units_start_after_fabric_manager_with_writable_dirs():
    unit = (GOLDEN / "vllm-iu@.service").read_text()
    after = re.search(r"^After=(.*)$", unit, re.M).group(1).split()
    assert {"nvidia-fabricmanager.service", "nvidia-persistenced.service"} <= set(after)
    assert "StateDirectory=vllm-iu/%i" in unit and "CacheDirectory=vllm-iu/%i" in unit
    assert re.search(r"^Environment=.*\bHOME=/var/lib/vllm-iu/%i\b.*\bCUDA_DEVICE_ORDER=PCI_BUS_ID\b", unit, re.M)
    assert "VLLM_PORT" not in (GOLDEN / "vllm-iu-r01n01-0.env").read_text()


def test_persistence_dropin_replaces_the_packaged_no_persistence_exec_start():
    text = (REPO / "roles/nvidia_stack/templates/persistenced.conf.j2").read_text()
    lines = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    assert lines[0] == "ExecStart=" and "--persistence-mode" in lines[1] and "--no-persistence-mode" not in lines[1]


# --------------------------------------------------------------------------------------- RoCE

def _roce_script(tmp_path: Path) -> tuple[Path, Path]:
    """The rendered boot script with /sys/class/net and mlnx_qos under tmp_path, and a PATH dir for stubs."""
    root, bin_dir = tmp_path / "root", tmp_path / "bin"
    bin_dir.mkdir()
    text = (GOLDEN / "roce-dcqcn.sh").read_text()
    text = text.replace("/sys/class/net/", f"{root}/sys/class/net/").replace("/usr/bin/mlnx_qos", f"{bin_dir}/mlnx_qos")
    text = re.sub(r"-le 30 \]", "-le 1 ]", text).replace("sleep 1", "sleep 0.01")
    script = tmp_path / "roce-dcqcn"
    script.write_text(text)
    script.chmod(0o755)
    return script, bin_dir


NETDEVS = ("enp26s0np0", "enp60s0np0", "enp156s0np0", "enp188s0np0")


def _stub(bin_dir: Path, name: str, log: Path) -> None:
    (bin_dir / name).write_text(f"#!/bin/sh\necho {name} \"$@\" >> {log}\n")
    (bin_dir / name).chmod(0o755)


def _run(script: Path, bin_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(script)], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"})


def test_roce_on_mlnx_ofed_sets_ecn_pfc_and_dscp(tmp_path):
    script, bin_dir = _roce_script(tmp_path)
    log = tmp_path / "calls"
    _stub(bin_dir, "mlnx_qos", log)
    for netdev in NETDEVS:
        for role in ("roce_np", "roce_rp"):
            enable = tmp_path / "root/sys/class/net" / netdev / "ecn" / role / "enable"
            enable.mkdir(parents=True)
            (enable / "3").write_text("0\n")
    done = _run(script, bin_dir)
    assert done.returncode == 0, done.stderr
    for netdev in NETDEVS:
        assert (tmp_path / f"root/sys/class/net/{netdev}/ecn/roce_rp/enable/3").read_text().strip() == "1"
    calls = log.read_text().splitlines()
    assert f"mlnx_qos -i {NETDEVS[0]} --trust dscp --pfc 0,0,0,1,0,0,0,0" in calls
    assert f"mlnx_qos -i {NETDEVS[0]} --dscp2prio set,26,3" in calls


def test_roce_on_ofed_without_mlnx_qos_fails_loudly(tmp_path):
    script, bin_dir = _roce_script(tmp_path)
    for netdev in NETDEVS:
        (tmp_path / "root/sys/class/net" / netdev / "ecn/roce_np/enable").mkdir(parents=True)
    done = _run(script, bin_dir)
    assert done.returncode != 0 and "mlnx_qos" in done.stderr and NETDEVS[0] in done.stderr


def test_roce_on_inbox_rdma_core_uses_dcb(tmp_path):
    script, bin_dir = _roce_script(tmp_path)
    log = tmp_path / "calls"
    _stub(bin_dir, "dcb", log)
    for netdev in NETDEVS:
        (tmp_path / "root/sys/class/net" / netdev).mkdir(parents=True)  # inbox mlx5: no ecn directory
    done = _run(script, bin_dir)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    for netdev in NETDEVS:
        assert f"dcb pfc set dev {netdev} prio-pfc all:off 3:on" in calls
        assert f"dcb app replace dev {netdev} dscp-prio 26:3" in calls


def test_roce_with_neither_stack_fails_naming_the_port(tmp_path):
    script, bin_dir = _roce_script(tmp_path)
    for netdev in NETDEVS:
        (tmp_path / "root/sys/class/net" / netdev).mkdir(parents=True)
    done = subprocess.run([str(script)], capture_output=True, text=True, timeout=30,
                          env={"PATH": str(bin_dir) + ":/nonexistent"})
    assert done.returncode != 0
    assert f"{NETDEVS[0]}: neither MLNX_OFED" in done.stderr and "stays lossy" in done.stderr


def test_roce_fails_when_a_netdev_never_appears(tmp_path):
    script, bin_dir = _roce_script(tmp_path)
    _stub(bin_dir, "dcb", tmp_path / "calls")
    done = _run(script, bin_dir)
    assert done.returncode != 0 and f"{NETDEVS[0]}: no such network interface" in done.stderr


# ------------------------------------------------------------------------------------ Redfish

def _filters():
    spec = importlib.util.spec_from_file_location("redfish_bios", REPO / "playbooks/filter_plugins/redfish_bios.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("manufacturer", "vendor"), [
    ("Dell Inc.", "dell"), ("HPE", "hpe"), ("HP", "hpe"), ("Supermicro", "supermicro"), ("Super Micro", "supermicro"),
    ("Lenovo", "lenovo"), ("NVIDIA", ""), ("", ""), (None, ""), ("Hpecorp", ""),
])
def test_vendor_from_manufacturer(manufacturer, vendor):
    assert _filters().redfish_vendor(manufacturer) == vendor


def test_plan_resolves_supermicro_suffixes_and_reports_missing():
    plan = _filters().redfish_bios_plan(
        {"CPUC6Report": "Disable", "EnhancedHaltState(C1E)": "Disable", "NoSuchKnob": "Off"},
        {"CPUC6Report#0840": "Enable", "EnhancedHaltState(C1E)#0841": "Disable"}, {})
    assert plan == {"patch": {"CPUC6Report#0840": "Disable"}, "missing": ["NoSuchKnob"], "already_pending": []}


def test_plan_picks_the_bios_spelling_and_counts_pending():
    f = _filters()
    wanted = {"Processors_CStates": ["Disabled", "Disable"]}
    assert f.redfish_bios_plan(wanted, {"Processors_CStates": "Enable"}, {})["patch"] == {"Processors_CStates": "Disable"}
    assert f.redfish_bios_plan(wanted, {"Processors_CStates": "Enabled"}, {})["patch"] == {"Processors_CStates": "Disabled"}
    pending = f.redfish_bios_plan(wanted, {"Processors_CStates": "Enable"}, {"Processors_CStates": "Disable"})
    assert pending == {"patch": {}, "missing": [], "already_pending": ["Processors_CStates"]}


def test_plan_treats_an_ambiguous_suffix_match_as_missing():
    plan = _filters().redfish_bios_plan({"X": "1"}, {"X#0001": "0", "X#0002": "0"}, {})
    assert plan["patch"] == {} and plan["missing"] == ["X"]


# --------------------------------------------------------------------------------- reboot path

def test_recap_lists_reboot_pending_hosts_and_rebooted_ones():
    plan = Plan.__new__(Plan)
    rollout = Rollout.__new__(Rollout)
    rollout.__dict__.update(plan=plan, hosts={}, batches_started=0, stats=None, messages=[], reboot_pending={},
                            rebooted=[], diffs=[])
    for host, task, res in [
        ("n1", "Reboot pending", {"msg": "reboot pending: NVIDIA driver 550.127.08 installed (was none)"}),
        ("n2", "Reboot the host", {"changed": True, "rebooted": True}),
        ("n3", "Some task", {"msg": "reboot pending: not from the reboot task"}),
    ]:
        rollout.handle({"event": "runner_on_ok", "event_data": {"host": host, "task": task, "res": res}})
    assert rollout.reboot_pending == {"n1": "NVIDIA driver 550.127.08 installed (was none)"}
    assert rollout.rebooted == ["n2"]
    assert rollout.reboot_line() == ("reboot pending on 1 host (rerun with --allow-reboot): "
                                     "n1 (NVIDIA driver 550.127.08 installed (was none))")


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
    left to playbooks/consul-servers-reboot.yml (one at a time; tests/consul_agent/test_server_reboots.py).
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


@pytest.mark.parametrize(("deb", "installed", "runs"), [
    ("cuda-keyring_1.1-1_all.deb", {"cuda-keyring": "1.1-1"}, False),   # converged: no fetch, no apt cache
    ("cuda-keyring_1.1-1_all.deb", {"cuda-keyring": "1.0-1"}, True),    # another version: install the deb
    ("cuda-keyring_1.1-1_all.deb", {}, True),                           # fresh host
    ("keyring-latest.deb", {"cuda-keyring": "1.1-1"}, True),             # no version in the name: always apt
])
def test_the_cuda_keyring_deb_is_skipped_only_when_dpkg_has_its_version(deb, installed, runs):
    keyring = _task(_role_tasks("nvidia_stack", "packages.yml"), "Install cuda-keyring (NVIDIA's repository entry and signing key)")
    variables = {"nvidia_stack_keyring_deb": deb, "_nvidia_stack_installed": installed}
    variables.update({k: _templar(variables)(v) for k, v in keyring["vars"].items()})
    assert _templar(variables)("{{ " + keyring["when"] + " }}") is runs


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


def test_ius_wait_for_the_pinned_driver_and_a_start_limit_hit_before_does_not_block_the_rerun():
    tasks = _role_tasks("inference_unit", "main.yml")
    names = [t["name"] for t in tasks]
    start = _task(tasks, "Enable and start each IU")
    assert start["ansible.builtin.systemd_service"]["state"] == (
        "{{ 'started' if _nvidia_stack_driver_ready | default(true) | bool else omit }}")
    reset = _task(tasks, "Clear the start limit of IUs that failed before")
    assert names.index(reset["name"]) < names.index(start["name"])
    argv = _templar({"_inference_unit_node": {"ius": [{"index": 0}, {"index": 1}]}})(
        reset["ansible.builtin.command"]["argv"])
    assert argv == ["systemctl", "reset-failed", "vllm-iu@0.service", "vllm-iu@1.service"]
