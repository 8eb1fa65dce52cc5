"""Simulated hosts as machines: one systemd-nspawn container per inventory host, reached over SSH.

Each machine boots the cached base image (:mod:`sim.hosts.image`) with real systemd as PID 1, through
a copy-on-write overlay of its own, and shares this machine's network namespace: its sshd listens on the
host's ``ansible_host`` (127.0.R.N) and nowhere else. nspawn runs with ``--register=no --keep-unit``
because this machine's PID 1 is not systemd, so there is no machined to register with.

The state dir's layout and its path checks: :mod:`sim.hosts.state_dir`.

What is bound into a machine, and nothing else of this machine is visible: its own state dir (read-write,
the stubs' call log), every host's state (read-only, for the two-host stubs), the ``sim`` package
(read-only, run by the machine's own /usr/bin/python3) and the simulated /sys trees (read-only). Its
/etc, /usr and package database are the image's under the overlay; nspawn gives it no CAP_SYS_TIME, so
it cannot set the clock. /proc/{cpuinfo,meminfo,cmdline} are bind-mounted over by a unit inside the
machine at boot (nspawn cannot bind onto /proc from outside).

Finding, stopping and reporting the running machines (``down``, ``leftovers``, ``status``):
:mod:`sim.hosts.nspawn`.

What callers reach through this module (lifecycle, the CLI, tests, benchmarks) is imported here under its
own name (``from sim.hosts.nspawn import down as down``): ``machines.down``, ``machines.Layout``, ...
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import sim
from sim.aptrepo.catalog import SIM_TOOL
from sim.hosts import limits, nvidia_module, stubs, sysfs
from sim.hosts.hardware import Hardware
from sim.hosts.machine_paths import SIM_RUN_DIR
from sim.hosts.nspawn import (
    SUPERVISOR,
    _comm,
    _is_our_leader,
    _leader_of,
    _nsenter,
    _nspawn_of,
    down,
    machine_cgroups,
)
from sim.hosts.nspawn import MachineState as MachineState
from sim.hosts.nspawn import _cgroup_roots as _cgroup_roots
from sim.hosts.nspawn import _our_processes as _our_processes
from sim.hosts.nspawn import current_leader as current_leader
from sim.hosts.nspawn import leftovers as leftovers
from sim.hosts.nspawn import status as status
from sim.hosts.state_dir import (
    NVML_FILE,
    HostPaths,
    Layout,
    _real_dir,
    _remove_tree,
    check_state_dir,
)
from sim.hosts.state_dir import MachineError as MachineError
from sim.hosts.state_dir import check_hostname as check_hostname
from sim.hosts.state_dir import state_dir_of as state_dir_of
from sim.hosts.stubs import peers
from sim.hosts.stubs import systemctl as stub_systemctl
from sim.vllm.fake_gpu import fake_gpus, write_fake_gpu_file

PEERS_DIR = "/run/clusterctl-sim-peers"  # where it sees every host's (read-only)
SIM_LIB = "/usr/local/lib/clusterctl-sim"  # the `sim` package, read-only, for the stub tools
MACHINE_PYTHON = "/usr/bin/python3"
SSH_USER = "deploy"
# A safetensors file holding no tensor: its 8-byte little-endian header length, then the header "{}"
EMPTY_SAFETENSORS = (2).to_bytes(8, "little") + b"{}"
BOOT_TIMEOUT_S = float(os.environ.get("CLUSTERCTL_BOOT_TIMEOUT_S", "120"))
BOOT_PARALLEL = 8  # boots at a time: 16 on 2 busy cores timed out units (journal flush)
SYS_OVERLAYS = (("/sys/class", "class"), ("/sys/bus/pci/devices", "pci"), ("/sys/devices/virtual", "virtual"))
PROC_FILES = ("cpuinfo", "meminfo", "cmdline")
PROC_UNIT = "clusterctl-sim-proc.service"


@dataclass(frozen=True)
class SimHost:
    """One simulated host to bring up: its hardware (faults applied), the fault list, its address."""

    hardware: Hardware
    faults: list
    address: str
    # Where the node's local NVMe holds the model weights (the inventory's inference_unit_model_path): a
    # stand-in model directory (config.json and an empty weight file) is put there, as a real node has its
    # weights before vLLM.
    model_path: str | None = None


# ----------------------------------------------------------------------------------------- ssh keys


def ensure_key_pair(layout: Layout) -> None:
    _real_dir(layout.ssh_dir, 0o700)
    os.chmod(layout.ssh_dir, 0o700)
    if not layout.key.exists():
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"clusterctl-virtual@{layout.state_dir}",
              "-f", str(layout.key)])
    os.chmod(layout.key, 0o600)


def _host_key(directory: Path, host: str) -> str:
    """Generate the machine's sshd host key into its upper /etc/ssh; returns the public key line."""
    directory.mkdir(parents=True, exist_ok=True)
    key = directory / "ssh_host_ed25519_key"
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host}", "-f", str(key)])
    return " ".join(key.with_suffix(".pub").read_text().split()[:2])


