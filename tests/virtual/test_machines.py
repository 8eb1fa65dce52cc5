"""Simulated machines: up/down idempotent and leak-free (also after kill -9), the machine's view, SSH like
production, nothing writable shared with this machine, hostile state dirs and host names refused."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from common.errors import ClusterctlError
from sim.hosts import lifecycle as simulate
from sim.hosts import machines
from tests.helpers import run_cli
from tests.virtual.helpers import leftovers, needs_root, run_on

REPO = Path(__file__).resolve().parents[2]


@needs_root
def test_up_down_is_idempotent_and_leaves_nothing(make_inventory, capsys):
    directory = make_inventory(4, 2)
    try:
        for _ in range(2):  # up runs down first: a second up replaces the first
            code, out, err = run_cli(capsys, "virtual", "up", str(directory))
            assert code == 0, err
            assert "4 machines up" in out
            assert len(machines._our_processes(simulate.layout(directory))[0]) == 4
        assert run_on(directory, "r01n02", "hostname", become=False).stdout == "r01n02\n"
        code, out, _ = run_cli(capsys, "virtual", "status", str(directory))
        assert code == 0 and out.splitlines()[0].split() == ["r01n01", "127.0.1.11", "running", "healthy"]
        assert "nvlink_down(gpus=[2, 3])" in out
    finally:
        for _ in range(2):
            code, _, err = run_cli(capsys, "virtual", "down", str(directory))
            assert code == 0, err
    assert leftovers(directory) == []
    assert run_cli(capsys, "virtual", "status", str(directory))[1] == f"{directory}: no machines\n"


@needs_root
def test_down_after_kill_9_of_the_starter_leaves_no_process_mount_or_overlay(make_inventory):
    directory = make_inventory(2, 1, faults="none")
    starter = subprocess.Popen([sys.executable, "-m", "cli.main", "virtual", "up", str(directory)], cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    layout = simulate.layout(directory)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(machines._our_processes(layout)[1]) < 2:
            time.sleep(0.2)  # both machines' PID 1 exist: the starter is waiting for them to boot
        assert len(machines._our_processes(layout)[1]) == 2
        starter.send_signal(signal.SIGKILL)
        starter.wait()
        assert machines._our_processes(layout)[0], "the machines outlive their starter"
    finally:
        code = subprocess.run([sys.executable, "-m", "cli.main", "virtual", "down", str(directory)], cwd=REPO,
                              capture_output=True, text=True)
    assert code.returncode == 0, code.stderr
    assert leftovers(directory) == []


@needs_root
def test_down_ends_processes_left_inside_a_machine(up_inventory):
    directory = up_inventory(2, 1, faults="none")
    sleeper = subprocess.Popen(simulate.ssh_argv(directory, "r01n01", "sh", "-c", "nohup sleep 300 >/dev/null 2>&1 & echo $!"),
                               stdout=subprocess.PIPE, text=True)
    pid_inside = sleeper.communicate(timeout=30)[0].strip()
    assert pid_inside.isdigit()
    leader = int(simulate.layout(directory).host("r01n01").leader_file.read_text())
    simulate.down(directory)
    assert not Path(f"/proc/{leader}").exists()
    assert leftovers(directory) == []


@needs_root
def test_the_machine_sees_a_gpu_server(up_inventory):
    directory = up_inventory(2, 1, faults="none")
    script = (
        "hostname; grep -c ^processor /proc/cpuinfo; grep MemTotal /proc/meminfo; . /etc/os-release; "
        "echo $PRETTY_NAME; cat /sys/devices/system/node/node1/cpulist; ls /sys/class/infiniband; "
        "cat /sys/bus/pci/devices/0000:9a:00.0/vendor /sys/bus/pci/devices/0000:9a:00.0/numa_node; "
        "cat /sys/class/infiniband/mlx5_0/ports/1/rate; cat /proc/cmdline; command -v nvidia-smi; "
        "ps -p 1 -o comm=; ls /sys/class/net"
    )
    out = run_on(directory, "r01n02", "sh", "-c", script, become=False).stdout.splitlines()
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
    assert out[14] == "systemd"  # a real init: services, handlers and daemon-reload really run
    assert {"lo", "ibp26s0", "ibp188s0"} <= set(out[15:])  # the real interfaces stay, the HCAs' join
    assert Path("/proc/cmdline").read_text() != out[12] + "\n"  # this machine's own view is untouched


@needs_root
def test_ssh_like_production(up_inventory):
    """deploy with a key and passwordless sudo; root login refused; host keys pinned per machine."""
    directory = up_inventory(2, 1, faults="none")
    layout = simulate.layout(directory)
    assert oct(layout.key.stat().st_mode & 0o777) == "0o600"
    assert run_on(directory, "r01n01", "id", "-un").stdout == "root\n"
    assert run_on(directory, "r01n01", "id", "-un", become=False).stdout == "deploy\n"
    argv = machines.ssh_argv(layout, "127.0.1.11", "true")
    as_root = [a.replace("deploy@", "root@") for a in argv]
    refused = subprocess.run(as_root, capture_output=True, text=True, timeout=30)
    assert refused.returncode == 255 and "Permission denied" in refused.stderr
    known = layout.known_hosts.read_text().splitlines()
    assert [line.split()[0] for line in known] == ["127.0.1.11", "127.0.1.12"]
    assert known[0].split()[2] != known[1].split()[2]  # every machine has its own host key
    listening = run_on(directory, "r01n01", "sh", "-c", "cat /proc/net/tcp", become=False).stdout
    # sshd listens on the machine's address only (127.0.1.11 = 0B01007F little-endian), never 0.0.0.0
    local = {line.split()[1] for line in listening.splitlines()[1:] if line.split()[3] == "0A"}
    assert "0B01007F:0016" in local and "00000000:0016" not in local


@needs_root
def test_a_reboot_inside_a_machine_brings_the_same_machine_back(up_inventory, capsys):
    """`reboot` on a host is what a driver change or kernel arguments end in: nspawn exits 133 and the
    harness starts the machine again, as a BMC would, with its overlay (what it wrote) and its address."""
    directory = up_inventory(1, 1, faults="none")
    paths = simulate.layout(directory).host("r01n01")
    boot_id = run_on(directory, "r01n01", "cat", "/proc/sys/kernel/random/boot_id").stdout
    assert run_on(directory, "r01n01", "sh", "-c", "echo kept > /var/tmp/before-reboot").returncode == 0
    old_leader = machines.current_leader(paths)
    run_on(directory, "r01n01", "systemctl", "reboot", "--no-block", timeout=30)  # queued: ssh returns first
    deadline = time.monotonic() + 120
    again = None
    while time.monotonic() < deadline:
        leader = machines.current_leader(paths)
        if leader and leader != old_leader:
            probe = run_on(directory, "r01n01", "cat", "/proc/sys/kernel/random/boot_id", timeout=15)
            if probe.returncode == 0:
                again = probe.stdout
                break
        time.sleep(0.5)
    assert again is not None and again != boot_id, "the machine did not come back with a new boot"
    assert run_on(directory, "r01n01", "cat", "/var/tmp/before-reboot").stdout == "kept\n"
    assert "the machine rebooted (nspawn exit 133)" in paths.console_log.read_text()
    code, out, _ = run_cli(capsys, "virtual", "status", str(directory))
    assert code == 0 and out.splitlines()[0].split()[2] == "running"
    nspawns, leaders, supervisors = machines._our_processes(simulate.layout(directory))
    assert (len(nspawns), len(leaders), len(supervisors)) == (1, 1, 1)


@needs_root
def test_a_changed_host_key_is_refused(up_inventory):
    directory = up_inventory(1, 1, faults="none")
    layout = simulate.layout(directory)
    original = layout.known_hosts.read_text()
    other = subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(directory / "other")], check=True)
    assert other.returncode == 0
    layout.known_hosts.write_text("127.0.1.11 " + " ".join((directory / "other.pub").read_text().split()[:2]) + "\n")
    result = run_on(directory, "r01n01", "true")
    assert result.returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in result.stderr
    from cluster import load_cluster
    from preflight.transport import SshTransport

    node = next(load_cluster(directory).nodes())
    transport = SshTransport()
    try:
        changed = transport.run(node, ["true"], timeout=30)  # preflight's transport: the same verdict
        assert changed.unreachable and "host key for 127.0.1.11 changed" in changed.stderr
    finally:
        transport.close()
    layout.known_hosts.write_text(original)
    assert run_on(directory, "r01n01", "true").returncode == 0
    transport = SshTransport()
    try:
        assert transport.run(node, ["hostname"], timeout=30).stdout == "r01n01\n"
    finally:
        transport.close()


@needs_root
def test_machines_share_nothing_writable_with_this_machine(up_inventory):
    """/etc, /usr and the package database are the machine's own (overlay), /sys is read-only, the clock
    cannot be set; and what the machine wrote lands in its overlay upper dir only."""
    directory = up_inventory(2, 1, faults="none")
    marker = f"clusterctl-sim-test-{os.getpid()}"
    dpkg_before = Path("/var/lib/dpkg/status").read_bytes()
    script = (
        f"echo hello > /etc/{marker} && echo x > /usr/{marker} && echo x > /usr/local/{marker} && "
        f"echo 'Package: {marker}' >> /var/lib/dpkg/status && mkdir -p /opt/{marker} && cat /etc/{marker}"
    )
    result = run_on(directory, "r01n01", "sh", "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "hello\n"
    for path in (f"/etc/{marker}", f"/usr/{marker}", f"/usr/local/{marker}", f"/opt/{marker}"):
        assert not Path(path).exists(), path
    assert Path("/var/lib/dpkg/status").read_bytes() == dpkg_before
    upper = simulate.layout(directory).host("r01n01").upper
    assert (upper / "etc" / marker).read_text() == "hello\n"
    assert run_on(directory, "r01n02", "test", "-e", f"/etc/{marker}").returncode == 1  # nor with each other
    before = time.time()
    for command, error in (("date -s 2001-01-01", "Operation not permitted"),
                           ("echo 1 > /sys/kernel/mm/transparent_hugepage/enabled", "Read-only file system"),
                           ("echo 1 > /sys/devices/system/cpu/cpu0/cpuidle/state3/disable", "Read-only file system"),
                           ("sysctl -w vm.swappiness=11", "")):
        result = run_on(directory, "r01n01", "sh", "-c", command)
        assert result.returncode != 0, command
        assert error.lower() in result.stderr.lower(), (command, result.stderr)
    assert abs(time.time() - before) < 60
    assert Path("/proc/sys/vm/swappiness").read_text().strip() != "11"


@needs_root
def test_root_on_a_roce_machine_sets_the_ecn_knobs_and_nothing_else_in_sys(up_inventory):
    """roce-dcqcn's boot script writes /sys/class/net/<if>/ecn/roce_{np,rp}/enable/<prio> as root, as on an
    mlx5 host: the write holds and lands in the host's simulated tree (where the dcqcn fault and preflight
    read it); the rest of the simulated /sys/class stays read-only. Before, the write failed ('Read-only
    file system') and the unit with it."""
    directory = up_inventory(1, 1, fabric="roce", faults="none")
    netdev = sorted((simulate.layout(directory).host("r01n01").root / "sys" / "class" / "net").glob("*/ecn"))[0].parent
    knob = f"/sys/class/net/{netdev.name}/ecn/roce_np/enable/3"
    result = run_on(directory, "r01n01", "sh", "-c", f"echo 0 > {knob} && cat {knob} && echo 1 > {knob} && cat {knob}")
    assert (result.returncode, result.stdout) == (0, "0\n1\n"), result.stderr
    assert (netdev / "ecn" / "roce_np" / "enable" / "3").read_text() == "1\n"
    result = run_on(directory, "r01n01", "sh", "-c", f"echo 1500 > /sys/class/net/{netdev.name}/mtu")
    assert result.returncode != 0 and "read-only file system" in result.stderr.lower(), result.stderr


@needs_root
def test_unreachable_machine_runs_without_sshd(up_inventory):
    directory = up_inventory(2, 1, faults="none", host_vars={"r01n02": "sim_faults: [{kind: unreachable}]\n"})
    result = run_on(directory, "r01n02", "true")
    assert result.returncode == 255
    assert "Connection refused" in result.stderr
    assert run_on(directory, "r01n01", "true").returncode == 0
    states = {m.name: m.state for m in simulate.status(directory)}
    assert states["r01n02"].startswith("running") and "sshd off" in states["r01n02"]


@needs_root
def test_address_already_in_use_is_named(make_inventory):
    import socket

    directory = make_inventory(1, 1, faults="none")
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past an earlier test's TIME_WAIT
        squatter.bind(("127.0.1.11", 22))
        squatter.listen()
        with pytest.raises(Exception, match=r"127\.0\.1\.11:22: address already in use"):
            simulate.up(directory)
    assert leftovers(directory) == []


# ------------------------------------------------------- hostile state dirs and host names (review H3)


def test_a_symlinked_state_dir_is_refused_and_its_target_untouched(make_inventory, tmp_path):
    directory = make_inventory(1, 1, faults="none")
    victim = tmp_path / "victim"
    (victim / "sub").mkdir(parents=True)
    (victim / "file").write_text("keep me\n")
    (directory / ".sim").symlink_to(victim)
    with pytest.raises(machines.MachineError, match="is a symlink"):
        machines.up(machines.state_dir_of(directory), tmp_path, {})
    with pytest.raises(machines.MachineError, match="is a symlink"):
        machines.down(machines.state_dir_of(directory))
    assert (victim / "file").read_text() == "keep me\n" and (victim / "sub").is_dir()


def test_a_symlinked_host_dir_inside_the_state_dir_is_refused(make_inventory, tmp_path):
    directory = make_inventory(1, 1, faults="none")
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "file").write_text("keep me\n")
    machines_dir = machines.Layout(machines.state_dir_of(directory)).machines_dir
    machines_dir.parent.mkdir(mode=0o700)
    machines_dir.symlink_to(victim)
    with pytest.raises(machines.MachineError, match="is a symlink"):
        machines.down(machines.state_dir_of(directory))
    assert (victim / "file").read_text() == "keep me\n"


