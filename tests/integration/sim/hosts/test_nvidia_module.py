"""The simulated NVIDIA kernel module: nvidia-smi answers through the loaded module, as the real one does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sim.hosts import create, hardware, nvidia_module

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[4]


def nvidia_smi(tmp_path: Path, loaded: str | None, library: str | None, *args: str) -> subprocess.CompletedProcess:
    """The stub nvidia-smi on a host whose kernel has ``loaded`` and whose nvidia-utils package is ``library``
    (None: the machine's own stub, no package)."""
    run_dir, root = tmp_path / "run", tmp_path / "root"
    run_dir.mkdir()
    hw = hardware.resolve("n1", {"gpu_model": "h100-sxm", "group_names": ["rack_r01"],
                                 "rdma_nics": create.nics("h100-sxm", False)})
    (run_dir / "host.json").write_text(json.dumps({"hardware": hw.to_json()}))
    (run_dir / "calls.log").touch()
    if loaded:
        (root / "sys/module/nvidia").mkdir(parents=True)
        (root / "sys/module/nvidia/version").write_text(loaded + "\n")
    env = {"PATH": "/usr/bin:/bin", "CLUSTERCTL_SIM_RUN_DIR": str(run_dir), nvidia_module.ROOT_ENV: str(root),
           "CLUSTERCTL_SIM_TOOL": "nvidia-smi", "PYTHONPATH": str(ROOT)}
    if library:
        env[nvidia_module.NVML_ENV] = library
    return subprocess.run([sys.executable, "-c", "from sim.hosts.stubs.main import main; main()", *args],
                          capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize("library", [None, "550.127.08"])
def test_nvidia_smi_without_a_loaded_module_cannot_communicate_with_the_driver(tmp_path, library):
    done = nvidia_smi(tmp_path, None, library)
    assert done.returncode == 9
    assert done.stdout.strip() == ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                                   "Make sure that the latest NVIDIA driver is installed and running.")


def test_nvidia_smi_of_a_newer_package_than_the_loaded_module_reports_the_mismatch(tmp_path):
    done = nvidia_smi(tmp_path, "550.90.07", "550.127.08", "-L")
    assert done.returncode == 18
    assert done.stdout.splitlines() == ["Failed to initialize NVML: Driver/library version mismatch",
                                        "NVML library version: 550.127"]


def test_nvidia_smi_reports_the_loaded_module_s_version(tmp_path):
    done = nvidia_smi(tmp_path, "550.127.08", "550.127.08", "--query-gpu=driver_version", "--format=csv,noheader")
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) == {"550.127.08"}


def test_the_boot_unit_loads_the_module_file_of_the_running_kernel():
    unit = nvidia_module.load_unit()
    assert "/lib/modules/$(uname -r)/updates/dkms/nvidia.ko" in unit
    assert "%%s" in unit and "%s" not in unit.replace("%%s", "")  # systemd specifiers escaped


def test_the_seeded_module_is_the_preinstalled_driver_or_none(tmp_path):
    nvidia_module.seed(tmp_path / "a", "550.90.07")
    assert (tmp_path / "a" / nvidia_module.MODULE_FILE).read_text() == "550.90.07\n"
    nvidia_module.seed(tmp_path / "b", "")
    assert not (tmp_path / "b").exists()


def _host_json(run_dir: Path, secure_boot: bool) -> None:
    hw = hardware.resolve("n1", {"gpu_model": "h100-sxm", "group_names": ["rack_r01"], "sim_hardware": {"secure_boot": secure_boot},
                                 "rdma_nics": create.nics("h100-sxm", False)})
    run_dir.mkdir(exist_ok=True)
    (run_dir / "host.json").write_text(json.dumps({"hardware": hw.to_json()}, indent=1))  # as sim.hosts.machines
    (run_dir / "calls.log").touch()


@pytest.mark.parametrize(("secure_boot", "state"), [(True, "SecureBoot enabled"), (False, "SecureBoot disabled")])
def test_mokutil_reports_the_firmware_secure_boot_state(tmp_path, secure_boot, state):
    _host_json(tmp_path, secure_boot)
    env = {"PATH": "/usr/bin:/bin", "CLUSTERCTL_SIM_RUN_DIR": str(tmp_path), "CLUSTERCTL_SIM_TOOL": "mokutil",
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", "from sim.hosts.stubs.main import main; main()", "--sb-state"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert (done.returncode, done.stdout) == (0, state + "\n"), done.stderr


def test_under_secure_boot_the_boot_refuses_the_dkms_module_as_the_kernel_does(tmp_path):
    """The boot unit's own script (systemd's %% undone), pointed at this test's files: under Secure Boot it stops
    with systemd-modules-load's line for EKEYREJECTED before loading anything; without it the check lets it on."""
    script = nvidia_module.load_unit().split("ExecStart=/bin/sh -c '", 1)[1].rsplit("'", 1)[0].replace("%%", "%")
    ko = tmp_path / "nvidia.ko"
    ko.write_text("550.127.08\n")
    script = script.replace("/lib/modules/$(uname -r)/updates/dkms/nvidia.ko", str(ko))
    script = script.replace(nvidia_module.SIM_RUN_DIR, str(tmp_path / "run"))
    _host_json(tmp_path / "run", secure_boot=True)
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stderr) == (0, "Failed to insert module 'nvidia': Key was rejected by service\n")
    _host_json(tmp_path / "run", secure_boot=False)
    guard = script.split("; then", 1)[0].split("if ", 1)[1]
    assert subprocess.run(["/bin/sh", "-c", guard], timeout=30).returncode == 1  # no Secure Boot: the load goes on
