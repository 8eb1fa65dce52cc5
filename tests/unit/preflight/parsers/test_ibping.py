from pathlib import Path

import pytest

from preflight.parsers import ParseError, ibping

pytestmark = pytest.mark.unit

DIR = Path(__file__).resolve().parents[3] / "fixtures" / "preflight" / "ibping"


def load(name: str) -> ibping.IbPing:
    return ibping.parse((DIR / name).read_text())


def test_ten_replies_rtt_as_printed_and_corrected():
    r = load("h100-ndr-rdma-core50-count10-ok.txt")
    assert (r.transmitted, r.received, r.loss_pct) == (10, 10, 0.0)
    assert (r.rtt_min_ms, r.rtt_avg_ms, r.rtt_max_ms) == (0.002, 0.002, 0.004)
    assert r.rtt_max_ms_corrected == 0.04
    assert (r.host, r.destination, r.time_ms, len(r.pong_ms)) == ("r01n02.(none)", "Lid 1202", 9006, 10)
    assert r.to_json() == {"transmitted": 10, "received": 10, "loss_pct": 0.0, "rtt_min_ms": 0.002,
                           "rtt_avg_ms": 0.002, "rtt_max_ms": 0.004, "rtt_min_ms_corrected": 0.02,
                           "rtt_avg_ms_corrected": 0.02, "rtt_max_ms_corrected": 0.04}


def test_old_package_values_are_kept_as_printed():
    r = load("a100-hdr-infiniband-diags-1.6-before-rtt-bug.txt")
    assert (r.rtt_min_ms, r.rtt_avg_ms, r.rtt_max_ms) == (0.018, 0.02, 0.027)


def test_flood_mode_has_no_pong_lines():
    r = load("flood-c1000-quiet.txt")
    assert (r.transmitted, r.received, r.pong_ms) == (1000, 1000, ())


def test_loss_with_mad_timeouts():
    r = load("loss-3-of-10-mad-timeouts.txt")
    assert (r.transmitted, r.received, r.loss_pct, len(r.pong_ms)) == (10, 7, 30.0, 7)


def test_unreachable_destination():
    r = load("unreachable-all-lost.txt")
    assert (r.received, r.loss_pct, r.host, r.destination) == (0, 100.0, "", "Lid 1208")


def test_loss_is_computed_from_counts_not_the_truncated_percentage():
    text = ("--- h.(none) (Lid 3) ibping statistics ---\n1000 packets transmitted, 999 received, 0% packet loss,"
            " time 1000 ms\nrtt min/avg/max = 0.001/0.002/0.003 ms\n")
    assert ibping.parse(text).loss_pct == 0.1


def test_srun_label_prefix():
    assert load("srun-label-prefix-count5.txt").transmitted == 5


def test_two_runs_reads_the_last():
    r = load("two-runs-pasted-second-complete.txt")
    assert (r.transmitted, r.destination) == (4, "Lid 1204")


def test_killed_before_statistics_names_the_last_line():
    with pytest.raises(ParseError) as info:
        load("truncated-killed-before-statistics.txt")
    assert info.value.line_no == 3 and info.value.line.startswith("Pong from")


def test_garbage_names_the_error_line():
    with pytest.raises(ParseError) as info:
        load("garbage-cannot-resolve-destination.txt")
    assert "can't resolve destination" in info.value.line
