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


def weakly_following(unit: str, rng: random.Random, slope: float, n: int = 160) -> list[Sample]:
    """Predictions that follow the waits only a little (a pool whose host stalls it: the waits gain delays
    no score foresees); ``slope`` 0: predictions at random."""
    out = []
    for _ in range(n):
        wait = rng.expovariate(1 / 0.5)
        predicted = max(0.0, slope * wait + rng.gauss(0.3, 0.3))
        out.append(Sample(unit, predicted, predicted, wait, 1000))
    return out


def test_a_correlation_under_the_limit_by_its_sampling_noise_is_not_flagged_and_a_random_one_is():
    rng = random.Random(2)
    by_unit = {u: weakly_following(u, rng, 0.16) for u in ("a", "b", "c")}
    by_unit["rnd"] = weakly_following("rnd", rng, 0.0)
    rows = {r.unit: r for r in calibrate.judge(by_unit)}
    # b and c read under the limit, by less than their 160 answers can tell
    assert rows["b"].correlation < calibrate.MIN_CORRELATION and rows["c"].correlation < calibrate.MIN_CORRELATION
    assert [u for u, r in rows.items() if r.flags] == ["rnd"]
    assert calibrate.correlation_at_most(rows["c"].correlation, 160) > calibrate.MIN_CORRELATION
    assert rows["rnd"].flags[0].startswith("correlation") and "at most" in rows["rnd"].flags[0]


def test_the_correlations_bound_narrows_with_the_answers():
    assert calibrate.correlation_at_most(0.19, 161) == pytest.approx(0.312, abs=0.001)
    assert calibrate.correlation_at_most(0.19, 1000) < 0.25 < calibrate.correlation_at_most(0.19, 40)
    assert calibrate.correlation_at_most(1.0, 50) == pytest.approx(1.0) and calibrate.correlation_at_most(0.5, 3) == 1.0


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


def test_a_unit_whose_answers_could_not_have_flagged_a_liar_is_undecided_not_passed():
    rng = random.Random(5)
    by_unit = {u: heavy_tailed(u, rng, 1.0, n=200) for u in ("a", "b")}
    by_unit["thin"] = heavy_tailed("thin", rng, 1.0, n=30)  # honest, but too few answers to clear it
    result = calibrate.Calibration("http://127.0.0.1:9", 10_000.0, calibrate.judge(by_unit), by_unit, 430, 0)
    rows = {r.unit: r for r in result.units}
    assert rows["thin"].log_se > calibrate.max_log_se()
    assert rows["thin"].verdict == "insufficient evidence" and rows["thin"].needs > 30
    assert result.undecided == ["thin"] and result.flagged == [] and not result.passed
    assert "insufficient evidence" in result.as_dict()["units"][2]["verdict"]
    # the standard error shrinks as 1 / sqrt(n): the count asked for brings it under the limit
    assert rows["thin"].log_se * math.sqrt(30 / rows["thin"].needs) <= calibrate.max_log_se()
    assert {rows[u].verdict for u in ("a", "b")} == {"ok"}


def test_too_few_answers_are_undecided_and_a_flag_needs_no_more():
    rng = random.Random(6)
    by_unit = {u: unit_samples(u, rng, 1.0) for u in ("u1", "u2", "u3")}
    by_unit["few"] = unit_samples("few", rng, 1.0, n=calibrate.MIN_SAMPLES - 1)
    by_unit["liar"] = unit_samples("liar", rng, 0.1)
    rows = {r.unit: r for r in calibrate.judge(by_unit)}
    assert rows["few"].undecided and rows["few"].needs == calibrate.MIN_SAMPLES
    assert rows["liar"].flags and rows["liar"].needs == 0 and rows["liar"].verdict == "misleads"


def test_a_smaller_detection_scale_asks_for_more_answers():
    rng = random.Random(7)
    samples = heavy_tailed("u", rng, 1.0, n=120)
    se = calibrate.log_scale_se(samples)
    assert calibrate.max_log_se(2.2) < calibrate.max_log_se(2.5) < se
    assert calibrate.needed_samples(120, se, 2.2) > calibrate.needed_samples(120, se, 2.5) > 120


def test_more_requests_are_sized_from_the_undecided_units_share():
    rows = [calibrate.UnitCalibration("a", 100, None, 0.2, 0.2, 0.0, 0.1, 0.9, 1.0, needs=0),
            calibrate.UnitCalibration("b", 50, None, 0.2, 0.2, 0.0, 0.1, 0.9, 1.0, needs=150)]
    result = calibrate.Calibration("http://127.0.0.1:9", 10_000.0, rows, {}, 200, 0)
    # b answered a quarter of the requests and lacks 100 answers: 400 requests, a tenth more
    assert calibrate.more_requests(result) == 440


def test_run_sends_more_rounds_until_every_unit_is_decided(monkeypatch):
    rounds = []

    async def drive(endpoint, scenario, rate, requests, *, seed=1, **kwargs):
        rounds.append((requests, seed))
        rng = random.Random(seed)
        out = []
        for i in range(requests):
            unit = ("a", "b", "c")[i % 3]
            wait = rng.expovariate(1 / 0.25)
            predicted = wait * rng.lognormvariate(0, 0.5)
            out.append(outcome(unit, 1000, 0.1, 0.1 + wait, 0.1 + predicted))
        return out

    monkeypatch.setattr(calibrate, "drive", drive)
    seen = []
    result = calibrate.run("http://127.0.0.1:9", None, 10.0, 90, max_requests=5000, seed=3, progress=seen.append)
    assert result.undecided == [] and result.rounds == len(rounds) > 1
    assert result.requests == sum(n for n, _ in rounds) and len({s for _, s in rounds}) == len(rounds)
    assert all(n >= calibrate.MIN_ROUND for n, _ in rounds[1:]) and "insufficient evidence" in seen[0]


def test_a_further_round_sends_half_of_what_the_undecided_units_lack(monkeypatch):
    sent = []

    async def drive(endpoint, scenario, rate, requests, *, seed=1, **kwargs):
        rng = random.Random(seed)
        out = [outcome(("a", "b", "c")[i % 3], 1000, 0.1, 0.1 + w, 0.1 + w * rng.lognormvariate(0, 1.0))
               for i, w in enumerate(rng.expovariate(4) for _ in range(requests))]
        sent.append(list(out))  # run extends the first round's list with the next
        return out

    monkeypatch.setattr(calibrate, "drive", drive)
    calibrate.run("http://127.0.0.1:9", None, 10.0, 90, max_requests=100_000, seed=3)
    first = calibrate.calibration_of("http://127.0.0.1:9", sent[0])
    assert first.undecided and calibrate.more_requests(first) > 2 * calibrate.MIN_ROUND
    assert len(sent[1]) == math.ceil(calibrate.more_requests(first) / 2)  # judged again halfway


def test_run_stops_at_max_requests_and_says_who_is_undecided(monkeypatch):
    async def drive(endpoint, scenario, rate, requests, *, seed=1, **kwargs):
        rng = random.Random(seed)
        return [outcome(("a", "b", "c")[i % 3], 1000, 0.1, 0.1 + w, 0.1 + w * rng.lognormvariate(0, 1.5))
                for i, w in enumerate(rng.expovariate(4) for _ in range(requests))]

    monkeypatch.setattr(calibrate, "drive", drive)
    result = calibrate.run("http://127.0.0.1:9", None, 10.0, 90, max_requests=200)
    assert result.requests == 200 and result.undecided and not result.passed
    assert "undecided (insufficient evidence)" in str(result.render().renderables[-1])
