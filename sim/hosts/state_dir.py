"""Where an inventory's simulated machines keep their files, and the checks that keep those paths ours.

Layout under ``<inventory_dir>/.sim/`` (the state dir; a plain directory, never a symlink)::

    ssh/id_ed25519[.pub]   the inventory's key pair (0600), kept across up/down
    ssh/known_hosts        every machine's host key at its address (rewritten by every ``up``)
    hosts/peers.json       addresses, LIDs and GUIDs of every host (two-host stubs read it)
    hosts/<host>/state/    host.json (hardware + faults), nvml.json (its GPUs), calls.log; /run/clusterctl-sim inside
    hosts/<host>/sys/      simulated /sys subtrees (class, pci, virtual), overlaid on the real ones
    cache/                 /sys/devices/system/{cpu,node} trees, shared by hosts with identical CPUs
    machines/<host>/upper  the machine's overlay upper dir (everything it writes lands here)
    machines/<host>/nspawn.pid, leader.pid, console.log

Every path is built from a checked host name (:func:`check_hostname`: a DNS label or dotted labels, so
nothing like '..' or '/' reaches a path), and the state dir and the directories in it are used only when
they are real directories of our own that nobody else may write, as is the inventory dir that holds
the state dir (:func:`_real_dir`, :func:`check_state_dir`: root deletes and writes
under them).
"""

from __future__ import annotations

import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from cluster import spec

STATE_DIR_NAME = ".sim"
NVML_FILE = "nvml.json"  # in state/: what NVML answers there, through the stand-in pynvml (its DEFAULT_FILE)
# A DNS label, or dotted labels (the inventory's rule, cluster.spec.HOSTNAME): a host name becomes a directory
# name and a machine name, so nothing else ('..', '/', a leading dot or dash) may reach a path. nspawn's
# machine names stop at 64 characters.
HOSTNAME = spec.HOSTNAME
MAX_HOSTNAME = 64


class MachineError(RuntimeError):
    pass


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
    (a symlinked state dir would make root delete and write through it), or if it is
    someone else's or others may write it (:func:`_check_own_dir`)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        os.mkdir(path, mode)
    _check_own_dir(path)
    return path


def check_state_dir(state_dir: Path) -> None:
    """Before anything is done with ``state_dir`` (``up``, ``down``): the inventory dir above it, and the
    state dir when it exists, are directories of our own that nobody else may write. Checking the state
    dir's path once and then using it by path leaves a window in which whoever may write the directory
    holding it could put a symlink in its place; no one but us may, so the window is closed."""
    _check_own_dir(state_dir.parent, "inventory dir")
    if os.path.lexists(state_dir):
        _check_own_dir(state_dir)


def _check_own_dir(path: Path, what: str = "simulation state dir") -> None:
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise MachineError(f"{path}: is a symlink; refusing to use it as a {what} "
                           "(remove it: `virtual up` creates a real directory)")
    if not stat.S_ISDIR(st.st_mode):
        raise MachineError(f"{path}: exists and is not a directory; refusing to use it as a {what}")
    if st.st_uid != os.geteuid():
        raise MachineError(f"{path}: owned by uid {st.st_uid}, not by us (uid {os.geteuid()}); refusing to use it")
    if st.st_mode & 0o022:
        who = "its group" if st.st_mode & 0o020 else "others"
        raise MachineError(f"{path}: writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}); refusing to use "
                           f"it as a {what}: another user could swap what is in it (chmod go-w {path})")


def _remove_tree(path: Path) -> None:
    if os.path.islink(path):
        raise MachineError(f"{path}: is a symlink; refusing to delete through it")
    if path.exists():
        shutil.rmtree(path)
