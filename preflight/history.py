"""Saved runs: every preflight run is written as JSON under the state directory, named by its start time.

``<state dir>/<run id>.json`` where the run id is ``YYYYmmddTHHMMSSZ`` (plus ``-N`` if two runs start in
the same second); the file is the ``--json`` document plus ``run`` metadata (inventory, limit). A run is
named by its id, a unique prefix of it, ``latest``/``previous``, or a path to a JSON file.

The state directory is relative to the working directory and shared by every inventory run from there, so
each run records its inventory's absolute path too (``inventory_path``). ``latest``/``previous`` may be
scoped to one inventory (:func:`load`'s ``inventory``); :func:`different_inventories` tells two runs of
different inventories apart, so that a comparison of two clusters whose host names match is never
presented as one cluster's change.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from common.errors import ClusterctlError, ExitCode
from preflight.result import CheckResult, Verdict

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
    # A run carries host output (reasons, evidence): private, like provision's events.jsonl (the hardening work: run files 0600).
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    base = datetime.fromtimestamp(started, UTC).strftime("%Y%m%dT%H%M%SZ")
    data = {**document, "run": {**meta, "id": None}}
    for n in range(1000):
        run_id = base if n == 0 else f"{base}-{n}"
        path = state_dir / f"{run_id}.json"
        data["run"]["id"] = run_id
        try:  # O_EXCL: two runs starting in the same second never overwrite each other
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=1, default=str)
        return SavedRun(run_id, path, data)
    raise ClusterctlError(f"{state_dir}: too many runs starting at {base}")


def runs(state_dir: Path, inventory: str | os.PathLike | None = None) -> list[SavedRun]:
    """Saved runs, oldest first (``inventory``: only that inventory's); unreadable files are skipped (a
    half-written file from a killed run)."""
    found = []
    for path in sorted(state_dir.glob("*.json"), key=_order) if state_dir.is_dir() else []:
        try:
            found.append(SavedRun(path.stem, path, json.loads(path.read_text())))
        except (OSError, ValueError):
            continue
    if inventory is not None:
        wanted = str(Path(inventory).resolve())
        found = [r for r in found if inventory_of(r) == wanted]
    return found


def inventory_of(run: SavedRun) -> str | None:
    """The absolute path of the run's inventory (a run saved without one: its path as given, resolved
    against the working directory)."""
    meta = run.data.get("run", {})
    given = meta.get("inventory_path") or meta.get("inventory")
    return str(Path(given).resolve()) if given else None


def different_inventories(old: SavedRun, new: SavedRun) -> tuple[str, str] | None:
    """The two runs' inventories as they were given, when they are not the same inventory; else None."""
    a, b = inventory_of(old), inventory_of(new)
    if a is None or b is None or a == b:
        return None
    return (old.data.get("run", {}).get("inventory") or a, new.data.get("run", {}).get("inventory") or b)


def checks_covered(run: SavedRun, known: tuple[str, ...]) -> str:
    """``all 17``, or the checks a ``--checks``/``--skip`` run covered (``versions``; ``5 of 17``)."""
    checks = run.data.get("run", {}).get("checks") or run.summary.get("checks")
    if not checks:
        return "-"
    if set(known) <= set(checks):
        return f"all {len(known)}"
    return ", ".join(checks) if len(checks) <= 3 else f"{len(checks)} of {len(known)}"


def _order(path: Path) -> tuple[str, int]:
    base, _, n = path.stem.partition("-")
    return base, int(n) if n.isdigit() else 0


