"""Blocking-query parameters (https://developer.hashicorp.com/consul/api-docs/features/blocking): wait
defaults to 5 minutes, is limited to 10 minutes, and gets up to wait/16 of random jitter."""

from __future__ import annotations

import pytest

from devconsul.httpapi import ApiError, Request, parse_blocking

pytestmark = pytest.mark.unit


def _req(query: str) -> Request:
    return Request.parse("GET", f"/v1/kv/x?{query}", {}, b"")


def test_wait_gets_at_most_a_sixteenth_of_jitter():
    holds = [parse_blocking(_req("index=5&wait=16s"))[1] for _ in range(200)]
    assert all(16.0 <= h <= 17.0 for h in holds)
    assert max(holds) > 16.0  # the jitter is really added


@pytest.mark.parametrize(("query", "low", "high"), [
    ("index=5", 300.0, 300.0 * 17 / 16),  # default 5 minutes
    ("index=5&wait=1h", 600.0, 600.0 * 17 / 16),  # limited to 10 minutes
    ("index=5&wait=", 300.0, 300.0 * 17 / 16),  # an empty value counts as absent (http.go parseWait)
])
def test_wait_default_and_limit(query, low, high):
    index, hold = parse_blocking(_req(query))
    assert index == 5 and low <= hold <= high


def test_no_index_means_no_blocking():
    assert parse_blocking(_req("wait=10s"))[0] == 0


def test_index_must_be_unsigned_64_bit():
    with pytest.raises(ApiError) as err:
        parse_blocking(_req(f"index={2**64}"))
    assert err.value.status == 400
