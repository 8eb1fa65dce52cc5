"""Simulated hosts as machines: one systemd-nspawn container per inventory host, reached over SSH.

Each machine boots the cached base image (:mod:`sim.hosts.image`) with real systemd as PID 1, through
a copy-on-write overlay of its own, and shares this machine's network namespace: its sshd listens on the
host's ``ansible_host`` (127.0.R.N) and nowhere else. nspawn runs with ``--register=no --keep-unit``
because this machine's PID 1 is not systemd, so there is no machined to register with.

Layout under ``<inventory_dir>/.sim/`` (the state dir; a plain directory, never a symlink)::

    ssh/id_ed25519[.pub]   the inventory's key pair (0600), kept across up/down
    ssh/known_hosts        every machine's host key at its address (rewritten by every ``up``)
    hosts/peers.json       addresses, LIDs and GUIDs of every host (two-host stubs read it)
    hosts/<host>/state/    host.json (hardware + faults), calls.log; /run/clusterctl-sim inside
    hosts/<host>/sys/      simulated /sys subtrees (class, pci, virtual), overlaid on the real ones
    cache/                 /sys/devices/system/{cpu,node} trees, shared by hosts with identical CPUs
    machines/<host>/upper  the machine's overlay upper dir (everything it writes lands here)
    machines/<host>/nspawn.pid, leader.pid, console.log

What is bound into a machine, and nothing else of this machine is visible: its own state dir (read-write,
the stubs' call log), every host's state (read-only, for the two-host stubs), the ``sim`` package
(read-only, run by the machine's own /usr/bin/python3) and the simulated /sys trees (read-only). Its
/etc, /usr and package database are the image's under the overlay; nspawn gives it no CAP_SYS_TIME, so
it cannot set the clock. /proc/{cpuinfo,meminfo,cmdline} are bind-mounted over by a unit inside the
machine at boot (nspawn cannot bind onto /proc from outside).

``down`` works from the recorded PIDs and, after a ``kill -9`` of whatever ran ``up``, from a scan of
/proc for nspawn processes naming this state dir: SIGTERM halts a machine cleanly, SIGKILL to nspawn
and the machine's PID 1 follows after a grace period. nspawn's mounts live in its own mount namespace,
so none is left here when it exits.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import sim
from cluster import spec
from sim.aptrepo.catalog import SIM_TOOL
from sim.hosts import limits, stubs, sysfs
from sim.hosts.hardware import Hardware
from sim.hosts.stubs import peers
from sim.hosts.stubs import systemctl as stub_systemctl
from sim.vllm.fake_gpu import fake_gpus, write_fake_gpu_file

STATE_DIR_NAME = ".sim"
SIM_RUN_DIR = "/run/clusterctl-sim"  # where a machine sees its own state/ dir
NVML_FILE = "nvml.json"  # in the state dir: SIM_RUN_DIR/nvml.json on the machine (the inventory's eas_agent_fake_gpu_file)
PEERS_DIR = "/run/clusterctl-sim-peers"  # where it sees every host's (read-only)
SIM_LIB = "/usr/local/lib/clusterctl-sim"  # the `sim` package, read-only, for the stub tools
MACHINE_PYTHON = "/usr/bin/python3"
SSH_USER = "deploy"
BOOT_TIMEOUT_S = float(os.environ.get("CLUSTERCTL_BOOT_TIMEOUT_S", "120"))
HALT_GRACE_S = 20.0
BOOT_PARALLEL = 8  # boots at a time: 16 on 2 busy cores timed out units (journal flush)
# nspawn exits 133 when the machine's systemd reboots (systemd-nspawn(1)); systemd-nspawn@.service restarts it
# on that status (RestartForceExitStatus=133) and so does this loop: `reboot` inside a machine (Ansible's
# reboot module, a driver change) brings the same machine, overlay and address back. Any other exit ends it.
SUPERVISOR = ('while :; do "$@"; rc=$?; [ "$rc" -eq 133 ] || exit "$rc"; '
              'echo "clusterctl-sim: the machine rebooted (nspawn exit 133); starting it again"; done')
# A DNS label, or dotted labels (the inventory's rule, cluster.spec.HOSTNAME): a host name becomes a directory
# name and a machine name, so nothing else ('..', '/', a leading dot or dash) may reach a path. nspawn's
# machine names stop at 64 characters.
HOSTNAME = spec.HOSTNAME
MAX_HOSTNAME = 64
SYS_OVERLAYS = (("/sys/class", "class"), ("/sys/bus/pci/devices", "pci"), ("/sys/devices/virtual", "virtual"))
PROC_FILES = ("cpuinfo", "meminfo", "cmdline")
# The cgroup hierarchies a machine's systemd manages. nspawn --keep-unit uses the cgroup it starts in, and
# this machine's PID 1 is not systemd, so without a cgroup of its own every machine would share the root
# one (nspawn's payload/ and supervisor/ subgroups included) and their systemds would start units in each
# other's cgroups: units failed at random with status 219/CGROUP when machines booted side by side.
CGROUP_ROOTS = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
CGROUP_PARENT = "clusterctl-sim"
PROC_UNIT = "clusterctl-sim-proc.service"


class MachineError(RuntimeError):
    pass


@dataclass(frozen=True)
class SimHost:
    """One simulated host to bring up: its hardware (faults applied), the fault list, its address."""

    hardware: Hardware
    faults: list
    address: str
    # Where the node's local NVMe holds the model weights (the inventory's inference_unit_model_path): a
    # stand-in model directory (config.json only) is put there, as a real node has its weights before vLLM.
    model_path: str | None = None


def check_hostname(name: str) -> str:
    if len(name) > MAX_HOSTNAME or not HOSTNAME.fullmatch(name):
        raise MachineError(f"host {name!r}: not a valid host name for a simulated machine (letters, digits, "
                           f"'-' and '.'-separated labels, at most {MAX_HOSTNAME} characters)")
    return name


@dataclass(frozen=True)
class Layout:
    """Where an inventory's machines keep their files (all absolute)."""

    state_dir: Path

    @property
    def ssh_dir(self) -> Path:
        return self.state_dir / "ssh"

    @property
    def key(self) -> Path:
        return self.ssh_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.ssh_dir / "known_hosts"

    @property
    def hosts_dir(self) -> Path:
        return self.state_dir / "hosts"

    @property
    def machines_dir(self) -> Path:
        return self.state_dir / "machines"

    @property
    def cache(self) -> Path:
        return self.state_dir / "cache"

    def host(self, name: str) -> HostPaths:
        return HostPaths(self, check_hostname(name))


