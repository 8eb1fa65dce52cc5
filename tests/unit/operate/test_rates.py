"""--rate, --sweep and --endpoint as typed: checked once, one line each."""

from __future__ import annotations

import pytest

from operate.rates import UsageError, parse_endpoint, parse_rate, parse_sweep

pytestmark = pytest.mark.unit


def test_sweeps_as_ranges_and_lists():
    assert parse_sweep("2:10:2") == [2, 4, 6, 8, 10]
    assert parse_sweep("0.5:1.5:0.5") == [0.5, 1.0, 1.5]
    assert parse_sweep("8, 2,4,2") == [2, 4, 8]


@pytest.mark.parametrize("text", ["10:2:1", "1:2", "a,b", "", "0:4:1", "1:1000:1", "-1"])
def test_bad_sweeps_are_usage_errors(text):
    with pytest.raises(UsageError, match="--sweep"):
        parse_sweep(text)


def test_rates_and_endpoints():
    assert parse_rate("2.5") == 2.5
    for bad in ("0", "-3", "fast", "1e9"):
        with pytest.raises(UsageError, match="--rate"):
            parse_rate(bad)
    assert parse_endpoint("127.0.0.1:8080") == "http://127.0.0.1:8080"
    assert parse_endpoint("https://127.0.0.1:8443/") == "https://127.0.0.1:8443"
    for bad in ("127.0.0.1", "ftp://h:1", "http://h:1/v1/completions", "http://u:p@h:1", "http://h:x"):
        with pytest.raises(UsageError, match="--endpoint"):
            parse_endpoint(bad)
