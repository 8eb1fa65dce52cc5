"""The nvidia_stack role's tasks, templated in-process: every driver package and Fabric Manager at exactly the
driver version, the skew check, dpkg-query as the source of what is installed, the CUDA keyring, the IU units'
ordering and the persistence daemon's drop-in."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.helpers import GOLDEN, REPO

pytestmark = pytest.mark.unit


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
    assert not [t for t in tasks if "ansible.builtin.deb822_repository" in t], "no raw key + own .sources"
    keyring = _task(tasks, "Install cuda-keyring (NVIDIA's repository entry and signing key)")
    assert keyring["ansible.builtin.apt"]["deb"].endswith("/{{ nvidia_stack_keyring_deb }}")
    refresh = _task(tasks, "Refresh the apt lists after the repository entry changed")
    assert refresh["ansible.builtin.apt"] == {"update_cache": True}, "no cache_valid_time: it would skip"
    assert "_nvidia_stack_keyring is changed" in refresh["when"]
    names = [t["name"] for t in tasks]
    assert names.index(refresh["name"]) < names.index("Install the driver and Fabric Manager at the exact driver version")
    services = _task(tasks, "Enable and start nvidia-persistenced and, on NVSwitch systems, Fabric Manager")
    assert "nvidia-fabricmanager.service" in services["loop"] and services["ansible.builtin.systemd_service"]["enabled"]


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
