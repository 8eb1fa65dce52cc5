"""The pool view (edge/pool/view.py): it validates what it reads under the score prefix, so one bad body never
kills the watch and a spoofed body cannot steer traffic; a rebuild builds entries only for nodes whose body (or
Consul's health, or the reading edge's id) changed, and the anomaly detector's memo of a frozen verdict follows
each IU's readings."""

from __future__ import annotations

import copy
import json
import math
import random
from collections import Counter

import pytest

from eas_wire.scorebody import MAX_HEARTBEAT_S, BodyError, ScoreBody
from edge.feed import EdgeView
from edge.pool import AnomalyDetector, EdgeLedger, PoolView, pick
from edge.pool.view import TS_TOLERANCE_S
from tests.unit.edge.pool.test_pick import Clock, health_entry, kv_entry

pytestmark = pytest.mark.unit


def raw_entry(node, body, key_node=None):
    return {"Key": f"clusterctl/eas/dc1/{key_node or node}", "Value": json.dumps(body).encode()}


def good_body(node="n2", ts=100.0, score=1.0, iu=None):
    return json.loads(kv_entry(node, {iu or f"{node}-iu0": (score, "passing", 1.0, 1)}, ts)["Value"])


BAD_BODIES = [
    {"node": "n2", "ts": 100.0, "ius": {"n2-iu0": 5}},
    {"node": "n2", "ts": "soon", "ius": {}},
    {"node": "n2", "ts": 100.0, "clock_offset_s": "x", "ius": {}},
    {"node": "n2", "ts": 100.0, "ius": {"n2-iu0": {"score": "0.1", "status": "passing"}}},
    {"node": "n2", "ts": 100.0, "ius": {"n2-iu0": {"score": -1e9, "status": "passing"}}},
    {"node": "n2", "ts": 100.0, "ius": {"n2-iu0": {"score": 1.0, "status": "sunny"}}},
    {"node": "n2", "ts": 100.0, "ius": {"n2-iu0": {"score": 1.0, "status": "passing", "components": []}}},
    {"node": "n2", "ts": 100.0, "heartbeat_s": "2", "ius": {}},
    {"node": "n2", "ts": 100.0, "ius": []},
    {"node": ["n2"], "ts": 100.0, "ius": {}},
    [1, 2],
    "a string",
    None,
]


def fresh_view(ius=("n1-iu0", "n2-iu0")):
    view = PoolView(detector=AnomalyDetector(), clock=Clock(100.0))
    view.apply_health([health_entry(iu) for iu in ius])
    return view


@pytest.mark.parametrize("bad", BAD_BODIES, ids=range(len(BAD_BODIES)))
def test_bad_body_next_to_a_good_one_is_skipped_and_counted(bad):
    view = fresh_view()
    good = kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 100.0)
    view.apply_kv([good, raw_entry("n2", bad)])  # guards against: AttributeError/ValueError/TypeError out of here
    snap = view.snapshot()
    assert [e.iu_id for e in snap.scored] == ["n1-iu0"]
    assert view.rejected_bodies + view.rejected_ius >= 1 and view.problems
    view.apply_health([health_entry("n1-iu0"), health_entry("n2-iu0")])  # and later rebuilds still work
    assert [e.iu_id for e in view.snapshot().scored] == ["n1-iu0"]


def test_undecodable_and_huge_values_are_skipped():
    view = fresh_view()
    view.apply_kv(
        [
            {"Key": "clusterctl/eas/dc1/n2", "Value": b"\xff\xfe{"},
            {"Key": "clusterctl/eas/dc1/n3", "Value": b"[" * (2 << 20)},
            {"Key": "clusterctl/eas/dc1/n4", "Value": b"[" * 100_000},  # under the cap, too deep for json
            "not a dict",
            kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 100.0),
        ]
    )
    assert [e.iu_id for e in view.snapshot().scored] == ["n1-iu0"] and view.rejected_bodies == 4


