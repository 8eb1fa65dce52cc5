"""Drill files: the library parses; every malformed file is one ScenarioError line naming the file, the field
and the value (exit 2, nothing touched)."""

from __future__ import annotations

import copy

import pytest
import yaml

from common.errors import ExitCode
from operate.drill_faults import KINDS
from operate.drill_scenario import UNDO_ALLOWANCE_S, library, load_drill, parse_drill, resolve
from operate.scenario import ScenarioError

pytestmark = pytest.mark.unit

VALID = {"name": "d", "load": {"mix": "production-mix", "rate_per_s": 4, "duration_s": 60},
         "faults": [{"kind": "engine_crash", "at_s": 10, "hold_s": 10}],
         "checks": {"failed_not_streaming_max": 0, "route_away_s_max": 2}}


def with_(path: str, value) -> dict:
    data = copy.deepcopy(VALID)
    *parents, last = path.split(".")
    where = data
    for key in parents:
        where = where[int(key)] if isinstance(where, list) else where[key]
    where[last] = value
    return data


def error_of(data) -> str:
    with pytest.raises(ScenarioError) as caught:
        parse_drill(data, "d.yml")
    assert caught.value.exit_code == ExitCode.USAGE
    message = str(caught.value)
    assert "\n" not in message and message.startswith("d.yml: ")
    return message


def test_every_library_drill_parses_and_together_they_cover_every_fault_kind():
    drills = [load_drill(str(p)) for p in library()]
    assert {f.kind for d in drills for f in d.faults} == set(KINDS)
    assert all(d.checks and d.description for d in drills)
    crash = load_drill("engine-crash")
    assert crash.source == str(resolve("engine-crash")) and crash.mix.name == "production-mix"
    assert crash.checks["route_away_s_max"] == 2 and crash.checks["ttft_p99_ratio_max"] == 1.15


def test_a_valid_drill():
    drill = parse_drill(VALID, "d.yml")
    assert (drill.rate_per_s, drill.duration_s, drill.seed, drill.scope) == (4.0, 60.0, 1, "unit")
    assert [(f.kind, f.at_s, f.end_s) for f in drill.faults] == [("engine_crash", 10.0, 20.0)]
    node = parse_drill(with_("faults", [{"kind": "consul_agent_down", "at_s": 1, "hold_s": 2}]), "d.yml")
    assert node.scope == "node"


def test_a_drill_judging_recovery_plans_its_load_past_its_duration_to_the_recovery_limit():
    plain = parse_drill(VALID, "d.yml")
    assert plain.recovery_deadline(10, 21) is None and plain.planned_s == 60
    judged = parse_drill(with_("checks", {"recover_s_max": 300, "serving_again_s_max": 200}), "d.yml")
    assert judged.recovery_deadline(10, 21) == 321  # the later of undo + 300 and fault + 200
    assert judged.recovery_deadline(10, 11) == max(60, 311)
    assert judged.planned_s == 20 + UNDO_ALLOWANCE_S + 300  # covers an undo as slow as the allowance
    quick = parse_drill(with_("checks", {"recover_s_max": 5}), "d.yml")
    assert quick.recovery_deadline(10, 21) == 60  # never before the load's own end


@pytest.mark.parametrize(("data", "expected"), [
    (with_("faults.0.kind", "engine_explode"), "d.yml: faults[0].kind: unknown fault kind; expected one of "
                                               "engine_stall, engine_crash"),
    (with_("faults.0.hold_s", 0), "faults[0].hold_s: expected a number > 0"),
    (with_("faults.0.hold_s", 55), "faults[0].hold_s: the fault ends at 65 s, not before the load does (60 s)"),
    (with_("faults", []), "faults: expected a non-empty list of faults (got [])"),
    (with_("faults", [{"kind": "engine_stall", "at_s": 5, "hold_s": 10},
                      {"kind": "engine_crash", "at_s": 12, "hold_s": 5}]),
     "faults[1].at_s: overlaps the fault before it (undone at 15 s): one fault at a time (got 12)"),
    (with_("load.rate_per_s", "fast"), "load.rate_per_s: expected a number (got 'fast')"),
    (with_("load.mix", "no-such-mix"), "load.mix: no such scenario; the library has production-mix"),
    (with_("load.mix", "mixes/x.yml"), "load.mix: no such file"),
    (with_("checks.route_away_s_max", True), "checks.route_away_s_max: expected a number (got True)"),
    (with_("checks.p99_max", 1), "checks.p99_max: unknown field; expected one of blast_radius_errors_max"),
    (with_("faults.0.target", "n1"), "faults[0].target: unknown field"),
    ({"name": "d", "faults": []}, "d.yml: load: missing"),
])
def test_bad_input_is_one_line_naming_the_field_and_value(data, expected):
    assert expected in error_of(data)


def test_an_unreadable_or_invalid_file_names_the_file_and_the_library(tmp_path):
    with pytest.raises(ScenarioError, match=r"missing\.yml: cannot read the drill file: .* \(the library: "
                                            r"consul-agent-down, edge-restart, engine-crash"):
        load_drill(str(tmp_path / "missing.yml"))
    bad = tmp_path / "bad.yml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"bad\.yml: not valid YAML at line 2"):
        load_drill(str(bad))


def test_a_mix_file_is_read_relative_to_the_drill_file(tmp_path):
    (tmp_path / "mix.yml").write_text("name: own\nclasses:\n  A: {share: 1, prompt_tokens: 10, output_tokens: 5,"
                                      " slo: {ttft_p99_ms: 100}}\n")
    drill = tmp_path / "d.yml"
    drill.write_text("name: d\nload: {mix: mix.yml, rate_per_s: 1, duration_s: 30}\n"
                     "faults: [{kind: graceful_stop, at_s: 5, hold_s: 5}]\n")
    assert load_drill(str(drill)).mix.name == "own"


def test_recovery_is_the_undo_by_default_or_the_remediation_ladder_for_faults_it_repairs():
    assert parse_drill(VALID).recovery == "undo"
    assert parse_drill(with_("recovery", "remediate")).recovery == "remediate"
    assert error_of(with_("recovery", "reboot")) == "d.yml: recovery: expected one of undo, remediate (got 'reboot')"
    stall = with_("recovery", "remediate")
    stall["faults"][0]["kind"] = "engine_stall"
    assert error_of(stall) == ("d.yml: recovery: the ladder repairs only engine_crash, graceful_stop faults; this "
                               "drill has engine_stall (got 'remediate')")


def test_an_edge_restart_targets_the_edges_host_and_is_not_mixed_with_unit_faults():
    drill = load_drill("edge-restart")
    assert drill.scope == "edge" and drill.checks["failed_in_flight_max"] == 0
    data = yaml.safe_load(resolve("edge-restart").read_text())
    data["faults"].append({"kind": "engine_crash", "at_s": 75, "hold_s": 5})
    with pytest.raises(ScenarioError, match=r"faults\[1\]\.kind: an edge's restart and a fault of units or nodes "
                                            r"have different targets: one drill each \(got 'engine_crash'\)"):
        parse_drill(data, "mixed.yml")
