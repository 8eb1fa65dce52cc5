"""Bring simulated hosts up and down: one persistent mount + UTS namespace per host.

Layout under ``<inventory_dir>/.sim/`` (the state dir, a tmpfs while the hosts are up)::

    ns/                 private bind mount holding the namespace files <host>.mnt and <host>.uts
    cache/              /sys/devices/system/{cpu,node} trees, shared by hosts with identical CPUs
    <host>/python       ansible_python_interpreter: the venv's python inside the host's namespaces
    <host>/run          clusterctl_exec_prefix: any argv inside the host's namespaces, stubs first on PATH
    <host>/state/       seen inside as /run/clusterctl-sim: host.json (hardware + faults), calls.log,
                        python-cpu.log (CPU of each module run, for benchmarks)
    <host>/upper/, work/  overlay upper and work dirs of /etc, /usr/local, /opt, /var
    <host>/sys/, proc/  simulated /sys subtrees and /proc files

Inside a host: /etc, /usr/local, /opt and /var are copy-on-write overlays (writes land in ``upper/``),
/usr and /boot are read-only, /run is a fresh tmpfs, the simulated /sys subtrees are mounted over the
real paths, /proc/cpuinfo, /proc/meminfo and /proc/cmdline are the host's, the hostname is the host's,
and /sys and /proc/sys are read-only. The wrappers also drop CAP_SYS_MODULE, CAP_SYS_BOOT and
CAP_SYS_TIME, so an action a role forgot to guard with ``clusterctl_live_actions`` fails loudly instead of
changing the machine the simulation runs on.

Namespaces are made with unshare(2) in a forked child and pinned by bind-mounting its
/proc/<pid>/ns/{mnt,uts} onto the namespace files (what ``unshare --mount=FILE`` does), with mount(2)
called directly: ~10 ms per host instead of a shell and a dozen mount(8) processes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import shlex
import shutil
import signal
import socket
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from sim.hosts import stubs, sysfs
from sim.hosts.hardware import Hardware
from sim.hosts.stubs import peers

STATE_DIR_NAME = ".sim"
SIM_RUN_DIR = "/run/clusterctl-sim"  # where a host sees its state/ dir
PYTHON_CPU_LOG = "python-cpu.log"  # `times` output after every run of the host's python (module runs)
OVERLAID_DIRS = ("etc", "usr/local", "opt", "var")
READ_ONLY_DIRS = ("usr", "boot")
DROPPED_CAPS = ("sys_module", "sys_boot", "sys_time")
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MNT_DETACH = 2

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


class NamespaceError(RuntimeError):
    pass


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise NamespaceError(f"{what}: {os.strerror(errno)}")


def mount(source: str | None, target: str, fstype: str | None = None, flags: int = 0, data: str | None = None) -> None:
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {source} -> {target}")


def umount(target: str, flags: int = MNT_DETACH) -> None:
    _check(_libc.umount2(target.encode(), flags), f"umount {target}")


@dataclass(frozen=True)
class SimHost:
    """One simulated host to bring up: its hardware (faults applied), the fault list, its address."""

    hardware: Hardware
    faults: list
    address: str


@dataclass(frozen=True)
class HostPaths:
    """Where one simulated host's files live (all absolute)."""

    state_dir: Path
    host: str

    @property
    def root(self) -> Path:
        return self.state_dir / self.host

    @property
    def python(self) -> Path:
        return self.root / "python"

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def calls_log(self) -> Path:
        return self.state / "calls.log"

    @property
    def mnt_ns(self) -> Path:
        return self.state_dir / "ns" / f"{self.host}.mnt"

    @property
    def uts_ns(self) -> Path:
        return self.state_dir / "ns" / f"{self.host}.uts"

    def upper(self, real_dir: str) -> Path:
        return self.root / "upper" / real_dir.replace("/", "_")

    def work(self, real_dir: str) -> Path:
        return self.root / "work" / real_dir.replace("/", "_")


def state_dir_of(inventory_dir: Path) -> Path:
    return inventory_dir.resolve() / STATE_DIR_NAME


# ---------------------------------------------------------------------------------------------- mounts


def _mount_points() -> list[str]:
    """Mount points of this process's namespace, in mount order (octal escapes decoded)."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            raw = line.split()[4]
            points.append(raw.encode().decode("unicode_escape"))
    return points


def mounts_under(path: Path) -> list[str]:
    prefix = str(path).rstrip("/")
    return [p for p in _mount_points() if p == prefix or p.startswith(prefix + "/")]


def _mount_state_dir(state_dir: Path) -> None:
    """A private tmpfs on the state dir (fast to fill, gone with ``down``) and, inside it, the ns/ dir
    bind-mounted onto itself: namespace files must sit on a private mount of their own so that each new
    namespace can drop its copies of the others' (see _inside_new_namespace)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    for leftover in state_dir.iterdir():  # files of an older layout under the mount point
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover)
        else:
            leftover.unlink()
    # tmpfs uses memory only for what is written (a few MB per host plus what playbooks install).
    mount("clusterctl-sim", str(state_dir), "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=25%")
    mount(None, str(state_dir), None, MS_PRIVATE)
    ns_dir = state_dir / "ns"
    ns_dir.mkdir()
    mount(str(ns_dir), str(ns_dir), None, MS_BIND)
    mount(None, str(ns_dir), None, MS_PRIVATE)