def test_body_must_name_the_node_of_its_key():
    view = fresh_view()
    view.apply_kv([raw_entry("n1", good_body("n1", score=0.0, iu="n1-iu0"), key_node="n2")])
    assert view.snapshot().scored == () and "names node 'n1'" in view.problems[-1]


def test_ius_must_belong_to_the_bodys_node_in_the_catalog():
    """n2 writes its own key but claims n1's IU with a winning score: dropped, n1's own entry kept."""
    view = fresh_view()
    view.apply_kv(
        [
            kv_entry("n1", {"n1-iu0": (5.0, "passing", 1.0, 1)}, 100.0),
            kv_entry("n2", {"n2-iu0": (5.0, "passing", 1.0, 1), "n1-iu0": (0.0, "passing", 1.0, 1)}, 100.0),
        ]
    )
    by_id = view.snapshot().by_id()
    assert by_id["n1-iu0"].node == "n1" and by_id["n1-iu0"].score == 5.0
    assert "node n2: IU n1-iu0 is not named as one of its IUs" in view.problems[-1]


def test_far_future_timestamp_is_clamped_and_goes_stale():
    """A body with ts = now + 1e9 and score -1e9 would win 1000/1000 picks an hour later. Score -1e9 is now rejected
    by the schema; with a legal score 0 the ts is clamped, so the body goes stale like an honest one."""
    clock = Clock(100.0)
    view = PoolView(detector=AnomalyDetector(), clock=clock)
    view.apply_health([health_entry("n1-iu0"), health_entry("n2-iu0")])
    spoof = good_body("n2", ts=100.0 + 1e9, score=0.0)
    view.apply_kv([kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 100.0), raw_entry("n2", spoof)])
    entry = view.snapshot().by_id()["n2-iu0"]
    assert entry.ts <= 100.0 + TS_TOLERANCE_S
    # an hour later, with the same bodies re-listed (any other key's write re-lists the prefix)
    clock.t = 3700.0
    view.apply_kv([kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 3700.0), raw_entry("n2", spoof)])
    rng, ledger = random.Random(1), EdgeLedger()
    counts = Counter(pick(view.snapshot(), ledger, 3700.5, rng).iu_id for _ in range(1000))
    assert counts["n2-iu0"] == 0 and counts["n1-iu0"] == 1000


def test_heartbeat_is_bounded():
    body, problems = ScoreBody.from_json({**good_body(), "heartbeat_s": 1e9})
    assert body.heartbeat_s == MAX_HEARTBEAT_S and not problems
    with pytest.raises(BodyError, match="clock_offset_s"):
        ScoreBody.from_json({**good_body(), "clock_offset_s": -1e9})


def test_schema_round_trips_what_the_publisher_writes():
    body, problems = ScoreBody.from_json(good_body())
    assert not problems and ScoreBody.from_json(json.loads(body.dumps()))[0] == body










# JSON reads "1" followed by 400 zeros as a Python int that no float can hold: math.isfinite(), float() and
# comparisons with floats raise OverflowError on it. A compromised node can write it under its own key.
HUGE = 10**400
HUGE_PLACES = {
    "ts": lambda body: body.update(ts=HUGE),
    "heartbeat_s": lambda body: body.update(heartbeat_s=HUGE),
    "clock_offset_s": lambda body: body.update(clock_offset_s=HUGE),
    "score": lambda body: body["ius"]["n2-iu0"].update(score=HUGE),
    "component": lambda body: body["ius"]["n2-iu0"]["components"].update(request_cost_s=HUGE),
    "negative score": lambda body: body["ius"]["n2-iu0"].update(score=-HUGE),
}


def huge_body(place: str) -> dict:
    body = good_body("n2", ts=100.0)
    HUGE_PLACES[place](body)
    return body


@pytest.mark.parametrize(("place", "reason"), [("ts", "ts_invalid"), ("heartbeat_s", "heartbeat_invalid"),
                                             ("clock_offset_s", "clock_offset_invalid")])