def _run(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise MachineError(f"`{' '.join(argv)}` exited {result.returncode}: {result.stderr.strip()[-300:]}")
    return result


# ------------------------------------------------------------------------------------ machine files


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def prepare_host(paths: HostPaths, sim_host: SimHost, public_key: str) -> str:
    """(Re)create the host's state and its machine's upper dir; returns its known_hosts line."""
    hw = sim_host.hardware
    _remove_tree(paths.root)
    _remove_tree(paths.machine)
    paths.state.mkdir(parents=True)
    paths.machine.mkdir(parents=True)
    host_json = {"hardware": hw.to_json(), "faults": sim_host.faults, "address": sim_host.address,
                 "state_dir": PEERS_DIR}
    (paths.state / "host.json").write_text(json.dumps(host_json, indent=1))
    paths.calls_log.touch()
    paths.calls_log.chmod(0o666)  # stubs run as whichever user calls them (deploy, or root under sudo)
    sysfs.write_tree(paths.state / "proc", sysfs.proc_files(hw))
    # What NVML would answer on this host (the agent's NVML calls read it through the stand-in nvidia-ml-py the
    # package index serves: sim/nvml_standin): its GPUs, loaded as a serving vLLM loads them.
    write_fake_gpu_file(paths.state / NVML_FILE, fake_gpus(len(hw.gpus), utilization=60,
                                                              bus_ids=[gpu.bus_id for gpu in hw.gpus]))
    for _, ours in SYS_OVERLAYS:
        (paths.root / "sys" / ours).mkdir(parents=True)
    sysfs.write_tree(paths.root / "sys" / "class", sysfs.class_tree(hw))
    sysfs.write_tree(paths.root / "sys" / "pci", sysfs.pci_tree(hw))
    sysfs.write_tree(paths.root / "sys" / "virtual", sysfs.virtual_tree(hw))

    upper = paths.upper
    etc = upper / "etc"
    sysfs.write_tree(etc, sysfs.etc_files(hw))
    _write(etc / "hosts", f"127.0.0.1 localhost\n{sim_host.address} {paths.host}\n")
    stubs.install(upper / "usr" / "local" / "bin", MACHINE_PYTHON, SIM_LIB)
    # The kernel's CPUs and NUMA nodes are this machine's, not the simulated host's (see the stub systemctl).
    _write(upper / "usr/lib/systemd/system/service.d" / stub_systemctl.HARNESS_DROPIN, stub_systemctl.HARNESS_DROPIN_TEXT)
    _write(upper / "usr/lib/systemd/system/chrony.service.d" / stub_systemctl.CHRONY_DROPIN,
           stub_systemctl.CHRONY_DROPIN_TEXT)
    # The stand-in vendor packages' tools (sim/aptrepo: nvidia-smi, dcgmi, ...) launch the same stub program.
    (upper / SIM_TOOL.lstrip("/")).parent.mkdir(parents=True)
    os.symlink(f"/usr/local/bin/{stubs.PROGRAM}", upper / SIM_TOOL.lstrip("/"))
    # An MLNX_OFED host (the simulated ecn sysfs is the OFED driver's) has mlnx-tools' /usr/bin/mlnx_qos.
    if hw.versions.get("ofed"):
        (upper / "usr" / "bin").mkdir(parents=True, exist_ok=True)
        os.symlink("/usr/local/bin/mlnx_qos", upper / "usr" / "bin" / "mlnx_qos")
    if sim_host.model_path:
        model = upper / sim_host.model_path.lstrip("/")
        model.mkdir(parents=True)
        (model / "config.json").write_text(json.dumps({"model_type": "llama", "clusterctl_stand_in": True}) + "\n")
        # a weight file vLLM's loader finds (a safetensors file with an empty header): the weights_missing drill
        # moves it aside and the stand-in vLLM then dies as vLLM does (sim/pypi/vllm_cli.py)
        (model / "model-00001-of-00001.safetensors").write_bytes(EMPTY_SAFETENSORS)
    _write(etc / "ssh" / "sshd_config.d" / "10-listen.conf",
           "# This machine's only listen address: machines share the CI machine's network namespace.\n"
           f"ListenAddress {sim_host.address}\nHostKey /etc/ssh/ssh_host_ed25519_key\n")
    _write(etc / "ssh" / "authorized_keys" / SSH_USER, public_key)
    host_key = _host_key(etc / "ssh", paths.host)
    units = etc / "systemd" / "system"
    _write(units / PROC_UNIT, _proc_unit())
    _write(units / nvidia_module.LOAD_UNIT, nvidia_module.load_unit())
    (units / "sysinit.target.wants").mkdir(parents=True, exist_ok=True)
    for unit in (PROC_UNIT, nvidia_module.LOAD_UNIT):
        os.symlink(f"../{unit}", units / "sysinit.target.wants" / unit)
    nvidia_module.seed(upper, hw.versions.get("driver", ""))
    if hw.unreachable:  # the `unreachable` fault: the machine runs, its sshd does not
        os.symlink("/dev/null", units / "ssh.service")
    return f"{sim_host.address} {host_key}\n"


def _proc_unit() -> str:
    binds = "".join(f"ExecStart=/bin/mount --bind {SIM_RUN_DIR}/proc/{name} /proc/{name}\n" for name in PROC_FILES)
    return (
        "# Simulated /proc files of this host (clusterctl virtual): nspawn cannot bind onto /proc itself.\n"
        "[Unit]\nDescription=Simulated /proc/cpuinfo, meminfo and cmdline\nDefaultDependencies=no\n"
        "Before=sysinit.target\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\n" + binds
    )


def nspawn_argv(image_root: Path, paths: HostPaths, cpu_dir: Path, node_dir: Path) -> list[str]:
    argv = [
        "systemd-nspawn", "--quiet", "--register=no", "--keep-unit", "--console=pipe", "--link-journal=no",
        "--resolv-conf=off", "--timezone=off", f"--machine={paths.host}",
        "-D", str(image_root), f"--overlay={image_root}:{paths.upper}:/",
        f"--bind={paths.state}:{SIM_RUN_DIR}",
        f"--bind-ro={paths.layout.hosts_dir}:{PEERS_DIR}",
        f"--bind-ro={Path(sim.__file__).resolve().parent}:{SIM_LIB}/sim",
        # The stubs format CPU lists with production's one formatter (preflight.parsers.cpulist).
        f"--bind-ro={Path(sim.__file__).resolve().parent.parent / 'preflight'}:{SIM_LIB}/preflight",
        f"--bind-ro={cpu_dir}:/sys/devices/system/cpu",
        f"--bind-ro={node_dir}:/sys/devices/system/node",
    ]
    for real, ours in SYS_OVERLAYS:
        argv.append(f"--overlay-ro={real}:{paths.root / 'sys' / ours}:{real}")
    # The mlx5 ECN knobs are the one simulated sysfs that the node itself writes (roce-dcqcn's boot script,
    # as root): bound writable over the read-only overlay (nspawn mounts parents first). What the script
    # writes lands in the host's tree, where preflight's dcqcn check reads it back.
    for ecn in sorted((paths.root / "sys" / "class" / "net").glob("*/ecn")):
        argv.append(f"--bind={ecn}:/sys/class/net/{ecn.parent.name}/ecn")
    argv += [f"--bind-ro={path}" for path in controller_paths()]
    return [*argv, "--boot"]


def controller_paths() -> list[Path]:
    """The controller's Python (its environment, base interpreter and this project's packages), bound
    read-only into every machine at the same paths, so that ``sys.executable`` and the ``eas-agent``
    script run there as here: the demo runs the agent and the simulated vLLM servers on the machines this
    way until the agent is installed on nodes as a package (the next issue). Never the checkout root:
    an inventory inside it holds the controller's private key."""
    import sys

    repo = Path(sim.__file__).resolve().parent.parent
    # consul_io: the agent's Consul client; sim: the simulated vLLM (python -m sim.vllm) the demo runs there
    packages = [repo / name for name in ("cli", "cluster", "common", "consul_io", "devconsul", "eas_agent", "edge",
                                         "preflight", "sim")]
    paths = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), *packages]
    return [p for p in dict.fromkeys(paths) if p.is_dir() and p != Path("/") and not _is_system_dir(p)]


