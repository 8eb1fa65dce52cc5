"""When a virtual inventory's machines were last brought up (``virtual up``) and last provisioned.

``virtual up`` on hosts that are up discards their state (the simulated hosts keep it on a tmpfs that
``up`` replaces), so it refuses when they were provisioned since they came up, unless ``--reset``. The
record is the inventory's, whatever the current directory: it lives in the machines' own state directory
under the inventory (``<inventory dir>/.sim/run-state.json``, which ``virtual up`` creates and ``virtual
down`` keeps), so provisioning from one directory and running ``virtual up`` from another see the same
record. An inventory without that directory never had machines brought up from it (a real inventory,
often a checked-in repository): nothing is written there, and nothing needs protecting.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

# The simulated machines' state directory under a virtual inventory: sim/hosts/state_dir.py's STATE_DIR_NAME
# (production code never imports the simulators; a test keeps the two equal).
VIRTUAL_STATE_DIR = ".sim"
RECORD_NAME = "run-state.json"


def record_path(inventory: str | os.PathLike) -> Path:
    """Where the record of ``inventory`` (its directory, or a hosts file in it) is kept."""
    path = Path(inventory).resolve()
    directory = path if path.is_dir() else path.parent  # Ansible's inventory_dir, as sim.hosts.lifecycle's
    return directory / VIRTUAL_STATE_DIR / RECORD_NAME


def read(inventory: str | os.PathLike) -> dict:
    try:
        data = json.loads(record_path(inventory).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def note(inventory: str | os.PathLike, event: str) -> None:
    """Record that ``event`` ("up" or "provisioned") happened now, where machines were brought up from this
    inventory (its state directory exists; it is never created here). Best effort: a state directory we
    cannot write must not fail the command that did the work."""
    path = record_path(inventory)
    if not path.parent.is_dir() or path.parent.is_symlink():
        return
    data = {**read(inventory), event: time.time()}
    try:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)
    except OSError:
        pass


def provisioned_since_up(inventory: str | os.PathLike) -> float | None:
    """The time of the last provision run after the last ``up`` (None if none)."""
    data = read(inventory)
    provisioned, up = data.get("provisioned"), data.get("up")
    if isinstance(provisioned, int | float) and (not isinstance(up, int | float) or provisioned > up):
        return float(provisioned)
    return None