def test_a_number_no_float_holds_rejects_the_body(place, reason):
    with pytest.raises(BodyError, match=place) as info:  # guards against: OverflowError out of from_json
        ScoreBody.from_json(json.loads(json.dumps(huge_body(place))))
    assert info.value.reason == reason


@pytest.mark.parametrize("place", ["score", "negative score"])
def test_a_score_no_float_holds_is_not_finite(place):
    counts: Counter = Counter()
    body, problems = ScoreBody.from_json(json.loads(json.dumps(huge_body(place))), counts=counts)
    assert "n2-iu0" not in body.ius and counts == Counter(score_not_finite=1) and "n2-iu0" in problems[0]
    body, problems = ScoreBody.from_json(json.loads(json.dumps(huge_body(place))), blank_bad_scores=True)
    assert body.ius["n2-iu0"].score is None and "score_not_finite" in body.ius["n2-iu0"].reason and not problems


def test_a_component_no_float_holds_is_dropped():
    body, problems = ScoreBody.from_json(json.loads(json.dumps(huge_body("component"))))
    assert not problems and "request_cost_s" not in body.ius["n2-iu0"].components
    assert body.ius["n2-iu0"].score == 1.0


@pytest.mark.parametrize("place", sorted(HUGE_PLACES))
def test_a_good_body_next_to_a_huge_number_still_updates(place):
    view = fresh_view()
    view.apply_kv([kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 100.0)])
    # guards against: OverflowError out of apply_kv, the view kept n1's old score for as long as n2's body stayed
    view.apply_kv([kv_entry("n1", {"n1-iu0": (2.0, "passing", 1.0, 1)}, 100.0), raw_entry("n2", huge_body(place))])
    by_id = view.snapshot().by_id()
    assert by_id["n1-iu0"].score == 2.0
    n2 = by_id.get("n2-iu0")
    if place == "component":  # the one number is dropped, the rest of the body is fine
        assert n2.score == 1.0 and "request_cost_s" not in n2.components
    else:
        assert n2 is None or n2.score is None  # the body (or its IU) rejected: registered, never scored
        assert view.rejected_bodies + view.rejected_ius == 1 and view.problems


def test_one_body_the_reader_cannot_check_never_stops_the_others(monkeypatch):
    """Whatever checking one body raises (a bug in the schema included), that body is skipped and counted."""
    real = ScoreBody.from_json.__func__

    def from_json(cls, obj, **kwargs):
        if isinstance(obj, dict) and obj.get("node") == "n2":
            raise ArithmeticError("a bug in the reader")
        return real(cls, obj, **kwargs)

    monkeypatch.setattr(ScoreBody, "from_json", classmethod(from_json))
    view = fresh_view()
    view.apply_kv([raw_entry("n2", good_body("n2")), kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 100.0)])
    assert [e.iu_id for e in view.snapshot().scored] == ["n1-iu0"]  # guards against: ArithmeticError out of apply_kv
    assert view.rejected_bodies == 1 and view.ignored["reader_error"] == 1 and "a bug in the reader" in view.problems[-1]
    view.apply_polled([good_body("n2"), good_body("n1", ts=101.0, iu="n1-iu0", score=3.0)])
    assert view.snapshot().by_id()["n1-iu0"].score == 3.0 and view.rejected_bodies == 2






def test_a_kv_value_that_is_no_string_is_skipped():
    view = fresh_view()
    view.apply_kv([{"Key": "clusterctl/eas/dc1/n2", "Value": 5}, kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 100.0)])
    assert [e.iu_id for e in view.snapshot().scored] == ["n1-iu0"]  # guards against: TypeError (len of an int) out of apply_kv
    assert view.rejected_bodies == 1 and view.ignored["reader_error"] == 1


