"""Saved runs: every preflight run is written as JSON under the state directory, named by its start time.

``<state dir>/<run id>.json`` where the run id is ``YYYYmmddTHHMMSSZ`` (plus ``-N`` if two runs start in
the same second); the file is the ``--json`` document plus ``run`` metadata (inventory, limit). A run is
named by its id, a unique prefix of it, ``latest``/``previous``, or a path to a JSON file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cluster.errors import ClusterctlError
from preflight.result import CheckResult

DEFAULT_STATE_DIR = Path(".state/preflight")


@dataclass(frozen=True)
class SavedRun:
    id: str
    path: Path
    data: dict[str, Any]

    @property
    def summary(self) -> dict[str, Any]:
        return self.data.get("summary", {})

    @property
    def results(self) -> list[CheckResult]:
        return [CheckResult.from_json(r) for r in self.data.get("results", [])]


def save(state_dir: Path, document: dict[str, Any], meta: dict[str, Any], started: float) -> SavedRun:
    state_dir.mkdir(parents=True, exist_ok=True)
    base = datetime.fromtimestamp(started, UTC).strftime("%Y%m%dT%H%M%SZ")
    data = {**document, "run": {**meta, "id": None}}
    for n in range(1000):
        run_id = base if n == 0 else f"{base}-{n}"
        path = state_dir / f"{run_id}.json"
        data["run"]["id"] = run_id
        try:  # O_EXCL: two runs starting in the same second never overwrite each other
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=1, default=str)
        return SavedRun(run_id, path, data)
    raise ClusterctlError(f"{state_dir}: too many runs starting at {base}")


def runs(state_dir: Path) -> list[SavedRun]:
    """Saved runs, oldest first; unreadable files are skipped (a half-written file from a killed run)."""
    found = []
    for path in sorted(state_dir.glob("*.json"), key=_order) if state_dir.is_dir() else []:
        try:
            found.append(SavedRun(path.stem, path, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue
    return found


def _order(path: Path) -> tuple[str, int]:
    base, _, n = path.stem.partition("-")
    return base, int(n) if n.isdigit() else 0


def load(state_dir: Path, name: str) -> SavedRun:
    as_path = Path(name)
    if name.endswith(".json") and as_path.is_file():
        try:
            return SavedRun(as_path.stem, as_path, json.loads(as_path.read_text()))
        except ValueError as exc:
            raise ClusterctlError(f"{as_path}: not a preflight JSON document: {exc}", exit_code=2) from None
    saved = runs(state_dir)
    if name in ("latest", "previous"):
        index = -1 if name == "latest" else -2
        if len(saved) < -index:
            raise ClusterctlError(f"{state_dir}: no {name} run ({len(saved)} saved)", exit_code=2)
        return saved[index]
    matches = [r for r in saved if r.id == name] or [r for r in saved if r.id.startswith(name)]
    if len(matches) != 1:
        what = "no run" if not matches else f"{len(matches)} runs"
        raise ClusterctlError(
            f"{state_dir}: {what} matching {name!r} (see `clusterctl preflight history`)", exit_code=2
        )
    return matches[0]


@dataclass(frozen=True)
class Change:
    key: tuple[str, str, str, str | None]  # rack, node, check, iu
    before: CheckResult | None
    after: CheckResult | None

    @property
    def kind(self) -> str:
        if self.before is None:
            return "added"
        if self.after is None:
            return "removed"
        return "verdict" if self.before.verdict != self.after.verdict else "reason"


def diff(old: SavedRun, new: SavedRun) -> list[Change]:
    """Results whose verdict or reason changed, appeared or disappeared, in rack/node/check order."""

    def keyed(run: SavedRun) -> dict[tuple, CheckResult]:
        return {(r.rack, r.node, r.check, r.iu): r for r in run.results}

    before, after = keyed(old), keyed(new)
    changes = []
    for key in sorted(set(before) | set(after), key=lambda k: (k[0], k[1], k[2], k[3] or "")):
        a, b = before.get(key), after.get(key)
        if a is None or b is None or a.verdict != b.verdict or a.reason != b.reason:
            changes.append(Change(key, a, b))
    return changes
