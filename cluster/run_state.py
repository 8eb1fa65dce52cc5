"""When an inventory's hosts were last brought up (``virtual up``) and last provisioned.

``virtual up`` on hosts that are up discards their state (the simulated hosts keep it on a tmpfs that
``up`` replaces), so it refuses when they were provisioned since they came up, unless ``--reset``. The
record lives with the other run state (``.state/inventories/<name>-<hash>.json``, next to
``.state/runs`` and ``.state/preflight``), never in the inventory directory itself, which is often a
checked-in repository; the hash is of the inventory's resolved path.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

STATE_DIR = Path(".state") / "inventories"


def _record_path(inventory: str | os.PathLike, state_dir: Path = STATE_DIR) -> Path:
    resolved = Path(inventory).resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    return state_dir / f"{resolved.name}-{digest}.json"


def read(inventory: str | os.PathLike, state_dir: Path = STATE_DIR) -> dict:
    try:
        data = json.loads(_record_path(inventory, state_dir).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def note(inventory: str | os.PathLike, event: str, state_dir: Path = STATE_DIR) -> None:
    """Record that ``event`` ("up" or "provisioned") happened now. Best effort: a read-only working
    directory must not fail the command that did the work."""
    path = _record_path(inventory, state_dir)
    data = {**read(inventory, state_dir), "inventory": str(Path(inventory).resolve()), event: time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        tmp.replace(path)
    except OSError:
        pass


def provisioned_since_up(inventory: str | os.PathLike, state_dir: Path = STATE_DIR) -> float | None:
    """The time of the last provision run after the last ``up`` (None if none)."""
    data = read(inventory, state_dir)
    provisioned, up = data.get("provisioned"), data.get("up")
    if isinstance(provisioned, int | float) and (not isinstance(up, int | float) or provisioned > up):
        return float(provisioned)
    return None
