"""The nvidia_stack role's tasks, templated in-process: every driver package and Fabric Manager at exactly the
driver version, the skew check, dpkg-query as the source of what is installed, the CUDA keyring, the IU units'
ordering and the persistence daemon's drop-in."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.helpers import GOLDEN, REPO, role_tasks

pytestmark = pytest.mark.unit


def _templar(variables: dict):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    templar = Templar(loader=DataLoader(), variables=variables)
    return lambda text: templar.template(trust_as_template(text))


def _role_tasks(role: str, file: str) -> list[dict]:
    return role_tasks(role, file)


def _task(tasks: list[dict], name: str) -> dict:
    return next(t for t in tasks if t["name"] == name)


def _nvidia_vars(nvswitch: bool, **overrides) -> dict:
    defaults = yaml.safe_load((REPO / "roles/nvidia_stack/defaults/main.yml").read_text())
    variables = {**defaults, "nvidia_stack_nvswitch": nvswitch, **overrides}
    render = _templar(variables)
    variables["nvidia_stack_driver_packages"] = [render(p) for p in defaults["nvidia_stack_driver_packages"]]
    facts = _task(_role_tasks("nvidia_stack", "main.yml"),
                  "Read this node's layout from the cluster model and name the packages")["ansible.builtin.set_fact"]
    for name in ("_nvidia_stack_driver_specs", "_nvidia_stack_fm_pair", "_nvidia_stack_dcgm_names",
                 "_nvidia_stack_daemons"):
        variables[name] = _templar(variables)(facts[name])
    return variables


@pytest.mark.parametrize("nvswitch", [True, False])
def test_every_driver_package_and_fm_is_asked_for_at_exactly_the_driver_version(nvswitch):
    specs = _nvidia_vars(nvswitch)["_nvidia_stack_driver_specs"]
    assert specs == ["nvidia-headless-550-open=550.127.08-*", "nvidia-utils-550=550.127.08-*"] + (
        ["nvidia-fabricmanager-550=550.127.08-*", "libnvidia-nscq-550=550.127.08-*"] if nvswitch else [])
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
    assert not [t for t in tasks if "ansible.builtin.deb822_repository" in t], "no raw key + own .sources"
    keyring = _task(tasks, "Install cuda-keyring (NVIDIA's repository entry and signing key)")
    assert keyring["ansible.builtin.apt"]["deb"].endswith("/{{ nvidia_stack_keyring_deb }}")
    refresh = _task(tasks, "Refresh the apt lists after the repository entry changed")
    assert refresh["ansible.builtin.apt"] == {"update_cache": True}, "no cache_valid_time: it would skip"
    assert "_nvidia_stack_keyring is changed" in refresh["when"]
    names = [t["name"] for t in tasks]
    assert names.index(refresh["name"]) < names.index("Install the driver and Fabric Manager at the exact driver version")
    enable = _task(tasks, "Enable nvidia-persistenced, DCGM and, on NVSwitch systems, Fabric Manager")
    assert enable["vars"]["_nvidia_stack_units"].startswith("{{ _nvidia_stack_daemons\n")
    assert enable["ansible.builtin.systemd_service"]["enabled"]
    daemons = _task(_role_tasks("nvidia_stack", "main.yml"), "Read this node's layout from the cluster model and "
                    "name the packages")["ansible.builtin.set_fact"]["_nvidia_stack_daemons"]
    assert "nvidia-fabricmanager.service" in daemons


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
    assert "state" not in _task(tasks, "Enable nvidia-persistenced, DCGM and, on NVSwitch systems, Fabric Manager")[
        "ansible.builtin.systemd_service"]
    start = _task(tasks, "Start nvidia-persistenced, DCGM and Fabric Manager on the pinned driver")
    assert "_nvidia_stack_driver_ready | bool" in start["when"]
    handler = yaml.safe_load((REPO / "roles/nvidia_stack/handlers/main.yml").read_text())[0]
    assert any("_nvidia_stack_driver_ready" in condition for condition in handler["when"])
    reboot = yaml.safe_load((REPO / "playbooks/tasks/reboot.yml").read_text())
    verify = _task(reboot, "Verify the NVIDIA driver the node booted into")
    assert verify["ansible.builtin.include_role"] == {"name": "nvidia_stack", "tasks_from": "verify.yml",
                                                       "apply": {"tags": ["always"]}}
    assert [t["name"] for t in reboot].index("Reboot the host") < [t["name"] for t in reboot].index(verify["name"])


@pytest.mark.parametrize("nvswitch", [True, False])
def test_dcgm_is_installed_and_its_host_engine_runs_with_the_other_daemons(nvswitch):
    """preflight's gate runs `dcgmi diag` against nv-hostengine: no image or driver package brings DCGM."""
    variables = _nvidia_vars(nvswitch)
    assert variables["nvidia_stack_dcgm_packages"] == ["datacenter-gpu-manager=1:3.3.9"]
    assert variables["_nvidia_stack_dcgm_names"] == ["datacenter-gpu-manager"]
    assert "nvidia-dcgm.service" in variables["_nvidia_stack_daemons"]
    tasks = _role_tasks("nvidia_stack", "packages.yml")
    install = _task(tasks, "Install DCGM")
    assert install["clusterctl.infra.apt_packages"]["name"] == "{{ nvidia_stack_dcgm_packages }}"
    names = [t["name"] for t in tasks]
    assert names.index("Install DCGM") < names.index("Enable nvidia-persistenced, DCGM and, on NVSwitch systems, "
                                                     "Fabric Manager")
    verify = yaml.safe_load((REPO / "roles/nvidia_stack/tasks/verify.yml").read_text())
    start = next(t for t in verify if t["name"].startswith("Start nvidia-persistenced, DCGM"))
    assert "nvidia-dcgm.service" in _templar(variables)(start["loop"])
    enable = _task(tasks, "Enable nvidia-persistenced, DCGM and, on NVSwitch systems, Fabric Manager")
    for check_mode, installed, listed in [(False, {}, True), (True, {}, False),  # check mode: no unit to look up yet
                                          (True, {"datacenter-gpu-manager": "1:3.3.9"}, True)]:
        state = {**variables, "ansible_check_mode": check_mode, "_nvidia_stack_installed": installed}
        assert enable["loop"] == "{{ _nvidia_stack_units }}"
        assert ("nvidia-dcgm.service" in _templar(state)(enable["vars"]["_nvidia_stack_units"])) is listed
    without = _nvidia_vars(nvswitch, nvidia_stack_dcgm_packages=[])
    assert "nvidia-dcgm.service" not in without["_nvidia_stack_daemons"]
    assert not [spec for spec in without["_nvidia_stack_driver_specs"] if "nscq" in spec]


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
    for name in ("Enable nvidia-persistenced, DCGM and, on NVSwitch systems, Fabric Manager",
                 "Start nvidia-persistenced, DCGM and Fabric Manager on the pinned driver"):
        when = _task(tasks, name)["when"]
        assert "not ansible_check_mode or _nvidia_stack_at_pin | bool" in ([when] if isinstance(when, str) else when)


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