@dataclass(frozen=True)
class HostPaths:
    layout: Layout
    host: str

    @property
    def root(self) -> Path:
        return self.layout.hosts_dir / self.host

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def calls_log(self) -> Path:
        return self.state / "calls.log"

    @property
    def machine(self) -> Path:
        return self.layout.machines_dir / self.host

    @property
    def upper(self) -> Path:
        return self.machine / "upper"

    @property
    def pid_file(self) -> Path:
        return self.machine / "nspawn.pid"

    @property
    def leader_file(self) -> Path:
        return self.machine / "leader.pid"

    @property
    def console_log(self) -> Path:
        return self.machine / "console.log"


def state_dir_of(inventory_dir: Path) -> Path:
    return inventory_dir.resolve() / STATE_DIR_NAME


def _real_dir(path: Path, mode: int = 0o755) -> Path:
    """``path`` as a directory of our own: created if missing, refused if it is a symlink or not a directory
    (a symlinked state dir would make root delete and write through it; security review H3)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        os.mkdir(path, mode)
        st = os.lstat(path)
    if os.path.islink(path):
        raise MachineError(f"{path}: is a symlink; refusing to use it as a simulation state dir "
                           "(remove it: `virtual up` creates a real directory)")
    if not os.path.isdir(path):
        raise MachineError(f"{path}: exists and is not a directory; refusing to use it as a simulation state dir")
    if st.st_uid != os.geteuid():
        raise MachineError(f"{path}: owned by uid {st.st_uid}, not by us (uid {os.geteuid()}); refusing to use it")
    return path


def _remove_tree(path: Path) -> None:
    if os.path.islink(path):
        raise MachineError(f"{path}: is a symlink; refusing to delete through it")
    if path.exists():
        shutil.rmtree(path)


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
    # What NVML would answer on this host (the eas-agent's `fake` GPU backend reads it, as the inventory
    # says): its GPUs, loaded as a serving vLLM loads them.
    write_fake_gpu_file(paths.state / NVML_FILE, fake_gpus(len(hw.gpus), utilization=60))
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
    _write(etc / "ssh" / "sshd_config.d" / "10-listen.conf",
           "# This machine's only listen address: machines share the CI machine's network namespace.\n"
           f"ListenAddress {sim_host.address}\nHostKey /etc/ssh/ssh_host_ed25519_key\n")
    _write(etc / "ssh" / "authorized_keys" / SSH_USER, public_key)
    host_key = _host_key(etc / "ssh", paths.host)
    units = etc / "systemd" / "system"
    _write(units / PROC_UNIT, _proc_unit())
    (units / "sysinit.target.wants").mkdir(parents=True, exist_ok=True)
    os.symlink(f"../{PROC_UNIT}", units / "sysinit.target.wants" / PROC_UNIT)
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
    packages = [repo / name for name in ("cli", "cluster", "consul_io", "devconsul", "eas_agent", "edge",
                                         "preflight", "sim")]
    paths = [Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), *packages]
    return [p for p in dict.fromkeys(paths) if p.is_dir() and p != Path("/") and not _is_system_dir(p)]


def _is_system_dir(path: Path) -> bool:
    """/usr and friends are the machine's own (its image); never bind this machine's over them."""
    return any(path == Path(top) or Path(top) in path.parents for top in ("/usr", "/etc", "/var", "/bin", "/lib"))


# ------------------------------------------------------------------------------------------- cgroups


def _cgroup_roots() -> list[Path]:
    """The mounted hierarchies: v1 name=systemd and the hybrid unified one, or the one of a pure v2 host."""
    systemd, unified, v2 = CGROUP_ROOTS
    roots = [root for root in (systemd, unified) if (root / "cgroup.procs").exists()]
    return roots or ([v2] if (v2 / "cgroup.procs").exists() else [])


def _cgroup_prefix(layout: Layout) -> str:
    """What every machine cgroup of this state dir is named after (``<prefix>-<host>``)."""
    return hashlib.sha256(str(layout.state_dir).encode()).hexdigest()[:12]


def _cgroup_name(paths: HostPaths) -> str:
    return f"{CGROUP_PARENT}/{_cgroup_prefix(paths.layout)}-{paths.host}"


def machine_cgroups(paths: HostPaths) -> list[Path]:
    return [root / _cgroup_name(paths) for root in _cgroup_roots()]


def _cgroup_pids(cgroup: Path) -> list[int]:
    pids = []
    for procs in [cgroup / "cgroup.procs", *cgroup.rglob("cgroup.procs")]:
        try:
            pids += [int(p) for p in procs.read_text().split()]
        except (OSError, ValueError):
            continue
    return sorted(set(pids))


def _remove_cgroup(cgroup: Path) -> None:
    """rmdir the (empty) cgroup and every group the machine's systemd made below it, deepest first."""
    if not cgroup.is_dir():
        return
    for sub in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        try:
            sub.rmdir()
        except OSError:
            pass
    try:
        cgroup.rmdir()
    except OSError:
        pass


