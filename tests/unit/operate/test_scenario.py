"""Scenario files: the default is the production mix; every malformed file is one ScenarioError line naming
the file, the field and the value (exit 2)."""

from __future__ import annotations

import random
import statistics

import pytest

from common.errors import ExitCode
from operate.scenario import ScenarioError, load_scenario, parse_scenario

pytestmark = pytest.mark.unit


def valid() -> dict:
    return {"name": "mix", "classes": {
        "A": {"share": 0.7, "prompt_tokens": {"mean": 300, "sigma": 0.3}, "output_tokens": 50,
              "slo": {"ttft_p99_ms": 850}},
        "B": {"share": 0.3, "prompt_tokens": 4000, "output_tokens": {"mean": 200}, "slo": {"e2e_p99_ms": 9000}}}}


def error_of(data) -> str:
    with pytest.raises(ScenarioError) as caught:
        parse_scenario(data, "s.yml")
    assert caught.value.exit_code == ExitCode.USAGE
    message = str(caught.value)
    assert "\n" not in message and message.startswith("s.yml: ")
    return message


def test_the_default_file_is_the_production_mix_with_ttft_limits():
    scenario = load_scenario()
    got = {k.name: (k.share, k.prompt.mean, k.slo.ttft_p99_ms, k.slo.e2e_p99_ms) for k in scenario.classes}
    assert got == {"A": (0.65, 327, 850, None), "B": (0.30, 4218, 2200, None), "C": (0.05, 12842, 5500, None)}
    assert scenario.max_model_len == 32768


def test_draws_follow_shares_and_means():
    scenario = load_scenario()
    rng = random.Random(5)
    draws = [scenario.draw(rng) for _ in range(20000)]
    share_a = sum(1 for k, _, _ in draws if k == "A") / len(draws)
    assert abs(share_a - 0.65) < 0.015
    prompts_b = [p for k, p, _ in draws if k == "B"]
    assert abs(statistics.fmean(prompts_b) - 4218) / 4218 < 0.03
    assert all(p + o <= 32768 for _, p, o in draws)


def test_a_bare_count_is_a_fixed_size():
    scenario = parse_scenario(valid(), "s.yml")
    rng = random.Random(1)
    assert {p for k, p, _ in (scenario.draw(rng) for _ in range(200)) if k == "B"} == {4000}
    assert scenario.by_name()["B"].prompt.sigma == 0


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda d: d["classes"]["A"].update(share=0.6), "classes.*.share: shares must sum to 1, they sum to 0.9 (0.6 + 0.3)"),
    (lambda d: d.update(rate=3), "rate: unknown field; expected one of classes, description, max_model_len, name"),
    (lambda d: d["classes"]["A"].update(weight=1), "classes.A.weight: unknown field"),
    (lambda d: d["classes"]["A"]["prompt_tokens"].update(stdev=3), "classes.A.prompt_tokens.stdev: unknown field"),
    (lambda d: d["classes"]["A"]["slo"].update(ttft_p95_ms=3), "classes.A.slo.ttft_p95_ms: unknown field"),
    (lambda d: d["classes"]["A"].pop("slo"), "classes.A.slo: missing"),
    (lambda d: d["classes"]["A"].update(slo={}), "classes.A.slo: no latency target"),
    (lambda d: d["classes"]["A"].update(share="65%"), "classes.A.share: expected a number (got '65%')"),
    (lambda d: d["classes"]["A"].update(share=0), "classes.A.share: expected a number > 0 and <= 1 (got 0)"),
    (lambda d: d["classes"]["B"].update(prompt_tokens=0), "classes.B.prompt_tokens.mean: expected a number >= 1"),
    (lambda d: d["classes"]["A"]["slo"].update(ttft_p99_ms=-5), "classes.A.slo.ttft_p99_ms: expected a number > 0"),
    (lambda d: d["classes"]["A"]["prompt_tokens"].update(max=100), "classes.A.prompt_tokens.mean: outside [min, max]"),
    (lambda d: d.update(classes=[]), "classes: expected a mapping of class name -> class"),
    (lambda d: d.pop("name"), "name: missing"),
])
def test_malformed_fields_name_the_field_and_value(mutate, expected):
    data = valid()
    mutate(data)
    assert expected in error_of(data)


def test_a_file_that_is_not_yaml_or_not_there_is_one_line(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"bad.yml: not valid YAML at line \d"):
        load_scenario(bad)
    with pytest.raises(ScenarioError, match="missing.yml: cannot read the scenario file"):
        load_scenario(tmp_path / "missing.yml")
    top = tmp_path / "list.yml"
    top.write_text("- a\n")
    with pytest.raises(ScenarioError, match=r"list.yml: \(top level\): expected a mapping"):
        load_scenario(top)