def registration(node, iu, address="127.0.0.1", meta_node=None, tags=None, catalog_node=..., service=None):
    """One health listing entry: ``iu`` registered on catalog node ``node`` as an instance of ``service`` (by
    default that node's own ``vllm-iu-<node>``); ``catalog_node`` overrides the listing's Node, None leaves it
    out."""
    entry = health_entry(iu)
    entry["Service"].update(Service=service or f"vllm-iu-{node}", Address=address,
                            Meta={"node": meta_node or node, "rack": "r"}, Tags=tags or [])
    if catalog_node is None:
        del entry["Node"]
    else:
        entry["Node"] = {"Node": node if catalog_node is ... else catalog_node}
    return entry


def test_ownership_is_the_catalog_node_and_an_impostor_registration_is_never_routable():
    """n2's token registers n1's IU id on its own catalog node, pointing at an attacker address: the edge keeps
    routing n1-iu0 to n1's own registration, follows n1's agent there, and counts the impostor."""
    view = EdgeView(detector=AnomalyDetector(), clock=Clock(100.0))
    view.apply_health([registration("n1", "n1-iu0"), registration("n2", "n2-iu0", "127.0.0.2"),
                       registration("n2", "n1-iu0", "127.0.66.66", meta_node="n1", tags=["node:n1"])])
    view.apply_kv([kv_entry("n1", {"n1-iu0": (1.0, "passing", 1.0, 1)}, 100.0),
                   kv_entry("n2", {"n2-iu0": (1.0, "passing", 1.0, 1)}, 100.0)])
    entries = view.snapshot().entries
    assert [(e.node, e.iu_id, e.address) for e in entries] == [("n1", "n1-iu0", "127.0.0.1"),
                                                               ("n2", "n2-iu0", "127.0.0.2")]
    assert view.node_addresses() == {"n1": "127.0.0.1", "n2": "127.0.0.2"}
    assert view.rejected_registrations == Counter(id_not_of_node=1)


@pytest.mark.parametrize("impostor, reason", [
    (registration("n2", "n2-iu1", meta_node="n1"), "meta_node_mismatch"),
    (registration("n2", "n2-iu1", tags=["rack:r", "node:n1"]), "node_tag_mismatch"),
    (registration("n2", "n2-iu1", catalog_node=None), "no_catalog_node"),
    (registration("n2", "iu7"), "id_not_of_node"),
    (registration("n2", "n2-iu1", service="vllm-iu-n1"), "service_not_of_node"),
    (registration("n2", "n2-iu1", service="vllm-iu"), "service_not_of_node"),
])
def test_a_registration_whose_claims_disagree_with_the_catalog_is_dropped_and_counted(impostor, reason):
    view = EdgeView(detector=AnomalyDetector(), clock=Clock(100.0))
    view.apply_health([registration("n1", "n1-iu0"), impostor])
    assert [e.iu_id for e in view.snapshot().healthy] == ["n1-iu0"]
    assert view.rejected_registrations == Counter({reason: 1}) and reason in view.problems[-1]


def test_one_id_registered_on_two_nodes_is_routable_on_neither():
    """The ID rule makes two accepted copies impossible for names of the form <node>-iu<k>; the reader still
    refuses to choose between two catalog nodes if a listing ever holds them (a node renamed in between)."""
    view = EdgeView(detector=AnomalyDetector(), clock=Clock(100.0))
    view.apply_health([registration("n1", "n1-iu0"), registration("n2", "n2-iu0")])
    import edge.pool.view as view_module

    real = view_module.registration_problem
    try:
        view_module.registration_problem = lambda node, service: None  # both copies pass the per-entry checks
        view.apply_health([registration("n1", "n1-iu0"), registration("n2", "n1-iu0", "127.0.66.66")])
    finally:
        view_module.registration_problem = real
    assert view.snapshot().entries == () and view.rejected_registrations == Counter(id_on_two_nodes=2)


def body(node: str, ius: dict, ts: float, announced: dict | None = None) -> dict:
    raw = json.loads(kv_entry(node, ius, ts)["Value"])
    if announced is not None:
        raw["announced"] = announced
    return raw