def _is_system_dir(path: Path) -> bool:
    """/usr and friends are the machine's own (its image); never bind this machine's over them."""
    return any(path == Path(top) or Path(top) in path.parents for top in ("/usr", "/etc", "/var", "/bin", "/lib"))


def _address_free(address: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As sshd binds (SO_REUSEADDR): connections of a machine just stopped, still in TIME_WAIT, do not
        # hold the address; a listener does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, 22))
        except OSError as exc:
            raise MachineError(f"{address}:22: address already in use ({exc.strerror}); another virtual cluster "
                               "or sshd holds it (`clusterctl virtual down` that inventory first)") from None


def boot(image_root: Path, paths: HostPaths, sim_host: SimHost, cpu_dir: Path, node_dir: Path,
         layout: Layout) -> None:
    """Start the machine and wait until systemd reports it running and (unless unreachable) SSH answers."""
    _address_free(sim_host.address)
    cgroups = machine_cgroups(paths)
    for cgroup in cgroups:
        cgroup.mkdir(parents=True, exist_ok=True)
    # The shell moves itself into the machine's cgroups, then supervises nspawn (SUPERVISOR: a reboot
    # inside the machine starts it again, as a BMC power-cycles a server).
    enter = "".join(f'echo $$ > "{c}/cgroup.procs" && ' for c in cgroups)
    with open(paths.console_log, "w") as console:
        proc = subprocess.Popen(["sh", "-c", f"{enter}{SUPERVISOR}", "sh",
                                 *nspawn_argv(image_root, paths, cpu_dir, node_dir)],
                                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                                start_new_session=True)
    paths.pid_file.write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    leader = None
    # nspawn's first child is its outer helper, which sees the machine's mounts too and then exits: the
    # machine's PID 1 is the child that has exec'd systemd.
    while leader is None or not (_comm(leader) == "systemd" and _is_our_leader(leader, paths)):
        if proc.poll() is not None:
            raise MachineError(f"{paths.host}: systemd-nspawn exited {proc.returncode} while booting; "
                               f"{paths.console_log}:\n{_tail(paths.console_log)}")
        if time.monotonic() > deadline:
            raise MachineError(f"{paths.host}: machine did not start within {BOOT_TIMEOUT_S:.0f}s; "
                               f"{paths.console_log}:\n{_tail(paths.console_log)}")
        time.sleep(0.1)
        nspawn = _nspawn_of(proc.pid)
        leader = _leader_of(nspawn) if nspawn else None
    paths.leader_file.write_text(f"{leader}\n")
    state, detail = "offline", ""
    try:
        # "offline" (or no answer: no bus yet) until systemd has exec'd and set up /run/systemd; only then
        # does --wait wait for the boot to finish.
        while state in ("offline", "", "initializing", "starting") and time.monotonic() < deadline:
            time.sleep(0.2)
            result = _nsenter(leader, "systemctl", "is-system-running", "--wait",
                              timeout=max(1.0, deadline - time.monotonic()))
            state, detail = result.stdout.strip(), result.stderr.strip()[-200:]
            if result.returncode == 124:
                state = "starting (timed out)"
    except subprocess.TimeoutExpired:
        state = "starting (timed out)"
    if state != "running":
        failed = _nsenter(leader, "systemctl", "--failed", "--no-legend", "--plain").stdout.strip()
        units = [line.split()[0] for line in failed.splitlines() if line.strip()]
        journal = _nsenter(leader, "journalctl", "--no-pager", "-o", "short-monotonic", "-n", "20",
                           *[f"--unit={u}" for u in units]).stdout.strip() if units else ""
        # A unit that died before journald took its output has no entries; its result still says how it ended.
        results = [f"{u}: " + " ".join(_nsenter(leader, "systemctl", "show", "-p", "Result", "-p",
                                                "ExecMainCode", "-p", "ExecMainStatus", u).stdout.split())
                   for u in units[:3]]
        journal = "\n".join(results + [journal])
        raise MachineError(f"{paths.host}: machine did not reach multi-user within {BOOT_TIMEOUT_S:.0f}s "
                           f"(systemd: {state or detail}); failed units: {', '.join(units) or 'none'}\n"
                           f"{journal or _tail(paths.console_log)}")
    if not sim_host.hardware.unreachable:
        _wait_ssh(paths.host, sim_host.address, layout, deadline)


def ssh_argv(layout: Layout, address: str, *command: str) -> list[str]:
    """ssh to a machine as the inventory does: the deploy user, the key, strict host key checking."""
    return ["ssh", "-i", str(layout.key), "-o", f"UserKnownHostsFile={layout.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
            f"{SSH_USER}@{address}", *command]


def _wait_ssh(host: str, address: str, layout: Layout, deadline: float) -> None:
    while True:
        result = subprocess.run(ssh_argv(layout, address, "true"), capture_output=True, text=True, timeout=30)
        if result.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise MachineError(f"{host}: SSH to {SSH_USER}@{address} failed: {result.stderr.strip()[-300:]}")
        time.sleep(0.2)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"({exc})"


# ---------------------------------------------------------------------------------------------- up


def up(state_dir: Path, image_root: Path, hosts: dict[str, SimHost],
       progress=lambda line: None) -> None:
    """(Re)create a machine per host in ``hosts`` and boot them (``down`` first)."""
    for name in hosts:
        check_hostname(name)
    check_state_dir(state_dir)  # what is wrong with the state dir is said before "need root"
    if os.geteuid() != 0:
        raise MachineError("simulated machines need root (systemd-nspawn)")
    down(state_dir)
    layout = Layout(_real_dir(state_dir, 0o700))
    try:
        for directory in (layout.hosts_dir, layout.machines_dir, layout.cache):
            _real_dir(directory)
        ensure_key_pair(layout)
        public_key = layout.key.with_suffix(".pub").read_text()
        peers.write_index(layout.hosts_dir, {name: (s.hardware, s.address) for name, s in hosts.items()})
        known = [prepare_host(layout.host(name), s, public_key) for name, s in hosts.items()]
        tmp = layout.known_hosts.with_suffix(".tmp")
        tmp.write_text("".join(known))
        os.replace(tmp, layout.known_hosts)
        trees = {name: (sysfs.write_cached_tree(layout.cache, "cpu", sysfs.cpu_tree(s.hardware)),
                        sysfs.write_cached_tree(layout.cache, "node", sysfs.node_tree(s.hardware)))
                 for name, s in hosts.items()}
        try:
            limits.ensure_room_for(len(hosts), progress=progress)
        except limits.LimitError as exc:
            raise MachineError(str(exc)) from None
        progress(f"booting {len(hosts)} machines ({min(BOOT_PARALLEL, len(hosts))} at a time)")
        with concurrent.futures.ThreadPoolExecutor(max_workers=BOOT_PARALLEL) as pool:
            futures = [pool.submit(boot, image_root, layout.host(name), s, *trees[name], layout)
                       for name, s in hosts.items()]
            errors = [f.exception() for f in futures if f.exception() is not None]
        if errors:
            raise MachineError("\n".join(str(e) for e in errors[:5]) + (
                f"\n(and {len(errors) - 5} more)" if len(errors) > 5 else ""))
    except BaseException:
        down(state_dir)
        raise


