"""bench/edge_faults_read.py (what the virtual cluster's fault bench reads from the edges' /metrics and its
clients' outcomes) and the verdict lines it shares with bench/edge_faults.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import edge_faults  # noqa: E402
import edge_faults_read as read  # noqa: E402
from edge_faults import Fault, Outcome  # noqa: E402

pytestmark = pytest.mark.unit


def metrics(inflight: dict[str, int] | None = None, errors: dict[tuple[str, str], int] | None = None,
            retries: dict[str, int] | None = None, rejected: dict[str, int] | None = None) -> str:
    """A /metrics answer of an edge, with what a real one has around the lines read (HELP, TYPE, other metrics)."""
    lines = ["# HELP eas_edge_inflight This edge's requests in flight per IU.", "# TYPE eas_edge_inflight gauge"]
    lines += [f'eas_edge_inflight{{iu="{iu}"}} {n}.0' for iu, n in (inflight or {}).items()]
    lines += [f'eas_edge_upstream_errors_total{{iu="{iu}",kind="{kind}"}} {n}.0'
              for (iu, kind), n in (errors or {}).items()]
    lines += [f'eas_edge_retries_total{{reason="{r}"}} {n}.0' for r, n in (retries or {}).items()]
    lines += [f'eas_edge_rejected_total{{reason="{r}"}} {n}.0' for r, n in (rejected or {}).items()]
    lines += ['eas_edge_ttft_seconds_bucket{le="0.1",stream="true"} 4.0', "process_open_fds 31.0"]
    return "\n".join(lines) + "\n"


def samples(*readings: tuple[float, str, str]):
    return read.parse_samples([(at, edge, read.kept_lines(text)) for at, edge, text in readings])


def test_only_the_lines_read_are_kept():
    kept = read.kept_lines(metrics({"a": 1}, {("a", "connect"): 2}, {"connect": 2}))
    assert kept == ['eas_edge_inflight{iu="a"} 1.0', 'eas_edge_upstream_errors_total{iu="a",kind="connect"} 2.0',
                    'eas_edge_retries_total{reason="connect"} 2.0']


def test_a_send_is_a_rise_in_flight_or_a_failure_before_the_first_byte():
    parsed = samples(
        (1.0, "e1", metrics({"a": 2, "b": 1})),
        (1.2, "e1", metrics({"a": 3, "b": 0})),  # a: one more sent; b: a stream ended
        (1.4, "e1", metrics({"a": 3}, {("b", "connect"): 2})),  # two refused by a dead b, gone before this sample
        (1.6, "e1", metrics({"a": 3}, {("b", "connect"): 2, ("b", "stalled"): 1})),  # a stream of b cut: no send
    )
    assert read.send_events(parsed) == [(1.2, "a"), (1.4, "b"), (1.4, "b")]


def test_each_edge_is_compared_with_its_own_previous_reading():
    parsed = samples((1.0, "e1", metrics({"a": 2})), (1.1, "e2", metrics({"a": 0})),
                     (1.2, "e1", metrics({"a": 2})), (1.3, "e2", metrics({"a": 1})))
    assert read.send_events(parsed) == [(1.3, "a")]


def test_a_restarted_edge_counts_from_zero_again():
    parsed = samples((1.0, "e1", metrics({}, {("a", "connect"): 5}, {"connect": 5})),
                     (3.0, "e1", metrics({}, {("a", "connect"): 1}, {"connect": 1})))
    assert read.send_events(parsed) == [(3.0, "a")]
    assert read.counter_deltas(parsed, 0.0, 5.0) == {"retries": {"connect": 1}}


def test_counter_deltas_sum_the_edges_inside_the_window_only():
    parsed = samples((1.0, "e1", metrics(retries={"connect": 1})), (1.0, "e2", metrics(rejected={"draining": 0})),
                     (2.0, "e1", metrics(retries={"connect": 3, "silent": 1})),
                     (2.0, "e2", metrics(rejected={"draining": 2})),
                     (9.0, "e1", metrics(retries={"connect": 7, "silent": 1})))
    assert read.counter_deltas(parsed, 1.5, 5.0) == {"rejected": {"draining": 2},
                                                     "retries": {"connect": 2, "silent": 1}}


def outcome(started: float, ttft: float | None, ended: float, iu: str = "x", ok: bool = True, resumed: int = 0,
            error: str = "") -> Outcome:
    return Outcome(started, ttft=ttft, ended=ended, streamed=ttft is not None, ok=ok, iu=iu, resumed=resumed,
                   error=error)


def test_the_client_side_of_a_unit_fault_separates_its_streams_from_requests_not_yet_streaming():
    fault = Fault("kill", "a", at=10.0, until=20.0, quiet_until=20.0, sends=[10.1, 10.5], back=21.0)
    outcomes = [
        outcome(8.0, 0.5, 13.0, iu="a", resumed=1),  # streaming from a at the fault: resumed elsewhere
        outcome(9.0, 0.5, 10.5, iu="a", ok=False, error="SSE error event"),  # streaming from a: cut
        outcome(9.5, 1.0, 12.0, iu="b"),  # sent before the fault, its first byte after: not yet streaming
        outcome(11.0, None, 11.2, iu="", ok=False, error="HTTP 502"),  # sent during the fault
        outcome(8.0, 0.5, 12.0, iu="b"),  # streaming from another IU
        outcome(2.0, 0.5, 5.0, iu="a"),  # over before the fault
        outcome(20.5, 0.5, 23.0, iu="a"),  # after it answered again
    ]
    parsed = samples((9.0, "e1", metrics(retries={"connect": 0})), (10.2, "e1", metrics(retries={"connect": 2})))
    mode = read.failure_modes(outcomes, [fault], parsed, settle_s=2.0)["kill"]
    assert mode["client"] == {"elsewhere": 1, "elsewhere_resumed": 0, "not_streaming": 2, "not_streaming_failed": 1,
                              "not_streaming_resumed": 0, "on_unit": 2, "on_unit_failed": 1, "on_unit_resumed": 1}
    assert mode["errors"] == {"not_streaming: HTTP 502": 1, "on_unit: SSE error event": 1}
    assert mode["edge"] == {"retries": {"connect": 2}}
    assert (mode["sends_while_down"], mode["last_send_s"], mode["back_s"]) == (2, 0.5, [1.0])
    (header, _rule, row) = read.failure_table({"kill": mode})
    assert header.startswith("| fault | trials | what the client saw | what the edge did |")
    assert row.startswith("| kill | 1 | 2 streams flowing from the IU: 1 ended with [DONE] (1 resumed on another "
                          "IU); 2 requests not yet streaming (1 failed)")
    assert "moved before the first byte: connect 2" in row and "its first request 1.0-1.0 s later" in row


def test_an_edge_restart_is_told_by_requests_not_yet_streaming():
    fault = Fault(edge_faults.EDGE_RESTART, "r01n01", at=10.0, until=14.0, quiet_until=14.0)
    outcomes = [outcome(9.0, 0.5, 12.0), outcome(11.0, 0.3, 13.0), outcome(12.0, None, 12.1, ok=False, error="HTTP 503")]
    mode = read.failure_modes(outcomes, [fault], [], settle_s=1.0)[edge_faults.EDGE_RESTART]
    assert mode["client"]["not_streaming"] == 2 and mode["client"]["not_streaming_failed"] == 1
    assert mode["client"]["elsewhere"] == 1
    (_, _, row) = read.failure_table({edge_faults.EDGE_RESTART: mode})
    assert "2 requests not yet streaming while the edge restarted (1 failed)" in row


def row(**changes) -> dict:
    base = {"trials": 2, "requests_during": 100, "failed_not_streaming": 0, "failed_streaming": 0,
            "longest_silence_s": 3.1, "last_send_after_fault_s": 0.4, "back_in_rotation_s": 1.2, "p99_ttft_s": 0.5,
            "baseline_p99_ttft_s": 0.5, "ttft_ratio": 1.0}
    return base | changes


def test_a_restarted_unit_is_judged_on_its_return_only_when_asked_and_only_when_killed():
    numbers = {"kinds": {"kill": row(back_in_rotation_s=6.0), "stall": row(back_in_rotation_s=9.0)}}
    lines, met = edge_faults.verdict_lines(numbers)
    assert met and len(lines) == 8
    lines, met = edge_faults.verdict_lines(numbers, restarted_back=True)
    assert not met and len(lines) == 9
    assert lines[4] == "kill x2: the restarted IU's first request 6.0 s after it answered again <= 5 s: NOT met"
    numbers["kinds"]["kill"]["back_in_rotation_s"] = None  # never seen back: not met either
    assert not edge_faults.verdict_lines(numbers, restarted_back=True)[1]


def test_an_edge_restart_is_judged_on_the_requests_not_yet_streaming_only():
    numbers = {"kinds": {edge_faults.EDGE_RESTART: row(failed_streaming=3, longest_silence_s=30.0,
                                                       ttft_ratio=None)}}
    assert edge_faults.verdict_lines(numbers) == (
        ["edge_restart x2: requests not yet streaming lost 0 of 100 == 0: met"], True)
    numbers["kinds"][edge_faults.EDGE_RESTART]["failed_not_streaming"] = 1
    assert edge_faults.verdict_lines(numbers)[1] is False


def test_sends_are_attributed_to_the_fault_of_their_iu_while_it_was_down():
    faults = [Fault("kill", "a", 10.0, 20.0, 20.0), Fault("stall", "b", 30.0, 38.0, 38.0)]
    edge_faults.attribute_sends(faults, [(9.9, "a"), (10.2, "a"), (10.3, "b"), (21.5, "a"), (25.0, "a"),
                                         (31.0, "b"), (38.4, "b")])
    assert (faults[0].sends, faults[0].back) == ([10.2], 21.5)
    assert (faults[1].sends, faults[1].back) == ([31.0], 38.4)


def pool(at: float, edge: str, routable: int, probes_ok: int) -> tuple[float, str, str]:
    return at, edge, (f'eas_edge_pool_ius{{kind="routable"}} {routable}.0\neas_edge_pool_ius{{kind="all"}} 8.0\n'
                      f'eas_edge_probes_total{{outcome="ok"}} {probes_ok}.0\n')


def test_an_iu_is_back_in_the_view_when_every_edge_routes_to_the_whole_pool_again():
    fault = Fault("kill", "x", at=2.0, until=10.0, quiet_until=10.0)
    parsed = samples(pool(1, "a", 8, 0), pool(1, "b", 8, 0), pool(5, "a", 7, 0), pool(5, "b", 8, 0),
                     pool(11, "a", 7, 1), pool(11, "b", 8, 1), pool(13, "a", 8, 1), pool(13, "b", 8, 1))
    assert read.view_return(parsed, fault) == (True, 3.0)
    assert read.first_rise(parsed, "eas_edge_probes_total", (("outcome", "ok"),), 10.0) == 11
    assert read.view_return(parsed[:2] + parsed[4:], Fault("kill", "x", 2.0, 10.0, 10.0))[0] is False
    assert read.view_return(parsed[:6], fault) == (True, None)  # edge a never had it back