def state(node: str, score: float, tokens: float = 1.0) -> dict:
    return {f"{node}-iu{i}": (score + 0.01 * i, "passing", tokens, 1) for i in range(3)}


def test_a_rebuild_keeps_the_entries_of_nodes_whose_body_did_not_change():
    clock = Clock(100.0)
    view = PoolView(clock=clock)
    view.apply_health([health_entry(f"{node}-iu{i}") for node in ("n1", "n2") for i in range(3)])
    view.apply_polled([body("n1", state("n1", 1.0), 100.0), body("n2", state("n2", 1.0), 100.0)])
    before = view.snapshot().by_id()

    clock.t = 100.2
    view.apply_polled([body("n2", state("n2", 1.2), 100.2)])
    after = view.snapshot().by_id()
    assert all(after[f"n1-iu{i}"] is before[f"n1-iu{i}"] for i in range(3))  # guards against: built anew every time
    assert after["n2-iu0"].score == 1.2 and after["n2-iu0"] is not before["n2-iu0"]

    view.apply_health([health_entry("n1-iu0", "critical")] +
                      [health_entry(f"{node}-iu{i}") for node in ("n1", "n2") for i in range(3) if (node, i) != ("n1", 0)])
    assert view.snapshot().by_id()["n1-iu0"].health == "critical"  # health changed: every node's entries anew

    view.apply_polled([body("n1", state("n1", 1.0), 100.4, announced={"edge-a.0001": 7})])
    assert view.snapshot().by_id()["n1-iu1"].acked == 0
    view.edge_id = "edge-a.0001"
    view.apply_polled([])  # the same bodies, read by an edge with an id now: entries carry its acknowledgement
    assert view.snapshot().by_id()["n1-iu1"].acked == 7


def test_a_frozen_iu_stays_flagged_over_rebuilds_for_other_nodes_and_clears_when_its_counters_move():
    clock = Clock(100.0)
    view = PoolView(detector=AnomalyDetector(frozen_s=4.0), clock=clock)
    view.apply_health([health_entry(f"{node}-iu{i}") for node in ("n1", "n2") for i in range(3)])
    for step in range(4):  # n1's counters stand still for 6 s while it reports running requests
        clock.t = 100.0 + 2 * step
        view.apply_polled([body("n1", state("n1", 1.0, tokens=5.0), clock.t),
                           body("n2", state("n2", 1.0, tokens=100.0 * step), clock.t)])
    assert view.snapshot().by_id()["n1-iu0"].anomaly == "frozen"
    for k in range(5):  # only n2 changes: n1's entries (and their memoized verdict) are kept
        clock.t += 0.2
        view.apply_polled([body("n2", state("n2", 1.0, tokens=1000.0 + k), clock.t)])
        assert view.snapshot().by_id()["n1-iu0"].anomaly == "frozen"
    clock.t += 0.2
    view.apply_polled([body("n1", state("n1", 1.0, tokens=6.0), clock.t)])  # its counters moved
    assert view.snapshot().by_id()["n1-iu0"].anomaly is None


