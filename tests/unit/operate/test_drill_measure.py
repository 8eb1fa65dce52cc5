"""A drill's measures from recorded outcomes and Consul samples: routing away, Consul critical, failures split
by whether the client was streaming and from which unit, TTFT against the baseline, recovery."""

from __future__ import annotations

import pytest

from operate.drill_measure import ConsulSample, FaultWindow, judge, measure, timeline
from operate.loadgen import Outcome

pytestmark = pytest.mark.unit


def sent(at: float, iu: str | None, ttft: float | None = 0.1, error: str | None = None, streamed: bool = False,
         lag: float = 0.0) -> Outcome:
    ok = error is None
    return Outcome(0, "A", at, lag, 100, 10, ttft_s=ttft if ok else None, e2e_s=1.0 if ok else None,
                   error=error, streamed=streamed or ok, iu=iu)


RECORDED = [
    *(sent(t / 2, "a" if t % 2 else "b") for t in range(20)),  # 0-9.5 s: the baseline, TTFT 0.1 s
    sent(9.8, "a", error="cut_stream", streamed=True),  # streaming from a when it died
    sent(11.0, "a", error="http_502", lag=0.2),  # routed to a after the fault, no token: 1.2 s after it
    sent(12.0, "b", error="timeout"),  # another unit failing: blast radius
    sent(13.0, None, error="connect"),  # the edge named no unit
    *(sent(12 + t / 2, "b", ttft=0.3) for t in range(14)),  # 12-18.5 s: b alone, slower
    sent(21.0, "b"), sent(22.5, "a"), sent(23.0, "a"),  # a back 2.5 s after the undo
]
WINDOW = FaultWindow("engine_crash", "a", 10.0, 20.0)
CONSUL = [ConsulSample(9.9, "a", "passing"), ConsulSample(10.4, "a", "passing"), ConsulSample(11.0, "a", "critical"),
          ConsulSample(11.0, "b", "critical")]


def test_one_fault_measured_from_what_was_recorded():
    (m,) = measure(RECORDED, [WINDOW], {"a"}, CONSUL)
    assert m.route_away_s == pytest.approx(1.2) and not m.still_routed
    assert m.consul_critical_s == pytest.approx(1.0)
    assert (m.failed_streaming, m.failed_not_streaming, m.blast_radius_errors) == (1, 2, 1)
    assert m.failed_in_flight == 1  # the stream sent at 9.8 s, cut by the fault at 10
    assert m.served_during_fault == 0 and m.requests_during_fault == 17
    assert (m.ttft_p99_baseline_s, m.ttft_p99_fault_s) == (0.1, 0.3) and m.ttft_p99_ratio == pytest.approx(3.0)
    assert m.recover_s == pytest.approx(2.5)
    assert m.serving_again_s == pytest.approx(12.6)  # a's first token after the fault: sent at 22.5, TTFT 0.1
    assert m.as_dict()["ttft_p99_ratio"] == 3.0


def test_serving_again_counts_a_request_held_through_the_fault_from_its_first_token():
    held = sent(10.5, "a", ttft=9.0)  # sent into a frozen unit, answered after the undo at 20
    (m,) = measure([*RECORDED, held], [WINDOW], {"a"})
    assert m.serving_again_s == pytest.approx(9.5) and m.served_during_fault == 1


def test_a_unit_still_routed_at_the_undo_and_never_back():
    outcomes = [sent(1.0, "a"), sent(5.0, "a", error="timeout"), sent(9.5, "a", error="timeout"), sent(12, "b")]
    (m,) = measure(outcomes, [FaultWindow("engine_stall", "a", 4.0, 10.0)], {"a"})
    assert m.route_away_s == pytest.approx(5.5) and m.still_routed
    assert m.recover_s is None and m.consul_critical_s is None and m.ttft_p99_fault_s is None
    assert m.ttft_p99_ratio is None


def test_failures_are_counted_in_their_own_faults_segment():
    first, second = FaultWindow("engine_stall", "a", 2.0, 4.0), FaultWindow("engine_crash", "a", 8.0, 10.0)
    outcomes = [sent(1.0, "a"), sent(3.0, "a", error="timeout"), sent(9.0, "a", error="connect"),
                sent(9.5, "a", error="connect"), sent(12.0, "a")]
    m1, m2 = measure(outcomes, [first, second], {"a"})
    assert (m1.failed_not_streaming, m2.failed_not_streaming) == (1, 2)
    assert (m1.recover_s, m2.recover_s) == (pytest.approx(8.0), pytest.approx(2.0))


def test_checks_judge_each_faults_measures():
    (m,) = measure(RECORDED, [WINDOW], {"a"}, CONSUL)
    verdicts = judge([m], {"route_away_s_max": 2, "failed_not_streaming_max": 0, "ttft_p99_ratio_max": 1.15,
                           "recover_s_max": 300, "consul_critical_s_max": 15})
    assert {v.check: v.met for v in verdicts} == {"route_away_s_max": True, "failed_not_streaming_max": False,
                                                  "ttft_p99_ratio_max": False, "recover_s_max": True,
                                                  "consul_critical_s_max": True}
    (unseen,) = judge(measure(RECORDED, [WINDOW], {"a"}), {"consul_critical_s_max": 15})
    assert unseen.value is None and not unseen.met  # not seen is not met


def test_timeline_per_second():
    line = timeline(RECORDED, {"a"}, 24.0)
    assert len(line["t"]) == 24 and sum(line["sent"]) == len(RECORDED)
    assert line["failed"][11] == 1 and line["failed"][13] == 1
    assert line["faulted_share"][0] == 0.5 and line["faulted_share"][15] == 0.0
    assert line["ttft_p99_s"][15] == 0.3 and line["ttft_p99_s"][20] is None


def test_an_edge_restart_has_no_faulted_unit_and_counts_what_it_cut_in_flight():
    """Requests sent before the restart and failing are what the edge's drain promised to finish; those sent
    while its listener was closed were refused (no unit named)."""
    outcomes = [sent(1.0, "a"), sent(4.8, "b", error="cut_stream", streamed=True), sent(5.2, None, error="connect"),
                sent(5.4, None, error="connect"), sent(8.0, "a")]
    (m,) = measure(outcomes, [FaultWindow("edge_restart", "n1", 5.0, 7.0)], ())
    assert (m.failed_in_flight, m.failed_not_streaming, m.blast_radius_errors) == (1, 2, 1)
    assert m.route_away_s == 0.0 and m.recover_s is None