# ---------------------------------------------------------------------------------------- host files


def _check_layout(state_dir: Path) -> None:
    for real in (*OVERLAID_DIRS, *READ_ONLY_DIRS):
        if state_dir == Path("/" + real) or Path("/" + real) in state_dir.parents:
            raise NamespaceError(
                f"{state_dir}: the simulation state dir cannot live under /{real}, which simulated hosts "
                "overlay or mount read-only; put the inventory elsewhere (e.g. under /work or /tmp)"
            )


def prepare_host_files(paths: HostPaths, sim: SimHost, python: str) -> None:
    """(Re)create the host's directory: fresh overlays, simulated trees, stubs, wrappers."""
    hw = sim.hardware
    paths.state.mkdir(parents=True)
    host_json = {"hardware": hw.to_json(), "faults": sim.faults, "address": sim.address,
                 "state_dir": str(paths.state_dir)}
    (paths.state / "host.json").write_text(json.dumps(host_json, indent=1))
    paths.calls_log.touch()
    for real in OVERLAID_DIRS:
        paths.upper(real).mkdir(parents=True)
        paths.work(real).mkdir(parents=True)
    sysfs.write_tree(paths.upper("etc"), sysfs.etc_files(hw))
    stubs.install(paths.upper("usr/local") / "bin", python)
    sysfs.write_tree(paths.root / "sys" / "class", sysfs.class_tree(hw))
    sysfs.write_tree(paths.root / "sys" / "pci", sysfs.pci_tree(hw))
    sysfs.write_tree(paths.root / "sys" / "virtual", sysfs.virtual_tree(hw))
    sysfs.write_tree(paths.root / "proc", sysfs.proc_files(hw))
    _write_wrappers(paths, hw, sim.address, python)


def _write_wrappers(paths: HostPaths, hw: Hardware, address: str, python: str) -> None:
    if hw.unreachable:
        body = (
            f'echo "ssh: connect to host {address} port 22: No route to host" >&2\n'
            "exit 255\n"
        )
        python_body = run_body = body
    else:
        drop = ",".join(f"-{cap}" for cap in DROPPED_CAPS)
        enter = (
            f"nsenter --mount={shlex.quote(str(paths.mnt_ns))} --uts={shlex.quote(str(paths.uts_ns))} "
            '--wd="$wd" -- '
            f"setpriv --bounding-set {drop} --inh-caps {drop} -- "
            f"env SYSTEMD_OFFLINE=1 CLUSTERCTL_SIM_HOST={shlex.quote(hw.host)}"
        )
        # Keep the caller's directory, except under /run, which is the host's own tmpfs inside.
        workdir = 'case "$PWD" in /run|/run/*) wd=/ ;; *) wd="$PWD" ;; esac\n'
        # Not exec'd: the shell waits and appends the CPU time its child used (user + system, `times`) to
        # state/python-cpu.log, so benchmarks can tell the host side of a run from the controller's.
        python_body = workdir + (
            f'{enter} PATH="{HOST_PATH}:$PATH" {shlex.quote(python)} "$@"\n'
            "rc=$?\n"
            f"times >> {shlex.quote(str(paths.state / PYTHON_CPU_LOG))} 2>/dev/null\n"
            "exit $rc\n"
        )
        run_body = workdir + f'exec {enter} PATH="{HOST_PATH}" "$@"\n'
    header = "#!/bin/sh\n# Simulated host {host}: {what} (written by `clusterctl virtual up`).\n"
    for path, what, body in (
        (paths.python, "the venv's python inside the host's namespaces", python_body),
        (paths.run, "runs its arguments inside the host's namespaces", run_body),
    ):
        path.write_text(header.format(host=hw.host, what=what) + body)
        path.chmod(0o755)


# ------------------------------------------------------------------------------------ namespaces


