"""The score body (eas_wire/scorebody.py): the terms readers act on (ScoreTerms) typed and range-checked when a
body is read, the wire format unchanged by them, and never NaN or Infinity on the wire."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from eas_wire.scorebody import DECLARED_TERMS, NO_TERMS, IUScore, ScoreBody, ScoreTerms
from edge.pool import AnomalyDetector, IUEntry, PoolView
from edge.pool.pick import prefill_tps
from edge.pool.view import DEFAULT_REQUEST_COST_S

pytestmark = pytest.mark.unit

NOW = 1_764_780_000.0


def body(components: dict, score: float | None = 0.4) -> dict:
    return {"node": "n1", "rack": "r1", "profile": "drain", "seq": 1, "ts": NOW, "clock_offset_s": None,
            "heartbeat_s": 2.0, "ius": {"n1-iu0": {"score": score, "level": 0, "status": "passing",
                                                   "reason": "", "components": components}}}


def read(components: dict) -> tuple[IUScore, Counter]:
    counts = Counter()
    parsed, problems = ScoreBody.from_json(body(components), counts=counts)
    assert problems == []
    return parsed.ius["n1-iu0"], counts


def test_declared_terms_are_read_typed_and_ints_stay_ints():
    entry, counts = read({"request_cost_s": 0.08, "prefill_tps": 9000, "running": 3, "waiting": 0,
                          "kv_usage": 0.41, "queue_s": 0.2})
    assert entry.terms == ScoreTerms(request_cost_s=0.08, prefill_tps=9000, running=3, waiting=0, kv_usage=0.41)
    assert isinstance(entry.terms.running, int) and entry.terms.announced_s is None
    assert entry.components["queue_s"] == 0.2 and counts == Counter()  # undeclared: kept as they are


@pytest.mark.parametrize(("name", "value"), [
    ("request_cost_s", -1.0), ("request_cost_s", 0), ("prefill_tps", -5), ("prefill_tps", 0.0),
    ("announced_s", -0.5), ("tokens_total", -1), ("running", -3), ("waiting", -1), ("kv_usage", 1.5),
    ("admitted_prefill_tokens", -10), ("xid_events", -1), ("xid_last", -1), ("xid_last", 2**32),
    ("xid_last_at", 0), ("xid_last_at", -1.0),
])
def test_a_declared_term_out_of_range_is_dropped_and_counted_the_entry_kept(name, value):
    entry, counts = read({name: value, "queue_s": 0.3})
    assert getattr(entry.terms, name) is None and name not in entry.components
    assert entry.components == {"queue_s": 0.3} and entry.score == 0.4
    assert counts == Counter(component_invalid=1)


@pytest.mark.parametrize(("name", "value"), [
    ("request_cost_s", 1e-9), ("announced_s", 0), ("kv_usage", 0), ("kv_usage", 1), ("running", 0),
    ("prefix_hit_rate", -1), ("prefix_hit_rate", 1), ("xid_events", 0), ("xid_last", 2**32 - 1),
    ("xid_last_at", 1_700_000_000.25),
])
def test_the_range_edges_are_kept(name, value):
    entry, counts = read({name: value})
    assert getattr(entry.terms, name) == value and counts == Counter()


def test_every_declared_term_has_a_range_and_a_field():
    assert list(DECLARED_TERMS) == list(ScoreTerms._fields) == [
        "request_cost_s", "prefill_tps", "announced_s", "tokens_total", "running", "waiting", "kv_usage",
        "admitted_prefill_tokens", "prefix_hit_rate", "xid_events", "xid_last", "xid_last_at"]
    assert ScoreTerms.of({}) == (NO_TERMS, [])


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 10**400, True, "1", [1]])
def test_what_no_float_holds_or_is_no_number_is_out_of_every_range(value):
    assert ScoreTerms.of({"running": value}) == (NO_TERMS, ["running"])


def test_the_terms_never_reach_the_wire():
    raw = body({"request_cost_s": 0.08, "prefill_tps": 9000.0, "queue_s": 0.2})
    parsed, _ = ScoreBody.from_json(raw)
    assert json.loads(parsed.dumps()) == raw  # the same JSON as before there were terms
    built = IUScore(score=0.1, status="passing", components={"waiting": 2})
    assert "terms" not in built.to_json() and built.terms.waiting == 2


def pool_entry(components: dict) -> IUEntry:
    view = PoolView(detector=AnomalyDetector(), clock=lambda: NOW)
    view.apply_polled([body(components)])
    (entry,) = view.snapshot().entries
    return entry


def test_a_negative_request_cost_never_makes_an_iu_cheaper_to_a_reader():
    # an agent (or any node's agent: they share a token) writing request_cost_s -1 made every request the
    # edge sent there since the score subtract a second from that IU's cost, drawing ever more traffic
    assert pool_entry({"request_cost_s": -1.0}).request_cost_s == DEFAULT_REQUEST_COST_S
    assert pool_entry({"request_cost_s": 0.25}).request_cost_s == 0.25
    assert pool_entry({}).request_cost_s == DEFAULT_REQUEST_COST_S


def test_pick_reads_the_prefill_rate_from_the_checked_terms():
    assert prefill_tps(pool_entry({"prefill_tps": 8000.0})) == 8000.0
    assert prefill_tps(pool_entry({"prefill_tps": -8000.0})) is None


def test_an_entry_built_without_terms_reads_them_from_its_components():
    entry = IUEntry("n1-iu0", "n1", "r1", 0.1, "passing", "", NOW, 2.0, "passing",
                    components={"announced_s": 0.2, "request_cost_s": -4.0})
    assert entry.terms.announced_s == 0.2 and entry.request_cost_s == DEFAULT_REQUEST_COST_S


def test_strict_json_refuses_non_finite_numbers():
    """The backstop under the publisher's sanitising: scorebody.dumps (the KV body and /scores) raises
    instead of writing NaN/Infinity, which is invalid JSON for every non-Python reader."""
    from eas_wire import scorebody

    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValueError):
            scorebody.dumps({"score": bad})
    assert scorebody.dumps({"score": 0.5}) == '{"score":0.5}'
