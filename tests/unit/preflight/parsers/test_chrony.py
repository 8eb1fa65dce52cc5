from pathlib import Path

import pytest

from preflight.parsers import ParseError, chrony

pytestmark = pytest.mark.unit

DIR = Path(__file__).resolve().parents[3] / "fixtures" / "preflight" / "chrony"


def load(name: str) -> chrony.Tracking:
    return chrony.parse((DIR / name).read_bytes().decode())


def test_synchronised_slow_clock_is_negative():
    t = load("aws-time-sync-linklocal-chrony4.2-normal.txt")
    assert t.to_json() == {"reference": "A9FEA97B (169.254.169.123)", "stratum": 4,
                           "system_time_offset_s": -0.0000316, "last_offset_s": -0.00004104,
                           "rms_offset_s": 0.000053422, "leap_status": "Normal"}
    assert t.synchronised and t.reference_id == "A9FEA97B"
    assert (t.frequency_ppm, t.root_delay_s, t.update_interval_s) == (-2.286, 0.000312345, 16.1)


def test_fast_clock_is_positive_and_hostname_reference_kept_as_printed():
    t = load("ntp-pool-hostname-reference-fast.txt")
    assert (t.reference, t.system_time_offset_s, t.last_offset_s) == ("D8EF2308 (time1.google.com)", 0.000012437,
                                                                      0.000009871)


def test_ptp_refclock():
    t = load("ptp-phc0-refclock-stratum1.txt")
    assert (t.reference, t.stratum, t.system_time_offset_s) == ("50484330 (PHC0)", 1, 0.000000012)


def test_unsynchronised():
    t = load("unsynchronised-reference-00000000.txt")
    assert (t.reference, t.stratum, t.leap_status, t.synchronised) == ("00000000 ()", 0, "Not synchronised", False)


def test_offset_over_a_millisecond():
    assert load("offset-4.5ms-slow-after-step.txt").system_time_offset_s == -0.004512311


def test_leap_second_and_local_reference():
    assert load("leap-insert-second.txt").leap_status == "Insert second"
    local = load("local-orphan-reference-7F7F0101.txt")
    assert (local.reference, local.stratum, local.synchronised) == ("7F7F0101 ()", 10, True)


def test_two_runs_with_crlf_read_the_last():
    t = load("two-runs-crlf-unsynced-then-synced.txt")
    assert t.reference == "A9FEA97B (169.254.169.123)" and t.leap_status == "Normal"


def test_truncated_names_the_last_line():
    with pytest.raises(ParseError) as info:
        load("truncated-before-leap-status.txt")
    assert info.value.line_no == 9 and info.value.line.startswith("Skew")


def test_daemon_not_running():
    with pytest.raises(ParseError) as info:
        load("garbage-cannot-talk-to-daemon.txt")
    assert info.value.line == "506 Cannot talk to daemon"


def test_bad_seconds_value():
    text = (DIR / "leap-insert-second.txt").read_text().replace("0.000001874 seconds slow", "soon")
    with pytest.raises(ParseError) as info:
        chrony.parse(text)
    assert info.value.line_no == 4