def test_a_symlinked_state_dir_is_refused_before_the_need_for_root(make_inventory, tmp_path, monkeypatch):
    """The refusal is about the state dir, so it comes first: not hidden behind "need root" for a user
    who runs `virtual up` without it (before: that user was told only to become root)."""
    directory = make_inventory(1, 1, faults="none")
    (directory / ".sim").symlink_to(tmp_path)
    if os.geteuid() == 0:  # run as someone who is not root, whose inventory this is
        os.chown(directory, 4321, 4321)
        monkeypatch.setattr(os, "geteuid", lambda: 4321)
    with pytest.raises(machines.MachineError, match="is a symlink"):
        machines.up(machines.state_dir_of(directory), tmp_path, {})


@pytest.mark.parametrize("which", ["state dir", "inventory dir"])
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777, 0o722])
def test_a_dir_others_may_write_is_refused(make_inventory, tmp_path, which, mode):
    """Root deletes and writes by path under the state dir; whoever else may write the state dir or the
    inventory dir above it could swap an entry for a symlink between our check and our use."""
    directory = make_inventory(1, 1, faults="none")
    state_dir = machines.state_dir_of(directory)
    state_dir.mkdir(mode=0o700)
    loose = state_dir if which == "state dir" else directory
    loose.chmod(mode)
    for call in (lambda: machines.up(state_dir, tmp_path, {}), lambda: machines.down(state_dir)):
        with pytest.raises(machines.MachineError, match=rf"^{re.escape(str(loose))}: writable by (its group|others)"):
            call()
    assert not (state_dir / "ssh").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory away needs root")
