"""edge/liveness.py: an IU whose relayed streams all went silent, judged against its usual gaps."""

from __future__ import annotations

import pytest

from edge.liveness import FIRST_BYTE_FLOOR_S, SCAN_S, SILENCE_FLOOR_S, Liveness, first_byte_due

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def streaming(clock: Clock, *iu_ids: str) -> Liveness:
    liveness = Liveness(clock=clock)
    for iu_id in iu_ids:
        liveness.started(iu_id, ttft_s=0.05)
    return liveness


def test_an_iu_is_silent_once_no_stream_of_it_sent_a_byte_past_the_floor_and_back_with_its_next_byte():
    clock = Clock()
    liveness = streaming(clock, "a", "b")
    clock.advance(SILENCE_FLOOR_S - 0.01)
    liveness.byte("b")
    assert liveness.silent(pool_size=4) == frozenset()
    clock.advance(0.02 + SCAN_S)
    assert liveness.silent(pool_size=4) == {"a"}
    liveness.byte("a")
    assert liveness.silent(pool_size=4) == {"a"}  # until the next scan
    clock.advance(SCAN_S + 0.001)
    assert liveness.silent(pool_size=4) == frozenset()


def test_the_silence_scales_with_the_ius_usual_gap_between_bytes():
    clock = Clock()
    liveness = streaming(clock, "slow")
    for _ in range(200):
        clock.advance(0.1)  # a 100 ms engine step
        liveness.byte("slow")
    assert liveness.silence_s("slow") == pytest.approx(1.0, rel=0.01)
    clock.advance(0.6)
    assert liveness.silent(pool_size=4) == frozenset()
    clock.advance(0.5)
    assert liveness.silent(pool_size=4) == {"slow"}


def test_more_than_half_the_pool_silent_at_once_is_the_edge_not_the_ius_and_a_pool_of_one_is_never_silent():
    clock = Clock()
    liveness = streaming(clock, "a", "b", "c")
    clock.advance(1.0)
    assert liveness.silent(pool_size=4) == frozenset()  # 3 of 4: the edge stopped reading
    clock.advance(SCAN_S + 0.001)
    assert liveness.silent(pool_size=6) == {"a", "b", "c"}
    lone = streaming(clock, "a")
    clock.advance(1.0)
    assert lone.silent(pool_size=1) == frozenset()


def test_an_iu_with_no_stream_being_relayed_is_never_silent():
    clock = Clock()
    liveness = streaming(clock, "a")
    liveness.ended("a")
    clock.advance(5.0)
    assert liveness.silent(pool_size=4) == frozenset() and "a" not in liveness.last
    liveness.started("a")
    clock.advance(SILENCE_FLOOR_S / 2)
    assert liveness.silent(pool_size=4) == frozenset()  # its first byte restarts the watch


def test_a_first_byte_is_due_after_twice_its_prediction_never_sooner_than_the_floor():
    assert first_byte_due(None, None) == FIRST_BYTE_FLOOR_S
    assert first_byte_due(0.05, 0.02) == FIRST_BYTE_FLOOR_S
    assert first_byte_due(1.5, 0.2) == 3.0  # a long prompt's prefill, predicted: left to finish
    assert first_byte_due(None, 0.4) == 0.8  # the IU's recent first bytes
