"""Which of an inventory's machines were provisioned since they came up: each machine carries the fact.

Every playbook with roles stamps each host it runs on first (playbooks/tasks/provisioned.yml writes
:data:`PROVISIONED_STAMP`, tagged ``always``; a ``--check`` run writes nothing), as it would a real host.
Whatever a machine writes lands in its overlay's upper dir, which ``virtual up`` creates fresh and ``virtual
down`` removes: the stamp there means "provisioned since this machine came up", whichever directory
provisioning ran from, and nothing outside the machines keeps a record of it.

``virtual up`` on machines that are running and provisioned refuses unless ``--reset``: bringing them up again
discards everything provisioning put on them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from sim.hosts.state_dir import Layout, MachineError

PROVISIONED_STAMP = "/var/lib/clusterctl/provisioned"  # playbooks/tasks/provisioned.yml's dest (a test keeps it)


def provisioned(layout: Layout) -> dict[str, float]:
    """Each machine of ``layout`` whose overlay holds the stamp -> when it was written (the file's mtime)."""
    found: dict[str, float] = {}
    if os.path.islink(layout.state_dir) or not layout.machines_dir.is_dir():
        return found
    for machine in sorted(layout.machines_dir.iterdir()):
        try:
            written = _stamp_time(layout.host(machine.name).upper)  # the name is checked before it is a path
        except MachineError:
            continue
        if written is not None:
            found[machine.name] = written
    return found


def _stamp_time(upper: Path) -> float | None:
    """The stamp's mtime under ``upper``; None unless every directory on its path is a real directory and the
    stamp a regular file (root inside the machine writes there: a symlink it left is never followed)."""
    relative = Path(PROVISIONED_STAMP.lstrip("/"))
    directories = [upper, *(upper / d for d in reversed(relative.parents[:-1]))]
    try:
        if not all(stat.S_ISDIR(os.lstat(d).st_mode) for d in directories):
            return None
        st = os.lstat(upper / relative)
    except OSError:
        return None
    return st.st_mtime if stat.S_ISREG(st.st_mode) else None