@pytest.mark.parametrize("which", ["state dir", "inventory dir"])
def test_a_dir_owned_by_someone_else_is_refused(make_inventory, tmp_path, which):
    directory = make_inventory(1, 1, faults="none")
    state_dir = machines.state_dir_of(directory)
    state_dir.mkdir(mode=0o700)
    foreign = state_dir if which == "state dir" else directory
    os.chown(foreign, 4321, 4321)
    for call in (lambda: machines.up(state_dir, tmp_path, {}), lambda: machines.down(state_dir)):
        with pytest.raises(machines.MachineError, match=rf"^{re.escape(str(foreign))}: owned by uid 4321"):
            call()


@pytest.mark.parametrize("name", ["../../escaped", "a/b", ".hidden", "-rf", "a..b", "x" * 65, ""])
def test_host_names_that_are_not_host_names_are_refused_before_any_path(name, tmp_path):
    with pytest.raises(machines.MachineError, match="not a valid host name"):
        machines.Layout(tmp_path / ".sim").host(name)
    with pytest.raises(machines.MachineError, match="not a valid host name"):
        machines.up(tmp_path / ".sim", tmp_path, {name: None})
    assert not (tmp_path / ".sim").exists() and not (tmp_path / "escaped").exists()


def test_an_escaping_inventory_host_name_is_one_clear_error(tmp_path):
    (tmp_path / "hosts.yml").write_text("all:\n  children:\n    rack_r01:\n      hosts:\n"
                                        "        '../../escaped': {ansible_host: 127.0.1.11, gpu_model: h100-sxm}\n")
    # refused by inventory validation (cluster.validate.check_host_name) before the simulator's own check
    with pytest.raises(Exception, match=r"inventory_hostname='\.\./\.\./escaped': not a valid host name"):
        simulate.simulated_hosts(tmp_path)


