"""Drill files: a load phase, faults at set times on one target, recovery, and the checks that decide
pass/fail (YAML, strict; docs/drills.md has the format and the library in operate/drills/)::

    name: engine-crash
    description: the unit's vLLM killed (SIGKILL) mid-load; systemd restarts it
    load: {mix: production-mix, rate_per_s: 4, duration_s: 90, seed: 1}
    faults:
      - {kind: engine_crash, at_s: 30, hold_s: 20}   # injected 30 s into the load, undone 20 s later
    checks:
      failed_not_streaming_max: 0      # failed requests that had received no token: the edge must reselect
      route_away_s_max: 2              # last request sent to the faulted unit, seconds after the fault
      ttft_p99_ratio_max: 1.15         # p99 TTFT during the fault / before it
      recover_s_max: 300               # undo -> the unit serves a request again
      blast_radius_errors_max: 0       # failed requests on every other unit

``mix``: a scenario of operate/scenarios by name, or a file (relative to the drill file). Faults may not
overlap (one target, one fault at a time) and each must end before the load does. The load runs
``duration_s``, and past it until the faulted unit serves again or its recovery limit runs out
(:meth:`Drill.recovery_deadline`): a vLLM restart that loads weights for minutes is measured, not cut off. A
check left out is not judged. Strict: anything else is one :class:`ScenarioError` line naming the file, the field and the value
(exit 2, nothing touched).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from operate.drill_faults import KINDS, SCOPE
from operate.scenario import (
    DEFAULT_SCENARIO,
    FieldReader,
    Scenario,
    ScenarioError,
    load_scenario,
    yaml_problem,
)

DRILLS_DIR = Path(__file__).parent / "drills"
_TOP = {"name", "description", "load", "faults", "checks", "recovery"}
# recovery: remediate -> the ladder (operate/remediate.py) brings the unit back instead of the fault's undo;
# only after faults the ladder can repair (a restart that gets a frozen or weightless unit nowhere would only
# race the undo)
RECOVERIES = ("undo", "remediate")
REMEDIABLE = ("engine_crash", "graceful_stop")
_LOAD = {"mix", "rate_per_s", "duration_s", "seed", "timeout_s"}
_FAULT = {"kind", "at_s", "hold_s"}
# check -> (what it bounds, the upper limit of a sane value)
CHECKS = {
    "failed_not_streaming_max": ("failed requests that had not started streaming", 1e9),
    "failed_streaming_max": ("failed requests cut while streaming from the faulted unit", 1e9),
    "failed_in_flight_max": ("failed requests sent before the fault took effect (in flight when it hit)", 1e9),
    "route_away_s_max": ("seconds from the fault to the last request routed to the faulted unit", 3600),
    "consul_critical_s_max": ("seconds from the fault until Consul shows the unit critical", 3600),
    "ttft_p99_ratio_max": ("p99 TTFT during the fault over the baseline's", 1000),
    "recover_s_max": ("seconds from the undo until the unit serves again", 3600),
    "serving_again_s_max": ("seconds from the fault until the unit streams a first token again", 3600),
    "blast_radius_errors_max": ("failed requests on units other than the faulted one", 1e9),
    "served_during_fault_max": ("requests the faulted unit answered in full during the fault", 1e9),
}
MAX_DURATION_S = 86400.0
# the longest an undo's commands may take (two, each within drill_faults.COMMAND_TIMEOUT_S): the load is
# planned this much past the last fault's end so its recovery limit is still covered after a slow undo
UNDO_ALLOWANCE_S = 120.0


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    at_s: float  # after the load starts
    hold_s: float  # until the undo

    @property
    def scope(self) -> str:
        return SCOPE[self.kind]

    @property
    def end_s(self) -> float:
        return self.at_s + self.hold_s


@dataclass(frozen=True)
class Drill:
    name: str
    mix: Scenario
    rate_per_s: float
    duration_s: float
    faults: tuple[FaultSpec, ...]
    checks: dict[str, float]
    source: str = "<drill>"
    description: str = ""
    seed: int = 1
    timeout_s: float = 60.0
    recovery: str = "undo"  # or "remediate": clusterctl remediate's ladder after each fault's hold

    def recovery_deadline(self, last_at: float, last_undone: float) -> float | None:
        """Until when (seconds into the load) the load waits past ``duration_s`` for the faulted unit to serve
        again, given when the last fault was injected and undone: its recovery checks' limits; None when the
        drill judges no recovery (the load ends at ``duration_s``)."""
        ends = []
        if "recover_s_max" in self.checks:
            ends.append(last_undone + self.checks["recover_s_max"])
        if "serving_again_s_max" in self.checks:
            ends.append(last_at + self.checks["serving_again_s_max"])
        return max(self.duration_s, *ends) if ends else None

    @property
    def planned_s(self) -> float:
        """How long a load is planned: ``duration_s``, or the recovery deadline after an undo as slow as
        :data:`UNDO_ALLOWANCE_S` when that is later."""
        last = self.faults[-1]
        deadline = self.recovery_deadline(last.at_s, last.end_s + UNDO_ALLOWANCE_S)
        return self.duration_s if deadline is None else deadline

    @property
    def scope(self) -> str:
        """"edge" for an edge's restart (the node that runs it; no unit of it is faulted), "node" when any fault
        takes a whole node, else "unit"."""
        scopes = {f.scope for f in self.faults}
        return "edge" if "edge" in scopes else "node" if "node" in scopes else "unit"


def _mix(read: FieldReader, value, base: Path | None) -> Scenario:
    name = read.text(value, "load.mix")
    if "/" not in name and not name.endswith((".yml", ".yaml")):
        path = DEFAULT_SCENARIO.parent / f"{name}.yml"
        if not path.is_file():
            known = sorted(p.stem for p in DEFAULT_SCENARIO.parent.glob("*.yml"))
            raise read.fail("load.mix", f"no such scenario; the library has {', '.join(known)}", value)
    else:
        path = (base / name) if base is not None and not Path(name).is_absolute() else Path(name)
        if not path.is_file():
            raise read.fail("load.mix", f"no such file ({path})", value)
    return load_scenario(path)


def parse_drill(data, source: str = "<drill>", base: Path | None = None) -> Drill:
    """The drill in ``data`` (decoded YAML); ``base``: the folder a relative ``mix`` file is read from."""
    read = FieldReader(source)
    top = read.mapping(data, "", _TOP, {"name", "load", "faults"})
    name = read.text(top["name"], "name")
    load = read.mapping(top["load"], "load", _LOAD, {"rate_per_s", "duration_s"})
    mix = _mix(read, load.get("mix", DEFAULT_SCENARIO.stem), base)
    rate = read.number(load["rate_per_s"], "load.rate_per_s", 0, 10_000, low_open=True)
    duration = read.number(load["duration_s"], "load.duration_s", 0, MAX_DURATION_S, low_open=True)
    seed = read.integer(load.get("seed", 1), "load.seed", 0, 2**31)
    timeout = read.number(load.get("timeout_s", 60.0), "load.timeout_s", 0, 3600, low_open=True)
    if not isinstance(top["faults"], list) or not top["faults"]:
        raise read.fail("faults", "expected a non-empty list of faults", top["faults"])
    faults = []
    for i, value in enumerate(top["faults"]):
        field = f"faults[{i}]"
        item = read.mapping(value, field, _FAULT, {"kind", "at_s", "hold_s"})
        kind = read.text(item["kind"], f"{field}.kind")
        if kind not in KINDS:
            raise read.fail(f"{field}.kind", f"unknown fault kind; expected one of {', '.join(KINDS)}", kind)
        at = read.number(item["at_s"], f"{field}.at_s", 0, MAX_DURATION_S)
        hold = read.number(item["hold_s"], f"{field}.hold_s", 0, MAX_DURATION_S, low_open=True)
        fault = FaultSpec(kind, at, hold)
        if fault.end_s >= duration:
            raise read.fail(f"{field}.hold_s", f"the fault ends at {fault.end_s:g} s, not before the load does "
                                               f"({duration:g} s): recovery would go unmeasured", item["hold_s"])
        if faults and at < faults[-1].end_s:
            raise read.fail(f"{field}.at_s", f"overlaps the fault before it (undone at {faults[-1].end_s:g} s): "
                                             f"one fault at a time", item["at_s"])
        if faults and (fault.scope == "edge") != (faults[0].scope == "edge"):
            raise read.fail(f"{field}.kind", "an edge's restart and a fault of units or nodes have different "
                                             "targets: one drill each", kind)
        faults.append(fault)
    checks_data = read.mapping(top.get("checks", {}), "checks", set(CHECKS), set())
    checks = {key: read.number(value, f"checks.{key}", 0, CHECKS[key][1]) for key, value in checks_data.items()}
    recovery = read.text(top.get("recovery", "undo"), "recovery")
    if recovery not in RECOVERIES:
        raise read.fail("recovery", f"expected one of {', '.join(RECOVERIES)}", recovery)
    if recovery == "remediate" and any(f.kind not in REMEDIABLE for f in faults):
        raise read.fail("recovery", f"the ladder repairs only {', '.join(REMEDIABLE)} faults; this drill has "
                                    f"{', '.join(sorted({f.kind for f in faults} - set(REMEDIABLE)))}", recovery)
    return Drill(name, mix, rate, duration, tuple(faults), checks, source,
                 read.text(top.get("description", ""), "description"), seed, timeout, recovery)


def resolve(name_or_path: str) -> Path:
    """A library drill's file by name (``engine-crash``), else the path as given."""
    library = DRILLS_DIR / f"{name_or_path}.yml"
    if "/" not in name_or_path and library.is_file():
        return library
    return Path(name_or_path)


def load_drill(name_or_path: str) -> Drill:
    path = resolve(name_or_path)
    try:
        text = path.read_text()
    except OSError as exc:
        known = ", ".join(p.stem for p in library())
        raise ScenarioError(f"{path}: cannot read the drill file: {exc.strerror or exc} (the library: "
                            f"{known})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: {yaml_problem(exc)}") from None
    return parse_drill(data, str(path), path.parent)


def library() -> list[Path]:
    return sorted(DRILLS_DIR.glob("*.yml"))
