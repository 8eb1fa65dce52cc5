"""The rollout document's strict parser and the per-request share."""

from __future__ import annotations

import json
import random

import pytest

from eas_wire.rollout import CanaryCounter, RolloutError, loads, parse

pytestmark = pytest.mark.unit


def document(**changes) -> dict:
    doc = {"version": 1, "name": "r", "stable": "vllm-0.6+m", "canary": "vllm-0.7+m", "weight": 0.05,
           "state": "progressing", "step": 0, "updated": 1767225600.0, "reason": "",
           "history": [{"ts": 1767225600.0, "event": "start", "weight": 0.05, "reason": "", "evidence": {}}]}
    doc.update(changes)
    return doc


def test_a_document_round_trips():
    doc = parse(document())
    assert (doc.stable, doc.canary, doc.weight, doc.state, doc.effective_weight) == ("vllm-0.6+m", "vllm-0.7+m", 0.05,
                                                                                     "progressing", 0.05)
    assert loads(doc.dumps()) == doc
    planned = parse(document(steps=[[0.05, 172800], [1, 0]]))
    assert planned.steps == ((0.05, 172800.0), (1.0, 0.0)) and loads(planned.dumps()) == planned


@pytest.mark.parametrize(("changes", "field", "value"), [
    ({"weight": 1.5}, "weight", "1.5"),
    ({"weight": "0.5"}, "weight", "'0.5'"),
    ({"weight": float("nan")}, "weight", "nan"),
    ({"state": "rolling"}, "state", "'rolling'"),
    ({"canary": "vllm-0.6+m"}, "canary", "'vllm-0.6+m'"),
    ({"stable": "has space"}, "stable", "'has space'"),
    ({"version": 2}, "version", "2"),
    ({"state": "aborted", "weight": 0.2}, "weight", "0.2"),
    ({"state": "promoted", "weight": 0.5}, "weight", "0.5"),
    ({"step": -1}, "step", "-1"),
    ({"history": [{"ts": 1.0, "event": "x", "weight": 2}]}, "history[0].weight", "2"),
    ({"history": "none"}, "history", "'none'"),
    ({"steps": [[0.05, 3600], [1.5, 0]]}, "steps[1].weight", "1.5"),
    ({"steps": [[0.05]]}, "steps[0]", "[0.05]"),
])
def test_a_bad_field_is_one_error_naming_it_and_its_value(changes, field, value):
    with pytest.raises(RolloutError) as caught:
        parse(document(**changes))
    assert caught.value.field == field
    assert str(caught.value).startswith(f"rollout document: {field} = {value}")


def test_text_that_is_no_json_or_no_object_is_refused():
    with pytest.raises(RolloutError, match="not JSON"):
        loads("{")
    with pytest.raises(RolloutError, match="not a JSON object"):
        loads(json.dumps([1]))


def test_aborted_sends_nothing_to_the_canary_and_promoted_everything():
    assert parse(document(state="aborted", weight=0)).effective_weight == 0
    assert parse(document(state="promoted", weight=1)).effective_weight == 1


@pytest.mark.parametrize("weight", [0.05, 0.2, 0.5, 0.01, 1 / 3, 0.999])
def test_the_counter_gives_the_weight_within_one_request_at_every_moment(weight):
    counter, canary = CanaryCounter(), 0
    for n in range(1, 20001):
        canary += counter.take(weight)
        assert abs(canary - n * weight) < 1.0 + 1e-9, n


def test_the_counter_is_tighter_than_random_draws():
    """At 5% over 2,000 requests the counter is off by < 1 request; random draws stray by ~10 (one sigma)."""
    counter, rng = CanaryCounter(), random.Random(1)
    counted = sum(counter.take(0.05) for _ in range(2000))
    drawn = [sum(rng.random() < 0.05 for _ in range(2000)) for _ in range(50)]
    assert abs(counted - 100) <= 1
    assert sum(abs(d - 100) > 1 for d in drawn) > 40


def test_a_weight_change_brings_no_burst():
    counter = CanaryCounter()
    for _ in range(999):
        counter.take(0.05)
    after = [counter.take(0.5) for _ in range(10)]
    assert 4 <= sum(after) <= 6
    assert [counter.take(0.0) for _ in range(5)] == [False] * 5
    assert [counter.take(1.0) for _ in range(5)] == [True] * 5