def test_a_non_loopback_address_is_refused(tmp_path):
    (tmp_path / "hosts.yml").write_text("all:\n  children:\n    rack_r01:\n      hosts:\n"
                                        "        r01n01: {ansible_host: gpu-node-1.example, gpu_model: h100-sxm}\n")
    with pytest.raises(Exception, match=r"r01n01: ansible_host='gpu-node-1\.example': a simulated machine needs a loopback"):
        simulate.simulated_hosts(tmp_path)


def test_a_real_inventory_is_one_line_not_one_per_host(tmp_path):
    """`virtual up` given a production inventory by mistake: one line saying so, not one per host."""
    from sim.hosts import create

    directory = tmp_path / "prod"
    create.write(directory, 8, 2)
    hosts = directory / "hosts.yml"
    hosts.write_text(re.sub(r"ansible_host: 127\.0\.(\d+)\.(\d+)", r"ansible_host: gpu-\1-\2.example", hosts.read_text()))
    with pytest.raises(ClusterctlError) as raised:
        simulate.simulated_hosts(directory)
    lines = str(raised.value).splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("none of its hosts is on loopback: this is not a virtual inventory (r01n01: "
                               "ansible_host='gpu-1-11.example'; ")
    assert lines[0].endswith("; +5 more): a simulated machine needs a loopback address (127.0.0.0/8)")
