"""Simulated hosts: up/down idempotent and leak-free, the host's view, writes contained, guards loud."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from sim.hosts import namespaces, simulate
from tests.helpers import run_cli
from tests.virtual.conftest import needs_root, run_on, sim_mounts

pytestmark = needs_root


def test_up_down_is_idempotent_and_leaves_no_mounts(make_inventory, capsys):
    directory = make_inventory(4, 2)
    try:
        for _ in range(2):  # up runs down first: a second up replaces the first
            code, out, err = run_cli(capsys, "virtual", "up", str(directory))
            assert code == 0, err
            assert "4 simulated hosts up" in out
            assert len([p for p in sim_mounts(directory) if p.endswith(".mnt")]) == 4
        assert run_on(directory, "r01n02", "hostname").stdout == "r01n02\n"
        code, out, _ = run_cli(capsys, "virtual", "status", str(directory))
        assert code == 0 and out.splitlines()[0].split() == ["r01n01", "up", "healthy"]
        assert "nvlink_down(gpus=[2, 3])" in out
    finally:
        for _ in range(2):
            code, _, err = run_cli(capsys, "virtual", "down", str(directory))
            assert code == 0, err
    assert sim_mounts(directory) == []
    assert not (directory / ".sim" / "r01n01").exists()
    assert run_cli(capsys, "virtual", "status", str(directory))[1] == f"{directory}: no simulated hosts up\n"


def test_down_recovers_from_a_killed_up(make_inventory):
    """A run killed half way (mounts made, wrappers missing) is cleaned up by the next down or up."""
    directory = make_inventory(2, 1, faults="none")
    state_dir = namespaces.state_dir_of(directory)
    try:
        simulate.up(directory)
        (state_dir / "r01n02" / "run").unlink()  # as if killed before the last host was written
        assert sim_mounts(directory)
        simulate.up(directory)
        assert run_on(directory, "r01n02", "hostname").stdout == "r01n02\n"
    finally:
        simulate.down(directory)
    assert sim_mounts(directory) == []


def test_down_ends_processes_left_inside_a_host(up_inventory):
    directory = up_inventory(2, 1, faults="none")
    wrapper = namespaces.state_dir_of(directory) / "r01n01" / "run"
    sleeper = subprocess.Popen([str(wrapper), "sleep", "300"])
    try:
        time.sleep(0.3)
        simulate.down(directory)
        assert sleeper.wait(timeout=5) == -9
    finally:
        if sleeper.poll() is None:
            sleeper.kill()


def test_the_host_sees_a_gpu_server(up_inventory):
    directory = up_inventory(2, 1, faults="none")
    script = (
        "hostname; grep -c ^processor /proc/cpuinfo; grep MemTotal /proc/meminfo; . /etc/os-release; "
        "echo $PRETTY_NAME; cat /sys/devices/system/node/node1/cpulist; ls /sys/class/infiniband; "
        "cat /sys/bus/pci/devices/0000:9a:00.0/vendor /sys/bus/pci/devices/0000:9a:00.0/numa_node; "
        "cat /sys/class/infiniband/mlx5_0/ports/1/rate; cat /proc/cmdline; command -v nvidia-smi; "
        "ls /sys/class/net"
    )
    out = run_on(directory, "r01n02", "sh", "-c", script).stdout.splitlines()
    assert out[0] == "r01n02"
    assert out[1] == "192"
    assert out[2].split()[1] == str((2048 - 16) * 1024 * 1024)
    assert out[3] == "Ubuntu 22.04.4 LTS"
    assert out[4] == "48-95,144-191"
    assert out[5:9] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert out[9:11] == ["0x10de", "1"]
    assert out[11] == "400 Gb/sec (4X NDR)"
    assert "intel_idle.max_cstate=0" in out[12]
    assert out[13] == "/usr/local/bin/nvidia-smi"
    assert {"lo", "ibp26s0", "ibp188s0"} <= set(out[14:])  # the real interfaces stay, the HCAs' join
    assert Path("/proc/cmdline").read_text() != out[12] + "\n"  # the machine's own view is untouched


def test_writes_land_in_the_overlay_only(up_inventory):
    directory = up_inventory(2, 1, faults="none")
    marker = f"/etc/clusterctl-sim-test-{os.getpid()}"
    result = run_on(directory, "r01n01", "sh", "-c", f"echo hello > {marker} && mkdir -p /opt/x /var/lib/x && cat {marker}")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello\n"
    assert not Path(marker).exists() and not Path("/opt/x").exists() and not Path("/var/lib/x").exists()
    upper = namespaces.HostPaths(namespaces.state_dir_of(directory), "r01n01").upper("etc")
    assert (upper / Path(marker).name).read_text() == "hello\n"
    assert run_on(directory, "r01n02", "test", "-e", marker).returncode == 1  # hosts do not share /etc


@pytest.mark.parametrize(
    ("command", "expected_error"),
    [
        ("sysctl -w vm.swappiness=11", "permission denied"),  # /proc/sys is read-only
        ("echo 1 > /sys/devices/system/cpu/cpu0/cpuidle/state3/disable", "Read-only file system"),
        ("echo 1 > /sys/kernel/mm/transparent_hugepage/enabled", "Read-only file system"),
        ("touch /usr/clusterctl-sim-test", "Read-only file system"),
        ("date -s 2001-01-01", "Operation not permitted"),  # CAP_SYS_TIME dropped
    ],
)
def test_forgotten_live_actions_fail_loudly(up_inventory, command, expected_error):
    directory = up_inventory(1, 1, faults="none")
    result = run_on(directory, "r01n01", "sh", "-c", command)
    assert result.returncode != 0
    assert expected_error.lower() in result.stderr.lower()
    assert Path("/proc/sys/vm/swappiness").read_text().strip() != "11"


def test_boot_and_module_capabilities_are_dropped(up_inventory):
    directory = up_inventory(1, 1, faults="none")
    status = run_on(directory, "r01n01", "grep", "CapBnd", "/proc/self/status").stdout
    bounding = int(status.split()[1], 16)
    for cap in (16, 22, 25):  # CAP_SYS_MODULE, CAP_SYS_BOOT, CAP_SYS_TIME
        assert not bounding & (1 << cap)
    assert bounding & (1 << 21)  # CAP_SYS_ADMIN stays: roles may mount, systemctl may run offline


def test_unreachable_host_fails_like_ssh(up_inventory):
    directory = up_inventory(2, 1, faults="none", host_vars={"r01n02": "sim_faults: [{kind: unreachable}]\n"})
    result = run_on(directory, "r01n02", "true")
    assert result.returncode == 255
    assert result.stderr == "ssh: connect to host 127.0.1.12 port 22: No route to host\n"
    python = namespaces.state_dir_of(directory) / "r01n02" / "python"
    assert subprocess.run([str(python), "-c", "pass"], capture_output=True).returncode == 255
    assert run_on(directory, "r01n01", "true").returncode == 0


def test_state_dir_under_an_overlaid_directory_is_refused(tmp_path):
    with pytest.raises(namespaces.NamespaceError, match="cannot live under /opt"):
        namespaces.up(Path("/opt/clusterctl/inventory/.sim"), {})