def hostile_body(rng: random.Random):
    base = {"node": "n2", "rack": "r1", "ts": 100.0, "heartbeat_s": 2.0, "seq": 3, "clock_offset_s": None,
            "ius": {"n2-iu0": {"score": 1.0, "status": "passing", "reason": "", "components": {"request_cost_s": 0.1}}}}
    # 10**400 and -10**400: ints JSON reads but no float holds (math.isfinite raises OverflowError on them)
    junk_values = [None, "x", -1, 1e308, float("nan"), [], {}, True, 10**30, 10**400, -(10**400), "0.1", {"a": 1},
                   {"vllm": {"ok": True, "duration_s": 10**400, "error": None}}]

    class Junk:  # a fresh value each time (one shared {} could end up inside itself)
        @staticmethod
        def pick():
            return copy.deepcopy(rng.choice(junk_values))

    body = json.loads(json.dumps(base))
    for _ in range(rng.randint(1, 3)):
        where = rng.choice(["top", "iu", "comp", "whole", "raw", "deep"])
        if not isinstance(body, dict):
            break
        if where == "top":
            body[rng.choice(list(base) + ["extra"])] = Junk.pick()
        elif where == "iu" and isinstance(body.get("ius"), dict) and body["ius"]:
            entry = body["ius"].setdefault("n2-iu0", {})
            if isinstance(entry, dict):
                entry[rng.choice(["score", "status", "reason", "components", "level", "collectors"])] = Junk.pick()
            else:
                body["ius"]["n2-iu0"] = Junk.pick()
        elif where == "comp":
            body["ius"] = {"n2-iu0": {"score": 0.5, "status": "passing", "components": Junk.pick()}}
        elif where == "whole":
            body = Junk.pick()
        elif where == "deep":  # nested past the decoder's recursion limit (RecursionError), here or in a value
            depth = rng.choice([100_000, 5_000])
            nested = "[" * depth + "]" * depth
            text = json.dumps(body, allow_nan=True)
            return (nested if rng.random() < 0.5 else text.replace('"ius"', f'"x": {nested}, "ius"', 1)).encode()
        else:
            return "".join(chr(rng.randrange(1, 0x7F)) for _ in range(rng.randrange(0, 80))).encode()
    text = json.dumps(body, allow_nan=True)
    return text.encode() if rng.random() < 0.9 else text.encode()[: rng.randrange(len(text) + 1)]


@pytest.mark.parametrize("reader", [PoolView, EdgeView])
def test_malformed_score_bodies_never_break_the_reader(tally, reader):
    rng = random.Random(1502)
    view = reader(detector=AnomalyDetector(), clock=lambda: 100.0)
    health = [{"Node": {"Node": iu.split("-")[0]}, "Service": {"Service": f"vllm-iu-{iu.split('-')[0]}", "ID": iu, "Address": "127.0.0.1", "Port": 8000, "Meta": {"node": iu.split("-")[0]}},
               "Checks": [{"CheckID": f"vllm-iu:{iu}:health", "Status": "passing"}]} for iu in ("n1-iu0", "n2-iu0")]
    view.apply_health(health)
    good = {"Key": "clusterctl/eas/dc1/n1", "Value": json.dumps(
        {"node": "n1", "rack": "r1", "ts": 100.0, "heartbeat_s": 2.0, "seq": 1,
         "ius": {"n1-iu0": {"score": 1.0, "status": "passing", "components": {}}}}).encode()}
    n = 3000
    for _ in range(n):
        hostile = hostile_body(rng)
        view.apply_kv([good, {"Key": "clusterctl/eas/dc1/n2", "Value": hostile}])
        scored = {e.iu_id for e in view.snapshot().scored}
        assert "n1-iu0" in scored
        for e in view.snapshot().entries:
            assert e.score is None or (math.isfinite(e.score) and e.score >= 0)
            assert e.stale_after <= 100.0 + 2.0 + 3 * 60.0
    tally.inputs(f"score bodies under the KV prefix ({reader.__name__})", n)


def test_pushed_placements_are_queued_once_each_for_the_router():
    view = fresh_view()
    window = [{"seq": s, "iu": "n2-iu0", "blocks": [[8, s]]} for s in (1, 2)]
    view.apply_polled([good_body() | {"placed": window}])
    view.apply_polled([good_body(ts=100.2) | {"placed": [*window, {"seq": 3, "iu": "n2-iu0", "blocks": [[8, 3]]}]}])
    view.apply_kv([raw_entry("n1", good_body("n1") | {"placed": [{"seq": 9, "iu": "n1-iu0", "blocks": [[8, 9]]}]})])
    # the KV's body never relays (only the agent's stream does); each pushed placement is taken once
    assert view.relayed.take() == [("n2-iu0", ((8, 1),)), ("n2-iu0", ((8, 2),)), ("n2-iu0", ((8, 3),))]
    assert view.relayed.take() == [] and view.relayed.last_seq == {"n2": 3}
