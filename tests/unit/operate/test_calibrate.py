"""Calibration's verdict per unit: a unit whose predictions read low (or high) against the pool is flagged;
what every unit shares is not; the reference prefill rate is the pool's median."""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import replace

import pytest

from operate import calibrate
from operate.calibrate import Sample
from operate.loadgen import Outcome

pytestmark = pytest.mark.unit


def unit_samples(unit: str, rng: random.Random, scale: float, offset: float = 0.0, n: int = 60) -> list[Sample]:
    out = []
    for _ in range(n):
        wait = rng.uniform(0.0, 0.6)
        predicted = max(0.0, wait * scale + offset + rng.gauss(0, 0.05))
        out.append(Sample(unit, predicted, predicted, wait, 1000))
    return out


def test_a_unit_reading_low_is_flagged_and_a_shared_error_is_not():
    rng = random.Random(1)
    # every unit predicts 20% high (a shared prefill-rate error); u4 predicts a quarter of its waits
    by_unit = {u: unit_samples(u, rng, 1.2) for u in ("u1", "u2", "u3")}
    by_unit["u4"] = unit_samples("u4", rng, 0.25)
    rows = {r.unit: r for r in calibrate.judge(by_unit)}
    assert [u for u, r in rows.items() if r.flags] == ["u4"]
    assert rows["u4"].flags[0].startswith("reads low") and rows["u4"].bias_s < -0.15
    assert 0.9 < rows["u1"].correlation <= 1.0 and abs(rows["u1"].scale - 1.2) < 0.1


def test_a_unit_reading_high_or_at_random_is_flagged():
    rng = random.Random(2)
    by_unit = {u: unit_samples(u, rng, 1.0) for u in ("u1", "u2", "u3")}
    by_unit["hi"] = unit_samples("hi", rng, 1.0, offset=0.4)  # a clock ahead: every score old by 0.4 s
    noise = [Sample("rnd", p, p, w, 1000) for p, w in ((rng.uniform(0, 0.6), rng.uniform(0, 0.6)) for _ in range(80))]
    by_unit["rnd"] = noise
    rows = {r.unit: r for r in calibrate.judge(by_unit)}
    assert rows["hi"].flags and rows["hi"].flags[0].startswith("reads high")
    assert any(f.startswith("correlation") for f in rows["rnd"].flags)
    assert not any(rows[u].flags for u in ("u1", "u2", "u3"))


def heavy_tailed(unit: str, rng: random.Random, scale: float, n: int = 40) -> list[Sample]:
    """Waits as an open-loop queue gives them (exponential) and predictions scattered around ``scale`` x
    the wait (log-normal): the spread a few dozen real answers show."""
    out = []
    for _ in range(n):
        wait = rng.expovariate(1 / 0.25)
        predicted = scale * wait * rng.lognormvariate(0, 0.8) / math.exp(0.32)
        out.append(Sample(unit, predicted, predicted, wait, 1000))
    return out


def test_a_scale_off_by_its_sampling_noise_is_not_flagged_and_a_liars_is():
    rng = random.Random(0)
    by_unit = {u: heavy_tailed(u, rng, 1.3) for u in ("a", "b")}
    by_unit["c"] = heavy_tailed("c", rng, 2.2)  # honest, drawn unlucky: 1.54x the pool's median scale
    by_unit["liar"] = heavy_tailed("liar", rng, 0.35)
    rows = {r.unit: r for r in calibrate.judge(by_unit)}
    median = statistics.median(r.scale for r in rows.values())
    assert rows["c"].scale / median > calibrate.SCALE_LIMIT
    assert calibrate.log_scale_se(by_unit["c"]) > 0.1
    assert [u for u, r in rows.items() if r.flags] == ["liar"]


def test_few_samples_get_no_verdict():
    rng = random.Random(3)
    by_unit = {u: unit_samples(u, rng, 1.0) for u in ("u1", "u2")}
    by_unit["few"] = unit_samples("few", rng, 0.1, n=calibrate.MIN_SAMPLES - 1)
    assert not {r.unit: r for r in calibrate.judge(by_unit)}["few"].flags


def outcome(iu: str, prompt: int, prefill_s: float, ttft: float, expected: float | None = None) -> Outcome:
    return Outcome(0, "A", 0.0, 0.0, prompt, 10, ttft_s=ttft, e2e_s=ttft + 1, tokens=10, iu=iu, score=0.1,
                   expected_s=expected, prefill_s=prefill_s)


def test_the_reference_rate_is_the_pools_median_and_waits_subtract_own_prefill():
    outcomes = [outcome("a", 1000, 0.1, 0.5, 0.3), outcome("b", 1000, 0.1, 0.5, 0.3),
                outcome("liar", 1000, 0.01, 0.5, 0.3)]
    assert calibrate.reference_rate(outcomes) == 10000.0  # not the liar's 100,000
    samples = calibrate.samples_of(outcomes, 10000.0)
    assert samples["a"][0].wait_s == pytest.approx(0.4) and samples["a"][0].predicted_s == pytest.approx(0.2)
    assert samples["liar"][0].predicted_s == pytest.approx(0.29)


def test_an_endpoint_that_names_no_unit_is_a_usage_error():
    plain = [Outcome(0, "A", 0.0, 0.0, 100, 10, ttft_s=0.1, e2e_s=0.2, tokens=10)]
    with pytest.raises(calibrate.ClusterctlError, match="no X-Eas-IU header") as caught:
        calibrate.calibration_of("http://127.0.0.1:9", plain)
    assert caught.value.exit_code == 2


def test_an_answer_moved_from_another_unit_is_counted_as_rerouted_and_charged_to_no_unit():
    rng = random.Random(4)
    honest = [outcome(u, 1000, 0.1, 0.1 + w, 0.1 + w) for u in ("a", "b", "c") for w in
              (rng.uniform(0.0, 0.3) for _ in range(30))]
    # a misleading unit left before the first byte: the answer came from "a" after seconds spent there
    moved = [replace(outcome("a", 1000, 0.1, 3.0 + rng.uniform(0, 1), 0.15), tried=2) for _ in range(30)]
    result = calibrate.calibration_of("http://127.0.0.1:9", honest + moved)
    assert result.rerouted == 30 and result.as_dict()["rerouted"] == 30
    assert result.flagged == [] and {u.unit: u.samples for u in result.units} == {"a": 30, "b": 30, "c": 30}
