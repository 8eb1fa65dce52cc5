"""Outlier ejection: consecutive and definitive failures, the cap on the ejected share, half-open probes."""

from __future__ import annotations

import random

import pytest

from edge.ejection import Outliers, stalled_first_byte
from edge.routing import Router

pytestmark = pytest.mark.unit


def test_three_failures_in_a_row_eject_and_a_success_between_resets_the_count():
    outliers = Outliers(eject_s=5.0)
    assert not outliers.failed("a", 0.0, 4) and not outliers.failed("a", 0.0, 4)
    outliers.succeeded("a")
    assert not outliers.failed("a", 1.0, 4) and not outliers.failed("a", 1.0, 4)
    assert outliers.failed("a", 1.0, 4)
    assert outliers.ejected == {"a": 6.0} and outliers.blocked(5.9) == {"a"}


def test_a_definitive_failure_ejects_at_once():
    outliers = Outliers(eject_s=5.0)
    assert outliers.failed("a", 0.0, 4, definitive=True)
    assert outliers.blocked(1.0) == {"a"}


def test_at_most_half_the_pool_is_ejected_at_once_but_always_one():
    outliers = Outliers(eject_s=5.0)
    assert outliers.failed("a", 0.0, 4, definitive=True)
    assert outliers.failed("b", 0.0, 4, definitive=True)
    assert not outliers.failed("c", 0.0, 4, definitive=True)  # 2 of 4 already out
    assert outliers.refused_by_cap == 1 and set(outliers.ejected) == {"a", "b"}
    assert outliers.failed("c", 6.0, 4, definitive=True)  # a and b are back (probing): room again
    lone = Outliers(eject_s=5.0)
    assert lone.failed("a", 0.0, 1, definitive=True)  # a pool of one: its one IU can still be ejected


def test_half_open_probes_once_and_the_probes_answer_decides():
    outliers = Outliers(eject_s=5.0)
    outliers.failed("a", 0.0, 4, definitive=True)
    assert outliers.due(4.9) == []
    assert outliers.due(5.0) == ["a"] and outliers.due(5.1) == []  # one probe at a time
    assert outliers.blocked(5.1) == {"a"}  # no client request until the probe answered
    assert outliers.failed("a", 6.0, 4)  # the probe failed: ejected again, one failure was enough
    assert outliers.ejected["a"] == 16.0  # twice the backoff
    assert outliers.due(16.0) == ["a"]
    outliers.failed("a", 17.0, 4)
    assert outliers.ejected["a"] == 27.0  # never longer than twice eject_s
    assert outliers.due(27.0) == ["a"]
    outliers.succeeded("a")
    assert outliers.blocked(30.0) == set() and "a" not in outliers.records
    assert not outliers.failed("a", 31.0, 4)  # back to counting from nothing


def test_a_probe_that_told_nothing_is_sent_again():
    outliers = Outliers(eject_s=5.0)
    outliers.failed("a", 0.0, 4, definitive=True)
    assert outliers.due(5.0) == ["a"]
    outliers.released("a")  # the edge itself could not send it
    assert outliers.due(5.5) == ["a"]


def test_the_edges_own_failures_never_count_against_an_iu():
    router = Router(random.Random(1), eject_s=5.0)
    for _ in range(10):
        assert not router.outcome("a", 0.0, "neutral", 4)
    assert router.ejected == {} and "a" not in router.outliers.records


def test_a_first_byte_is_a_stall_past_four_times_its_prediction_never_under_five_seconds():
    assert stalled_first_byte(None) == 5.0
    assert stalled_first_byte(0.2) == 5.0
    assert stalled_first_byte(3.0) == 12.0
