"""nvidia_stack under Secure Boot: the role reads ``mokutil --sb-state`` in its first command and stops before apt,
naming the host and the MOK enrollment, when the module DKMS would build could not load; a host already running
the pinned module (a trusted key), a host without Secure Boot and an operator who enrolled the key go on."""

from __future__ import annotations

import pytest
import yaml

from tests.helpers import REPO, role_tasks

pytestmark = pytest.mark.unit

PIN = "550.127.08"


def _templar(variables: dict):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    templar = Templar(loader=DataLoader(), variables=variables)
    return lambda text: templar.template(trust_as_template(text))


TASKS = role_tasks("nvidia_stack", "packages.yml")


def _task(name: str) -> dict:
    return next(t for t in TASKS if t["name"] == name)


def gate(sb_state: str, loaded: str, enrolled: bool = False) -> tuple[bool, str]:
    """(passes, message) of the Secure Boot assert on a host whose probe printed ``sb_state`` and ``loaded``."""
    lines = ["nvidia-kernel-common-550\t550.127.08-0ubuntu1\tinstalled", "running-kernel\t6.8.0-45-generic",
             f"loaded-nvidia-module\t{loaded}", f"secure-boot\t{sb_state}"]
    variables = {"_nvidia_stack_dpkg": {"stdout_lines": lines}, "nvidia_stack_driver_version": PIN,
                 "_nvidia_stack_fm_pair": ["nvidia-kernel-common-550"], "inventory_hostname": "r01n02",
                 "nvidia_stack_secure_boot_key_enrolled": enrolled}
    work_out = _task("Work out what is installed")
    render = _templar(variables)
    render = _templar({**variables, **{k: render(v) for k, v in work_out["vars"].items()}})
    variables.update({k: render(v) for k, v in work_out["ansible.builtin.set_fact"].items()})
    note = _task("Note whether the loaded NVIDIA driver is the pinned one")["ansible.builtin.set_fact"]
    render = _templar(variables)
    variables["_nvidia_stack_driver_ready"] = render(note["_nvidia_stack_driver_ready"])
    check = _task("Stop before installing a driver that Secure Boot would refuse to load")["ansible.builtin.assert"]
    render = _templar(variables)
    return render("{{ " + check["that"] + " }}"), " ".join(render(check["fail_msg"]).split())


def test_a_fresh_host_with_secure_boot_stops_naming_host_and_enrollment():
    passes, message = gate("SecureBoot enabled ", "")  # the probe joins mokutil's lines with spaces
    assert passes is False
    assert message.startswith("r01n02: Secure Boot is enabled (mokutil --sb-state)")
    assert "Key was rejected by service" in message and "mokutil --import /var/lib/dkms/mok.pub" in message
    assert "nvidia_stack_secure_boot_key_enrolled: true" in message


@pytest.mark.parametrize("sb_state, loaded, enrolled", [
    ("SecureBoot disabled", "", False),
    ("EFI variables are not supported on this system", "", False),  # legacy BIOS boot (mokutil's own error)
    ("sh: 1: mokutil: not found", "", False),
    ("SecureBoot enabled", PIN, False),  # the pinned module loaded under Secure Boot: its key is trusted
    ("SecureBoot enabled", "550.90.07", True),
    ("SecureBoot enabled SecureBoot validation is disabled in shim ", "", False),  # the kernel does not enforce
])
def test_hosts_whose_module_can_load_go_on(sb_state, loaded, enrolled):
    assert gate(sb_state, loaded, enrolled)[0] is True


def test_the_gate_comes_before_any_package_is_installed():
    names = [t["name"] for t in TASKS]
    first_package = next(i for i, t in enumerate(TASKS) if any(k.endswith(("apt", "package")) for k in t))
    assert names.index("Stop before installing a driver that Secure Boot would refuse to load") < first_package


@pytest.mark.parametrize("secure_boot, named", [(True, True), (False, False)])
def test_a_node_back_without_its_driver_under_secure_boot_is_told_why(secure_boot, named):
    verify = yaml.safe_load((REPO / "roles/nvidia_stack/tasks/verify.yml").read_text())
    check = next(t for t in verify if t["name"] == "Check that the node booted into the pinned NVIDIA driver")
    render = _templar({"inventory_hostname": "r01n02", "nvidia_stack_driver_version": PIN,
                       "_nvidia_stack_secure_boot": secure_boot, "_nvidia_stack_loaded_after_reboot": {"stdout": ""}})
    message = " ".join(render(check["ansible.builtin.assert"]["fail_msg"]).split())
    assert message.startswith(f"r01n02: after the reboot the loaded NVIDIA driver is none, pinned {PIN}")
    assert ("Secure Boot is enabled (mokutil --sb-state)" in message) is named
    assert ("mokutil --import" in message) is named