def _inside_new_namespace(paths: HostPaths, cpu_dir: Path, node_dir: Path) -> None:
    """Runs in the forked child after unshare(): build the host's view of the filesystem."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Other hosts' namespace files would otherwise be copied into (and pinned by) this namespace.
    umount(str(paths.state_dir / "ns"))
    for real in READ_ONLY_DIRS:
        if os.path.isdir("/" + real):
            mount("/" + real, "/" + real, None, MS_BIND | MS_REC)
            mount(None, "/" + real, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    for real in OVERLAID_DIRS:
        if os.path.isdir("/" + real):
            options = f"lowerdir=/{real},upperdir={paths.upper(real)},workdir={paths.work(real)}"
            mount("overlay", "/" + real, "overlay", 0, options)
    mount("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=755,size=65536k")
    os.makedirs(SIM_RUN_DIR)
    os.makedirs("/run/lock", mode=0o1777)
    mount(str(paths.state), SIM_RUN_DIR, None, MS_BIND)
    sys_root = paths.root / "sys"
    mount(str(cpu_dir), "/sys/devices/system/cpu", None, MS_BIND)
    mount(str(node_dir), "/sys/devices/system/node", None, MS_BIND)
    for real, ours in (("/sys/class", "class"), ("/sys/bus/pci/devices", "pci"), ("/sys/devices/virtual", "virtual")):
        mount("overlay", real, "overlay", MS_RDONLY, f"lowerdir={sys_root / ours}:{real}")
    for name in ("cpuinfo", "meminfo", "cmdline"):
        mount(str(paths.root / "proc" / name), f"/proc/{name}", None, MS_BIND)
    for target in ("/proc/sys", "/proc/sysrq-trigger"):
        if os.path.exists(target):
            mount(target, target, None, MS_BIND)
    for point in _mount_points():
        if point in ("/sys", "/proc/sys", "/proc/sysrq-trigger") or point.startswith("/sys/"):
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    socket.sethostname(paths.host)


def create_namespace(paths: HostPaths, cpu_dir: Path, node_dir: Path) -> None:
    """Fork; the child unshares and sets up; the parent pins the child's namespaces to the ns files."""
    for ns_file in (paths.mnt_ns, paths.uts_ns):
        ns_file.touch()
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        os.close(ready_r)
        os.close(done_w)
        status = b"ok"
        try:
            _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS), "unshare")
            _inside_new_namespace(paths, cpu_dir, node_dir)
        except BaseException:
            status = traceback.format_exc(limit=3).encode()
        os.write(ready_w, status)
        os.read(done_r, 1)  # stay alive until the parent has pinned the namespaces
        os._exit(0)
    os.close(ready_w)
    os.close(done_r)
    try:
        status = os.read(ready_r, 65536)
        if status != b"ok":
            raise NamespaceError(f"{paths.host}: setting up the namespace failed:\n{status.decode(errors='replace')}")
        mount(f"/proc/{pid}/ns/mnt", str(paths.mnt_ns), None, MS_BIND)
        mount(f"/proc/{pid}/ns/uts", str(paths.uts_ns), None, MS_BIND)
    finally:
        os.close(done_w)
        os.close(ready_r)
        os.waitpid(pid, 0)


# ---------------------------------------------------------------------------------------- up / down


def _namespace_inodes(ns_files: list[Path]) -> set[str]:
    inodes = set()
    for ns_file in ns_files:
        try:
            inodes.add(f"mnt:[{os.stat(ns_file).st_ino}]")
        except OSError:
            continue
    return inodes


def _kill_processes_in(ns_links: set[str]) -> int:
    """SIGKILL processes still inside the hosts' mount namespaces (a hung stub, a forgotten daemon)."""
    if not ns_links:
        return 0
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/mnt") in ns_links:
                os.kill(int(entry), signal.SIGKILL)
                killed += 1
        except OSError:
            continue
    return killed


def down(state_dir: Path) -> int:
    """Tear down every simulated host under ``state_dir``; returns how many mounts were removed.

    Safe after a killed ``up`` or ``down``: it works from what /proc/self/mountinfo shows, not from a
    record of what was created.
    """
    ns_dir = state_dir / "ns"
    mounted_ns = [Path(p) for p in mounts_under(ns_dir) if p != str(ns_dir) and p.endswith(".mnt")]
    _kill_processes_in(_namespace_inodes(mounted_ns))
    removed = 0
    for point in reversed(mounts_under(state_dir)):
        try:
            umount(point)
            removed += 1
        except NamespaceError:
            continue  # already gone with its parent (lazy detach)
    return removed


def up(state_dir: Path, hosts: dict[str, SimHost], python: str | None = None) -> None:
    """(Re)create every host in ``hosts``; ``python`` is the interpreter the wrappers run (default: ours)."""
    if os.geteuid() != 0:
        raise NamespaceError("simulated hosts need root (mount and UTS namespaces, overlay mounts)")
    python = python or sys.executable
    _check_layout(state_dir)
    down(state_dir)
    _mount_state_dir(state_dir)
    cache = state_dir / "cache"
    cache.mkdir()
    peers.write_index(state_dir, {name: (sim.hardware, sim.address) for name, sim in hosts.items()})
    try:
        for host, sim in hosts.items():
            paths = HostPaths(state_dir, host)
            prepare_host_files(paths, sim, python)
            if not sim.hardware.unreachable:
                # /sys/devices/system/{cpu,node} are the same on every host with the same CPUs: written once.
                create_namespace(paths, sysfs.write_cached_tree(cache, "cpu", sysfs.cpu_tree(sim.hardware)),
                                 sysfs.write_cached_tree(cache, "node", sysfs.node_tree(sim.hardware)))
    except BaseException:
        down(state_dir)
        raise
