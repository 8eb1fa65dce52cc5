"""The running machines' processes: find them, stop them, check nothing of them is left, report state.

A machine is a supervisor shell (:data:`SUPERVISOR`) running systemd-nspawn, whose child runs the
machine's systemd as PID 1 (the "leader"), all in cgroups of the machine's own. Its processes are known
from the PIDs recorded under ``machines/<host>/`` and, when those are gone or stale, from /proc (an
nspawn or supervisor whose argv names the state dir); a recorded PID counts only while its process still
is what was recorded (its argv, or for a leader the same host.json through its root).

``down`` works from the recorded PIDs and, after a ``kill -9`` of whatever ran ``up``, from a scan of
/proc for nspawn processes naming this state dir: SIGTERM halts a machine cleanly, SIGKILL to nspawn
and the machine's PID 1 follows after a grace period. nspawn's mounts live in its own mount namespace,
so none is left here when it exits.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sim.hosts.machine_paths import SIM_RUN_DIR
from sim.hosts.state_dir import (
    HOSTNAME,
    HostPaths,
    Layout,
    MachineError,
    _remove_tree,
    check_state_dir,
)

# nspawn exits 133 when the machine's systemd reboots (systemd-nspawn(1)); systemd-nspawn@.service restarts it
# on that status (RestartForceExitStatus=133) and so does this loop: `reboot` inside a machine (Ansible's
# reboot module, a driver change) brings the same machine, overlay and address back. Any other exit ends it.
SUPERVISOR = ('while :; do "$@"; rc=$?; [ "$rc" -eq 133 ] || exit "$rc"; '
              'echo "clusterctl-sim: the machine rebooted (nspawn exit 133); starting it again"; done')
HALT_GRACE_S = 20.0
# The cgroup hierarchies a machine's systemd manages. nspawn --keep-unit uses the cgroup it starts in, and
# this machine's PID 1 is not systemd, so without a cgroup of its own every machine would share the root
# one (nspawn's payload/ and supervisor/ subgroups included) and their systemds would start units in each
# other's cgroups: units failed at random with status 219/CGROUP when machines booted side by side.
CGROUP_ROOTS = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
CGROUP_PARENT = "clusterctl-sim"


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


# -------------------------------------------------------------------------------------- down / leftovers


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
    check_state_dir(state_dir)
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


# ------------------------------------------------------------------------------------------- status


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
