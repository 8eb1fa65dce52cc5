"""Scenario files: the traffic mix a load test sends and the latency targets it is judged by (YAML, strict).

A scenario is data (docs/loadtest.md has the format)::

    name: production-mix
    classes:
      A:
        share: 0.65                            # of the requests; the shares sum to 1
        prompt_tokens: {mean: 327, sigma: 0.35} # lognormal with this mean; sigma 0: every prompt is `mean`
        output_tokens: {mean: 153, sigma: 0.6}
        slo: {ttft_p99_ms: 850}                # ttft_p99_ms and/or e2e_p99_ms

Strict: an unknown field, a missing one, a wrong type, shares that do not sum to 1, or a class without a
latency target is a :class:`ScenarioError` naming the file, the field and the value (exit 2, nothing sent).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import yaml

from common.errors import UsageError

DEFAULT_SCENARIO = Path(__file__).parent / "scenarios" / "production-mix.yml"
SHARE_TOLERANCE = 1e-6
MAX_TOKENS = 1 << 20  # a sanity bound on a distribution's mean: no context is a million tokens
_TOP_FIELDS = {"name", "description", "classes", "max_model_len"}
_CLASS_FIELDS = {"share", "prompt_tokens", "output_tokens", "slo", "description"}
_DIST_FIELDS = {"mean", "sigma", "min", "max"}
_SLO_FIELDS = {"ttft_p99_ms", "e2e_p99_ms"}


class ScenarioError(UsageError):
    """A scenario file that cannot be used: one line naming the file, the field and the value."""


@dataclass(frozen=True)
class TokenDistribution:
    """Lognormal token counts with mean ``mean`` (sigma: of the underlying normal), clipped to [min, max]."""

    mean: float
    sigma: float = 0.0
    min: int = 1
    max: int = MAX_TOKENS

    def draw(self, rng: random.Random) -> int:
        value = self.mean if self.sigma == 0 else rng.lognormvariate(
            math.log(self.mean) - self.sigma * self.sigma / 2.0, self.sigma)
        return int(min(self.max, max(self.min, round(value))))


@dataclass(frozen=True)
class Slo:
    """p99 limits in milliseconds; None: not judged."""

    ttft_p99_ms: float | None = None
    e2e_p99_ms: float | None = None

    def limits(self) -> dict[str, float]:
        """metric ("ttft", "e2e") -> limit in seconds, for the limits set."""
        out = {}
        if self.ttft_p99_ms is not None:
            out["ttft"] = self.ttft_p99_ms / 1000.0
        if self.e2e_p99_ms is not None:
            out["e2e"] = self.e2e_p99_ms / 1000.0
        return out


@dataclass(frozen=True)
class RequestClass:
    name: str
    share: float
    prompt: TokenDistribution
    output: TokenDistribution
    slo: Slo
    description: str = ""


@dataclass(frozen=True)
class Scenario:
    name: str
    classes: tuple[RequestClass, ...]
    source: str = "<built-in>"
    description: str = ""
    max_model_len: int | None = None  # prompt + output never exceed it (the served model's context)

    def by_name(self) -> dict[str, RequestClass]:
        return {k.name: k for k in self.classes}

    def draw(self, rng: random.Random) -> tuple[str, int, int]:
        """(class name, prompt tokens, output tokens) of one request: the class by share, then its sizes."""
        u, chosen = rng.random(), self.classes[-1]
        for klass in self.classes:
            if u < klass.share:
                chosen = klass
                break
            u -= klass.share
        output = chosen.output.draw(rng)
        prompt = chosen.prompt.draw(rng)
        if self.max_model_len is not None:
            output = min(output, self.max_model_len - 1)
            prompt = max(1, min(prompt, self.max_model_len - output))
        return chosen.name, prompt, output


class FieldReader:
    """Field checks that raise one error line: ``<file>: <field>: <problem> (got <value>)`` (a ScenarioError,
    or ``error``: the rollout file's reader shares these checks)."""

    def __init__(self, source: str, error: type[UsageError] = ScenarioError):
        self.source, self.error = source, error

    def fail(self, field: str, problem: str, value=None) -> UsageError:
        got = "" if value is None else f" (got {value!r})"
        return self.error(f"{self.source}: {field or '(top level)'}: {problem}{got}")

    def mapping(self, value, field: str, allowed: set[str], required: set[str]) -> dict:
        if not isinstance(value, dict):
            raise self.fail(field, "expected a mapping", value)
        for key in value:
            if key not in allowed:
                raise self.fail(f"{field}.{key}" if field else str(key),
                                f"unknown field; expected one of {', '.join(sorted(allowed))}")
        for key in sorted(required):
            if key not in value:
                raise self.fail(f"{field}.{key}" if field else key, "missing")
        return value

    def number(self, value, field: str, low: float, high: float, low_open: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(field, "expected a number", value)
        if value < low or (low_open and value == low) or value > high:
            bound = f"> {low:g}" if low_open else f">= {low:g}"
            raise self.fail(field, f"expected a number {bound} and <= {high:g}", value)
        return float(value)

    def integer(self, value, field: str, low: int, high: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise self.fail(field, f"expected an integer in [{low}, {high}]", value)
        return value

    def text(self, value, field: str) -> str:
        if not isinstance(value, str):
            raise self.fail(field, "expected a string", value)
        return value

    def distribution(self, value, field: str) -> TokenDistribution:
        if isinstance(value, int) and not isinstance(value, bool):  # a bare count: every request that size
            value = {"mean": value}
        data = self.mapping(value, field, _DIST_FIELDS, {"mean"})
        mean = self.number(data["mean"], f"{field}.mean", 1, MAX_TOKENS)
        sigma = self.number(data.get("sigma", 0.0), f"{field}.sigma", 0, 3)
        low = self.integer(data.get("min", 1), f"{field}.min", 1, MAX_TOKENS)
        high = self.integer(data.get("max", MAX_TOKENS), f"{field}.max", low, MAX_TOKENS)
        if not low <= mean <= high:
            raise self.fail(f"{field}.mean", f"outside [min, max] = [{low}, {high}]", data["mean"])
        return TokenDistribution(mean, sigma, low, high)

    def slo(self, value, field: str) -> Slo:
        data = self.mapping(value, field, _SLO_FIELDS, set())
        if not data:
            raise self.fail(field, "no latency target: set ttft_p99_ms and/or e2e_p99_ms")
        limits = {key: self.number(data[key], f"{field}.{key}", 0, 3.6e6, low_open=True) if data.get(key)
                  is not None else None for key in _SLO_FIELDS}
        if all(v is None for v in limits.values()):
            raise self.fail(field, "no latency target: set ttft_p99_ms and/or e2e_p99_ms")
        return Slo(**limits)


def parse_scenario(data, source: str = "<scenario>") -> Scenario:
    """The scenario in ``data`` (decoded YAML); :class:`ScenarioError` for anything not as documented."""
    read = FieldReader(source)
    top = read.mapping(data, "", _TOP_FIELDS, {"name", "classes"})
    name = read.text(top["name"], "name")
    classes_data = top["classes"]
    if not isinstance(classes_data, dict) or not classes_data:
        raise read.fail("classes", "expected a mapping of class name -> class", classes_data)
    classes = []
    for class_name, value in classes_data.items():
        field = f"classes.{class_name}"
        if not isinstance(class_name, str) or not class_name:
            raise read.fail(field, "a class name must be a non-empty string", class_name)
        data_k = read.mapping(value, field, _CLASS_FIELDS, {"share", "prompt_tokens", "output_tokens", "slo"})
        classes.append(RequestClass(
            name=class_name,
            share=read.number(data_k["share"], f"{field}.share", 0, 1, low_open=True),
            prompt=read.distribution(data_k["prompt_tokens"], f"{field}.prompt_tokens"),
            output=read.distribution(data_k["output_tokens"], f"{field}.output_tokens"),
            slo=read.slo(data_k["slo"], f"{field}.slo"),
            description=read.text(data_k.get("description", ""), f"{field}.description"),
        ))
    total = sum(k.share for k in classes)
    if abs(total - 1.0) > SHARE_TOLERANCE:
        shares = " + ".join(f"{k.share:g}" for k in classes)
        raise read.fail("classes.*.share", f"shares must sum to 1, they sum to {total:g} ({shares})")
    max_len = top.get("max_model_len")
    if max_len is not None:
        max_len = read.integer(max_len, "max_model_len", 2, MAX_TOKENS)
    return Scenario(name, tuple(classes), source, read.text(top.get("description", ""), "description"), max_len)


def yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong with a YAML file, for one error line: where (when PyYAML knows) and PyYAML's problem."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark is not None else ""
    return f"not valid YAML{where}: {getattr(exc, 'problem', None) or exc}"


def load_scenario(path: str | Path | None = None) -> Scenario:
    """The scenario file at ``path`` (None: the built-in production mix)."""
    path = Path(path) if path is not None else DEFAULT_SCENARIO
    try:
        text = path.read_text()
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the scenario file: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: {yaml_problem(exc)}") from None
    return parse_scenario(data, str(path))
