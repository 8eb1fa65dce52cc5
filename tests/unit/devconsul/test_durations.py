"""Go duration text (https://pkg.go.dev/time#ParseDuration, time.Duration.String), which Consul uses for
``?wait``, check TTL/Interval/Timeout, and prints in ``/v1/agent/checks``."""

from __future__ import annotations

import pytest

from devconsul.durations import duration_value, format_duration, parse_duration

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("text", "seconds"), [
    ("0", 0.0), ("10s", 10.0), ("1m30s", 90.0), ("1.5h", 5400.0), ("250ms", 0.25), ("2us", 2e-6),
    ("1h2m3.5s", 3723.5), ("-1s", -1.0),
])
def test_parse(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["10", "", "1x", "s", "1s2", "1 s"])
def test_parse_rejects_what_go_rejects(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(("seconds", "text"), [
    (0, "0s"), (1, "1s"), (60, "1m0s"), (90, "1m30s"), (3723, "1h2m3s"), (0.5, "500ms"), (1.5, "1.5s"),
    (3600, "1h0m0s"), (2e-6, "2µs"),
])
def test_format_like_go(seconds, text):
    assert format_duration(seconds) == text


def test_definition_number_is_nanoseconds():
    """A JSON number in a check definition decodes as a Go time.Duration: nanoseconds."""
    assert duration_value(10_000_000_000) == 10.0
    assert duration_value("10s") == 10.0