# ------------------------------------------------------------------------------------------ running


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _is_our_nspawn(pid: int, paths: HostPaths) -> bool:
    argv = _cmdline(pid)
    return bool(argv) and argv[0].endswith("systemd-nspawn") and f"--bind={paths.state}:{SIM_RUN_DIR}" in argv


def _is_our_supervisor(pid: int, paths: HostPaths) -> bool:
    """The shell that runs (and on a reboot re-runs) this host's nspawn: nspawn's argv is its "$@"."""
    argv = _cmdline(pid)
    return (bool(argv) and argv[0] == "sh" and any(SUPERVISOR in a for a in argv[:3])
            and f"--bind={paths.state}:{SIM_RUN_DIR}" in argv)


def _nspawn_of(supervisor: int) -> int | None:
    return next((c for c in _children(supervisor) if _comm(c) == "systemd-nspawn"), None)


def current_leader(paths: HostPaths) -> int | None:
    """PID 1 of the host's machine now: the recorded one, or after a reboot the new one (recorded again)."""
    leader = _read_pid(paths.leader_file)
    if leader and _is_our_leader(leader, paths):
        return leader
    supervisor = _read_pid(paths.pid_file)
    nspawn = _nspawn_of(supervisor) if supervisor and _is_our_supervisor(supervisor, paths) else None
    leader = _leader_of(nspawn) if nspawn else None
    if leader and _comm(leader) == "systemd" and _is_our_leader(leader, paths):
        paths.leader_file.write_text(f"{leader}\n")
        return leader
    return None


