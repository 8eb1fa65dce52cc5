"""Host kernel limits that many machines at once run into, checked (and raised) before any machine boots.

``fs.inotify.max_user_instances`` caps the inotify instances of one real user ID on the whole host, and every
machine runs as root: each booted machine holds 5 (systemd PID 1 three, systemd-logind one, dbus-daemon one:
counted on a booted Debian 12 machine from ``/proc/*/fd`` links to ``anon_inode:inotify``). The kernel's
default is 128 (proc_sys_fs_inotify(5)), so the 26th machine's systemd fails "Failed to allocate manager
object: Too many open files" and nspawn exits 255: the 64- and 128-machine boots of the previous milestone
timed out this way. Container hosts raise it as a matter of course (LXD's production setup recommends
1048576, its snap sets 1024; Podman raised its own to 524288). ``up`` raises it to what the machines need
and says so, or, where it may not write the sysctl, refuses to boot with the command that would.
Watches (``max_user_watches``, 16 per machine measured the same way) are checked the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

INOTIFY_DIR = Path("/proc/sys/fs/inotify")
# Measured 5 instances and 16 watches per booted machine; the rest is room for what provisioning starts
# (a login manager for a session, a unit that watches a path) without a second trip to the limit.
INSTANCES_PER_MACHINE = 8
WATCHES_PER_MACHINE = 64


class LimitError(RuntimeError):
    pass


@dataclass(frozen=True)
class Limit:
    name: str  # the sysctl: fs.inotify.max_user_instances
    current: int
    in_use: int  # by this user, before the new machines
    per_machine: int

    def needed(self, machines: int) -> int:
        return self.in_use + machines * self.per_machine

    def raise_to(self, machines: int) -> int | None:
        """The value to write for ``machines`` more machines, or None when the current limit has room."""
        want = self.needed(machines)
        return None if want <= self.current else want


def inotify_in_use(proc: Path = Path("/proc"), uid: int | None = None) -> tuple[int, int]:
    """(instances, watches) held by processes of ``uid`` (default: ours), from /proc/PID/fd and fdinfo."""
    uid = os.getuid() if uid is None else uid
    instances = watches = 0
    for entry in proc.iterdir() if proc.is_dir() else ():
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid != uid:
                continue
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            try:
                if os.readlink(fd) != "anon_inode:inotify":
                    continue
                info = (entry / "fdinfo" / fd.name).read_text()
            except OSError:
                continue
            instances += 1
            watches += sum(1 for line in info.splitlines() if line.startswith("inotify wd:"))
    return instances, watches


def inotify_limits(directory: Path = INOTIFY_DIR, proc: Path = Path("/proc")) -> list[Limit]:
    instances, watches = inotify_in_use(proc)
    return [
        Limit("fs.inotify.max_user_instances", int((directory / "max_user_instances").read_text()), instances,
              INSTANCES_PER_MACHINE),
        Limit("fs.inotify.max_user_watches", int((directory / "max_user_watches").read_text()), watches,
              WATCHES_PER_MACHINE),
    ]


def ensure_room_for(machines: int, directory: Path = INOTIFY_DIR, proc: Path = Path("/proc"),
                    progress=lambda line: None) -> list[str]:
    """Raise every limit ``machines`` more machines would exceed; returns what was raised, one line each.
    Raises :class:`LimitError` (touching nothing more) when a limit is short and cannot be written."""
    raised = []
    for limit in inotify_limits(directory, proc):
        value = limit.raise_to(machines)
        if value is None:
            continue
        path = directory / limit.name.rsplit(".", 1)[1]
        try:
            path.write_text(f"{value}\n")
        except OSError as exc:
            raise LimitError(
                f"{machines} machines need {limit.name} >= {value} (now {limit.current}, {limit.in_use} in use; "
                f"~{limit.per_machine} per machine) and {path} cannot be written ({exc.strerror}): "
                f"run `sysctl -w {limit.name}={value}` as root, then retry"
            ) from None
        line = f"raised {limit.name} {limit.current} -> {value} for {machines} machines"
        progress(line)
        raised.append(line)
    return raised
