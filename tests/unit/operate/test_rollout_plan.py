"""Rollout files: the shipped ones parse; every malformed one is one RolloutPlanError line naming the file,
the field and the value (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from common.errors import ExitCode
from operate.rollout_plan import RolloutPlanError, load_plan, parse_plan

pytestmark = pytest.mark.unit
ROLLOUTS = Path(__file__).resolve().parents[3] / "operate" / "rollouts"


def plan(**changes) -> dict:
    data = {"name": "r", "stable": "old", "canary": "new", "edges": ["edge1.cluster.example:9180"],
            "steps": [{"weight": 5, "hold": "48h"}, {"weight": 100, "hold": "0s"}],
            "gates": [{"metric": "ttft_p99_ratio", "max": 1.5}]}
    data.update(changes)
    return data


def test_the_shipped_rollouts_parse():
    phased = load_plan(ROLLOUTS / "phased-5-20-50-100.yml")
    assert [s.weight for s in phased.steps] == [0.05, 0.2, 0.5, 1.0]
    assert {s.hold_s for s in phased.steps} == {48 * 3600.0}
    short = load_plan(ROLLOUTS / "ci-short.yml")
    assert sum(s.hold_s for s in short.steps) <= 20 and short.interval_s <= 1


@pytest.mark.parametrize(("changes", "message"), [
    ({"steps": [{"weight": 20, "hold": "1h"}, {"weight": 5, "hold": "1h"}, {"weight": 100, "hold": "1h"}]},
     "f.yml: steps[1].weight: weights must rise step by step (the step before is 20) (got 5)"),
    ({"steps": [{"weight": 5, "hold": "1h"}, {"weight": 50, "hold": "1h"}]},
     "f.yml: steps[1].weight: the last step must be 100 (the canary takes all) (got 50.0)"),
    ({"steps": [{"weight": 100, "hold": "two days"}]},
     "f.yml: steps[0].hold: expected a duration like 30s, 5m, 48h or 2d (got 'two days')"),
    ({"gates": [{"metric": "p99_latency", "max": 1}]},
     "f.yml: gates[0].metric: unknown metric; expected one of ttft_p99_ratio, ttft_p99_s, error_rate, "
     "error_rate_delta, ttft_jitter_delta, health_check_success, gpu_util_variance, ecc_events, xid_events "
     "(got 'p99_latency')"),
    ({"gates": [{"metric": "xid_events", "min": 0}]},
     "f.yml: gates[0]: xid_events takes a max (and nothing else) (got {'min': 0})"),
    ({"gates": [{"metric": "health_check_success", "max": 1}]},
     "f.yml: gates[0]: health_check_success takes a min (and nothing else) (got {'max': 1})"),
    ({"canary": "old"}, "f.yml: canary: the same revision as stable (got 'old')"),
    ({"edges": []}, "f.yml: edges: gates on the edges' metrics need the edges' admin HOST:PORT listed (got [])"),
    ({"inconclusive": "retry"}, "f.yml: inconclusive: expected one of pause, continue, abort (got 'retry')"),
    ({"colour": "red"}, "f.yml: colour: unknown field; expected one of canary, description, edges, failure_limit, "
                        "gates, inconclusive, interval, min_requests, name, stable, steps"),
])
def test_bad_input_is_one_line_naming_the_field_and_value(changes, message):
    with pytest.raises(RolloutPlanError) as caught:
        parse_plan(plan(**changes), "f.yml")
    assert str(caught.value) == message
    assert caught.value.exit_code == ExitCode.USAGE


def test_a_file_that_is_not_yaml_names_its_line(tmp_path):
    path = tmp_path / "r.yml"
    path.write_text(yaml.safe_dump(plan()) + "steps: [\n")
    with pytest.raises(RolloutPlanError, match=r"r.yml: not valid YAML at line \d+"):
        load_plan(path)