def _is_our_leader(pid: int, paths: HostPaths) -> bool:
    """PID 1 of this host's machine: it sees our host.json (the same file) as its /run/clusterctl-sim."""
    try:
        ours = os.stat(paths.state / "host.json")
        theirs = os.stat(f"/proc/{pid}/root{SIM_RUN_DIR}/host.json")
    except OSError:
        return False
    return (ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _leader_of(nspawn_pid: int) -> int | None:
    children = _children(nspawn_pid)
    inits = [c for c in children if _comm(c) == "systemd"]
    return inits[0] if inits else (children[-1] if children else None)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _nsenter(leader: int, *argv: str, timeout: float = 10) -> subprocess.CompletedProcess:
    """argv inside the machine; a command that runs past ``timeout`` is an empty answer with the reason on
    stderr (so a diagnosis of a slow machine reports, instead of raising in place of the real error)."""
    command = ["nsenter", f"--target={leader}", "--mount", "--uts", "--ipc", "--pid", "--", *argv]
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(command, 124, "", f"{argv[0]}: no answer within {timeout:.0f}s")


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


# ---------------------------------------------------------------------------------------- up / down


def up(state_dir: Path, image_root: Path, hosts: dict[str, SimHost],
       progress=lambda line: None) -> None:
    """(Re)create a machine per host in ``hosts`` and boot them (``down`` first)."""
    for name in hosts:
        check_hostname(name)
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


def _machine_names(layout: Layout) -> list[str]:
    if os.path.islink(layout.machines_dir) or not layout.machines_dir.is_dir():
        return []
    return sorted(p.name for p in layout.machines_dir.iterdir() if HOSTNAME.fullmatch(p.name))


def _our_processes(layout: Layout) -> tuple[list[int], list[int], list[int]]:
    """(nspawn PIDs, machine PID 1s, supervisor shells) of this state dir: recorded ones, checked, plus any
    nspawn or supervisor naming it."""
    nspawns, leaders = set(), set()
    if not layout.machines_dir.is_dir():
        return [], [], []
    all_paths = [layout.host(name) for name in _machine_names(layout)]
    supervisors = set()
    for paths in all_paths:
        pid = _read_pid(paths.pid_file)
        if pid and _is_our_supervisor(pid, paths):
            supervisors.add(pid)
            nspawn = _nspawn_of(pid)
            leader = _leader_of(nspawn) if nspawn else None
            if nspawn:
                nspawns.add(nspawn)
            if leader and _is_our_leader(leader, paths):
                leaders.add(leader)
        leader = _read_pid(paths.leader_file)
        if leader and _is_our_leader(leader, paths):
            leaders.add(leader)
    marker = str(layout.hosts_dir)
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) not in nspawns | supervisors:
            argv = _cmdline(int(entry))
            if argv and argv[0].endswith("systemd-nspawn") and any(marker in a for a in argv):
                nspawns.add(int(entry))
            elif argv and argv[0] == "sh" and any(SUPERVISOR in a for a in argv[:3]) and any(marker in a for a in argv):
                supervisors.add(int(entry))
    return sorted(nspawns), sorted(leaders), sorted(supervisors)