def load(state_dir: Path, name: str, inventory: str | os.PathLike | None = None) -> SavedRun:
    """The run ``name`` names; ``inventory``: ``latest``/``previous`` among that inventory's runs."""
    as_path = Path(name)
    if name.endswith(".json") and as_path.is_file():
        try:
            return SavedRun(as_path.stem, as_path, json.loads(as_path.read_text()))
        except ValueError as exc:
            raise ClusterctlError(f"{as_path}: not a preflight JSON document: {exc}", exit_code=ExitCode.USAGE) from None
    saved = runs(state_dir)
    if name in ("latest", "previous"):
        index = -1 if name == "latest" else -2
        mine = runs(state_dir, inventory) if inventory is not None else saved
        if len(mine) < -index:
            of = f" of {inventory}" if inventory is not None else ""
            raise ClusterctlError(f"{state_dir}: no {name} run{of} ({len(mine)} saved)", exit_code=ExitCode.USAGE)
        return mine[index]
    matches = [r for r in saved if r.id == name] or [r for r in saved if r.id.startswith(name)]
    if len(matches) != 1:
        what = "no run" if not matches else f"{len(matches)} runs"
        raise ClusterctlError(
            f"{state_dir}: {what} matching {name!r} (see `clusterctl preflight history`)", exit_code=ExitCode.USAGE
        )
    return matches[0]


# How bad a verdict is, for telling a regression from a fix (PASS and SKIP both mean "fine here").
RANK = {Verdict.PASS: 0, Verdict.SKIP: 0, Verdict.WARN: 1, Verdict.ERROR: 2, Verdict.UNREACHABLE: 2, Verdict.FAIL: 3}
KIND_ORDER = ("regression", "fixed", "changed", "new", "gone")


@dataclass(frozen=True)
class Change:
    key: tuple[str, str, str, str | None]  # rack, node, check, iu
    before: CheckResult | None
    after: CheckResult | None

    @property
    def kind(self) -> str:
        """regression (worse verdict, or a new result that is not fine), fixed (better), changed (as bad,
        another verdict: ERROR <-> UNREACHABLE), new / gone (a result only one run has, e.g. a new IU)."""
        if self.before is None:
            return "regression" if RANK[self.after.verdict] > 0 else "new"
        if self.after is None:
            return "gone"
        worse = RANK[self.after.verdict] - RANK[self.before.verdict]
        return "regression" if worse > 0 else "fixed" if worse < 0 else "changed"


@dataclass(frozen=True)
class Diff:
    changes: list[Change]  # regressions first, then fixes, changes, new, gone
    nodes: list[str]  # the nodes both runs checked: only these are compared
    checks: list[str]  # the checks both runs ran
    only_old: dict[str, list[str]]  # "nodes"/"checks" the old run covered and the new one did not
    only_new: dict[str, list[str]]

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.kind == "regression"]

    @property
    def same_scope(self) -> bool:
        return not any(self.only_old.values()) and not any(self.only_new.values())


def _scope(run: SavedRun) -> tuple[set[str], set[str]]:
    results = run.results
    checks = run.data.get("run", {}).get("checks") or run.summary.get("checks") or [r.check for r in results]
    return {r.node for r in results}, set(checks)


def diff(old: SavedRun, new: SavedRun) -> Diff:
    """Verdict changes between two runs, over what both ran: the nodes both checked and the checks both
    selected. A result outside that (a node one run's --limit left out, a check one run skipped) is not
    a change; a reason that changed under the same verdict is not one either (numbers move every run)."""
    old_nodes, old_checks = _scope(old)
    new_nodes, new_checks = _scope(new)
    nodes, checks = old_nodes & new_nodes, old_checks & new_checks

    def keyed(run: SavedRun) -> dict[tuple, CheckResult]:
        return {(r.rack, r.node, r.check, r.iu): r for r in run.results if r.node in nodes and r.check in checks}

    before, after = keyed(old), keyed(new)
    changes = []
    for key in sorted(set(before) | set(after), key=lambda k: (k[0], k[1], k[2], k[3] or "")):
        a, b = before.get(key), after.get(key)
        if a is None or b is None or a.verdict != b.verdict:
            changes.append(Change(key, a, b))
    changes.sort(key=lambda c: KIND_ORDER.index(c.kind))  # stable: rack/node/check order within a kind
    return Diff(
        changes,
        sorted(nodes),
        sorted(checks),
        {"nodes": sorted(old_nodes - new_nodes), "checks": sorted(old_checks - new_checks)},
        {"nodes": sorted(new_nodes - old_nodes), "checks": sorted(new_checks - old_checks)},
    )