def down(state_dir: Path) -> int:
    """Stop every machine of this state dir and remove their overlays and host files; returns how many
    machines were running. Safe after a killed ``up`` or ``down``."""
    if os.path.islink(state_dir):
        raise MachineError(f"{state_dir}: is a symlink; refusing to use it as a simulation state dir")
    if not state_dir.is_dir():
        return 0
    layout = Layout(state_dir)
    nspawns, leaders, supervisors = _our_processes(layout)
    running = len(nspawns)
    # Supervisors first: signalled before their nspawn exits, none of them can start a machine again.
    for pid in supervisors + nspawns:
        _signal(pid, signal.SIGTERM)
    nspawns = supervisors + nspawns
    deadline = time.monotonic() + HALT_GRACE_S
    while any(_pid_alive(p) for p in nspawns + leaders) and time.monotonic() < deadline:
        _reap(nspawns)
        time.sleep(0.1)
    cgroups = [c for name in _machine_names(layout) for c in machine_cgroups(layout.host(name))]
    stragglers = [p for c in cgroups for p in _cgroup_pids(c)]  # e.g. after a kill -9 of nspawn itself
    for pid in nspawns + leaders + stragglers:  # SIGKILL to a machine's PID 1 ends every process in it
        if _pid_alive(pid):
            _signal(pid, signal.SIGKILL)
    while any(_pid_alive(p) for p in nspawns + leaders + stragglers) and time.monotonic() < deadline + 5:
        _reap(nspawns)
        time.sleep(0.05)
    for cgroup in cgroups:
        _remove_cgroup(cgroup)
    for point in reversed(mounts_under(state_dir)):  # only a layout older than machines mounted here
        subprocess.run(["umount", "-l", point], capture_output=True)
    for directory in (layout.machines_dir, layout.hosts_dir, layout.cache):
        _remove_tree(directory)
    return running


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _reap(pids: list[int]) -> None:
    """Collect our own exited children (nspawn started by this process), so they stop counting as alive."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass


def leftovers(state_dir: Path) -> list[str]:
    """What ``down`` must not leave behind, one line each (empty: nothing): a process of this state dir's
    machines (nspawn and supervisors, recorded or found by argv; PID 1s; anything still in the machines'
    cgroups, where every process of a machine lives, reparented or not), a mount under the state dir or an
    overlay whose layers name it, a machine cgroup, an overlay upper dir. Not any process whose argv names
    the state dir: Ansible's ControlPersist ssh masters name its key and outlive a run by design (they
    are the controller's, and exit when the machine's sshd is gone). Benchmarks and tests assert it is
    empty after ``down`` at every size."""
    layout = Layout(state_dir)
    found = []
    nspawns, leaders, supervisors = _our_processes(layout)
    pids = set(nspawns + leaders + supervisors)
    marker = str(state_dir).rstrip("/") + "/"
    prefix = _cgroup_prefix(layout)
    cgroups = [c for root in _cgroup_roots() for c in sorted((root / CGROUP_PARENT).glob(f"{prefix}-*"))]
    for cgroup in cgroups:
        pids.update(_cgroup_pids(cgroup))
    found += [f"process {p} ({_comm(p) or 'gone'})" for p in sorted(pids) if _pid_alive(p)]
    found += [f"mount {p}" for p in mounts_under(state_dir)]
    with open("/proc/self/mountinfo") as f:
        found += [f"overlay mount {line.split()[4]}" for line in f
                  if " - overlay " in line and marker in line and not line.split()[4].startswith(marker)]
    found += [f"cgroup {c}" for c in cgroups if c.is_dir()]
    if layout.machines_dir.exists():
        uppers = sorted(str(u) for u in layout.machines_dir.glob("*/upper"))
        found += [f"overlay upper dir {u}" for u in uppers] or [f"dir {layout.machines_dir}"]
    return found


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            points.append(line.split()[4].encode().decode("unicode_escape"))
    return points


def mounts_under(path: Path) -> list[str]:
    prefix = str(path).rstrip("/")
    return [p for p in _mount_points() if p == prefix or p.startswith(prefix + "/")]


@dataclass(frozen=True)
class MachineState:
    name: str
    state: str  # systemd's is-system-running inside, or "stopped"
    faults: list
    address: str


def status(state_dir: Path) -> list[MachineState]:
    layout = Layout(state_dir)
    out = []
    if os.path.islink(state_dir) or not layout.hosts_dir.is_dir():
        return out
    for host_dir in sorted(layout.hosts_dir.iterdir()):
        if not HOSTNAME.fullmatch(host_dir.name) or not (host_dir / "state" / "host.json").is_file():
            continue
        paths = layout.host(host_dir.name)
        data = json.loads((paths.state / "host.json").read_text())
        leader = current_leader(paths)
        state = "stopped"
        if leader:
            state = _nsenter(leader, "systemctl", "is-system-running").stdout.strip() or "unknown"
            if data["hardware"].get("unreachable"):
                state += ", sshd off (unreachable fault)"
        out.append(MachineState(host_dir.name, state, data.get("faults") or [], data.get("address", "")))
    return out
