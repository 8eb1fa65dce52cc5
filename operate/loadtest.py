"""A load test: a scenario's mix sent open-loop at a rate (or a sweep of rates) and judged against its SLOs.

The function a caller (the CLI, the demo) uses is :func:`run` (one rate) or :func:`sweep` (ascending rates
until one misses: the highest rate that met every SLO is the goodput); each returns a result whose
``render()`` is the verdict table and whose ``passed`` says whether every SLO was met.

Ctrl-C (SIGINT) stops sending: requests in flight are abandoned and the result covers what had finished,
marked ``interrupted``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass, field

import aiohttp
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from common.errors import ClusterctlError, ExitCode
from operate import stats
from operate.loadgen import Generator, Outcome, plan, request_headers
from operate.scenario import Scenario

PROBE_TIMEOUT = aiohttp.ClientTimeout(total=5.0)


@dataclass
class Result:
    scenario: Scenario
    endpoint: str
    rate: float
    duration_s: float
    outcomes: list[Outcome]
    elapsed_s: float
    planned: int
    interrupted: bool = False
    utilisation: dict | None = None  # operate.utilisation.summary, when the agents' data was read
    utilisation_samples: list = field(default_factory=list)
    min_samples: int = stats.MIN_SAMPLES  # a class with fewer requests is judged "too few"

    def __post_init__(self):
        self.by_class = stats.class_stats(self.outcomes, self.scenario, self.elapsed_s)
        self.verdicts = stats.verdicts(self.by_class, self.scenario, self.min_samples)
        self.lag = stats.lag_summary(self.outcomes)

    @property
    def passed(self) -> bool:
        return not self.interrupted and stats.all_met(self.verdicts)

    @property
    def missed(self) -> bool:
        """Some SLO judged and not met (a class with too few requests is not judged)."""
        return any(v.verdict == stats.MISSED for v in self.verdicts)

    def as_dict(self) -> dict:
        return {"scenario": self.scenario.name, "scenario_file": self.scenario.source, "endpoint": self.endpoint,
                "rate_per_s": self.rate, "duration_s": self.duration_s, "elapsed_s": round(self.elapsed_s, 3),
                "planned": self.planned, "finished": len(self.outcomes), "interrupted": self.interrupted,
                "passed": self.passed, "generator_lag": self.lag,
                "classes": {k: s.as_dict() for k, s in self.by_class.items()},
                "slo": [v.as_dict() for v in self.verdicts], "utilisation": self.utilisation}

    def render(self) -> Group:
        return Group(verdict_table(self), Text(summary_line(self)))


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return "inf" if value == float("inf") else f"{value * 1000:,.0f}"


def verdict_table(result: Result) -> Table:
    title = f"{result.scenario.name} at {result.rate:g} req/s for {result.duration_s:g} s ({result.endpoint})"
    table = Table(title=title + (" (interrupted: partial results)" if result.interrupted else ""),
                  title_justify="left")
    for name in ("class", "reqs", "errors", "TTFT p50/p90/p99 ms", "ITL p50/p99 ms", "E2E p50/p99 ms",
                 "SLO", "p99 ms", "verdict"):
        table.add_column(name, justify="left" if name in ("class", "SLO", "verdict", "errors") else "right")
    by_class_verdicts: dict[str, list[stats.SloVerdict]] = {}
    for v in result.verdicts:
        by_class_verdicts.setdefault(v.klass, []).append(v)
    for name, s in result.by_class.items():
        lat = s.latency
        errors = ", ".join(f"{k} {n}" for k, n in sorted(s.errors.items())) or "0"
        ttft = "/".join(_ms(lat["ttft"][q]) for q in (50, 90, 99))
        itl = "/".join(_ms(lat["itl"][q]) for q in (50, 99))
        e2e = "/".join(_ms(lat["e2e"][q]) for q in (50, 99))
        rows = by_class_verdicts.get(name) or [None]
        for i, v in enumerate(rows):
            cells = [name, str(s.requests), errors, ttft, itl, e2e] if i == 0 else ["", "", "", "", "", ""]
            if v is None:
                table.add_row(*cells, "-", "-", "-")
                continue
            style = "green" if v.met else ("yellow" if v.verdict == stats.TOO_FEW else "red")
            table.add_row(*cells, f"{v.metric} p99 <= {v.limit_s * 1000:,.0f}", _ms(v.p99_s),
                          Text(v.verdict, style=style))
    return table


def summary_line(result: Result) -> str:
    met = sum(v.met for v in result.verdicts)
    lag = result.lag["p99_s"]
    parts = [f"{met} of {len(result.verdicts)} SLOs met", f"{len(result.outcomes)} of {result.planned} requests "
             f"finished", f"generator lag p99 {_ms(lag)} ms"]
    if result.utilisation and result.utilisation.get("mean_pct") is not None:
        parts.append(f"GPU utilisation mean {result.utilisation['mean_pct']}% (variance across units "
                     f"{result.utilisation['variance_pct2']})")
    return "; ".join(parts) + (": PASSED" if result.passed else ": NOT MET")


@dataclass
class SweepResult:
    results: list[Result]
    stopped_early: bool = False  # a rate missed, so the higher ones were not run

    @property
    def goodput(self) -> float | None:
        met = [r.rate for r in self.results if r.passed]
        return max(met) if met else None

    @property
    def passed(self) -> bool:
        return self.goodput is not None and not any(r.interrupted for r in self.results)

    def as_dict(self) -> dict:
        return {"goodput_per_s": self.goodput, "stopped_early": self.stopped_early,
                "runs": [r.as_dict() for r in self.results]}

    def render(self) -> Group:
        table = Table(title="rate sweep", title_justify="left")
        for name in ("rate req/s", "requests", "errors", "SLOs met", "verdict"):
            table.add_column(name, justify="right" if name != "verdict" else "left")
        for r in self.results:
            errors = sum(sum(s.errors.values()) for s in r.by_class.values())
            met = sum(v.met for v in r.verdicts)
            verdict = ("met", "green") if r.passed else ("not met", "red") if r.missed else ("too few", "yellow")
            table.add_row(f"{r.rate:g}", str(len(r.outcomes)), str(errors), f"{met}/{len(r.verdicts)}",
                          Text(verdict[0], style=verdict[1]))
        goodput = self.goodput
        line = (f"goodput: {goodput:g} req/s (the highest rate at which every class met its SLOs)" if goodput
                is not None else "goodput: none of the rates met every SLO")
        return Group(*(r.render() for r in self.results), table, Text(line))


async def probe(endpoint: str, api_key: str | None = None) -> str | None:
    """The served model's name from ``GET /v1/models`` (None when the answer names none); a
    :class:`ClusterctlError` (exit 2) when the endpoint cannot be reached: nothing was sent."""
    url = endpoint.rstrip("/") + "/v1/models"
    try:
        async with (aiohttp.ClientSession(timeout=PROBE_TIMEOUT) as session,
                    session.get(url, headers=request_headers(api_key)) as answer):
            if answer.status != 200:
                raise ClusterctlError(f"{endpoint}: GET /v1/models answered HTTP {answer.status}; is this an "
                                      f"OpenAI-compatible endpoint?", ExitCode.USAGE)
            data = await answer.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise ClusterctlError(f"{endpoint}: unreachable ({type(exc).__name__}: {exc or 'no answer'}); "
                              f"check --endpoint", ExitCode.USAGE) from None
    models = data.get("data") if isinstance(data, dict) else None
    return models[0].get("id") if models and isinstance(models[0], dict) else None


class Progress:
    """A live line while a run sends (rich: redrawn on a terminal, silent elsewhere)."""

    def __init__(self, console: Console | None, generator: Generator, planned: int, rate: float, duration_s: float):
        self.console, self.generator, self.planned = console, generator, planned
        self.rate, self.duration_s = rate, duration_s
        self.done = self.errors = 0
        self.live: Live | None = None

    def on_done(self, outcome: Outcome) -> None:
        self.done += 1
        self.errors += not outcome.ok

    def __rich__(self) -> Text:
        started = self.generator.started
        elapsed = time.monotonic() - started if started is not None else 0.0  # loop.time() is monotonic
        ttfts = sorted(o.ttft_s for o in self.generator.outcomes if o.ok and o.ttft_s is not None)
        p99 = stats.percentile(ttfts, 99)
        return Text(f"{self.rate:g} req/s  {min(elapsed, self.duration_s):5.1f}/{self.duration_s:g} s  "
                    f"finished {self.done}/{self.planned}  in flight {self.generator.inflight}  "
                    f"errors {self.errors}  TTFT p99 so far {_ms(p99)} ms")

    def __enter__(self) -> Progress:
        if self.console is not None and self.console.is_terminal:
            self.live = Live(self, console=self.console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)


async def run_async(endpoint: str, scenario: Scenario, rate: float, duration_s: float, *, seed: int = 1,
                    model: str | None = None, timeout_s: float = 60.0, console: Console | None = None,
                    sampler=None, check_endpoint: bool = True, min_samples: int = stats.MIN_SAMPLES,
                    api_key: str | None = None) -> Result:
    if check_endpoint:
        served = await probe(endpoint, api_key)
        model = model or served
    planned = plan(scenario, rate, duration_s, seed)
    generator = Generator(endpoint, model, timeout_s, seed, api_key)
    loop = asyncio.get_running_loop()
    interrupted = False

    def on_sigint() -> None:
        nonlocal interrupted
        interrupted = True
        generator.stop()

    handled = False
    with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread: no signal handler
        loop.add_signal_handler(signal.SIGINT, on_sigint)
        handled = True
    if sampler is not None:
        sampler.start()
    started = time.monotonic()
    try:
        with Progress(console, generator, len(planned), rate, duration_s) as progress:
            outcomes = await generator.run(planned, progress.on_done)
    finally:
        if handled:
            loop.remove_signal_handler(signal.SIGINT)
        if sampler is not None:
            sampler.stop()
    elapsed = time.monotonic() - started
    util = util_samples = None
    if sampler is not None:
        from operate.utilisation import summary

        util_samples = list(sampler.samples)
        util = summary(util_samples) if util_samples else None
    return Result(scenario, endpoint, rate, duration_s, list(outcomes), elapsed, len(planned),
                  interrupted or generator.stopped, util, util_samples or [], min_samples)


def run(endpoint: str, scenario: Scenario, rate: float, duration_s: float, **kwargs) -> Result:
    """One load test at ``rate`` requests/s for ``duration_s`` (keywords: :func:`run_async`)."""
    return asyncio.run(run_async(endpoint, scenario, rate, duration_s, **kwargs))


def sweep(endpoint: str, scenario: Scenario, rates: list[float], duration_s: float, **kwargs) -> SweepResult:
    """Each rate in ascending order for ``duration_s``; stops at the first rate that misses an SLO (higher
    rates only load the cluster more; a rate with a class too small to judge goes on) or at Ctrl-C."""
    results: list[Result] = []
    sampler_factory = kwargs.pop("sampler_factory", None)
    kwargs["model"] = kwargs.get("model") or asyncio.run(probe(endpoint, kwargs.get("api_key")))
    for i, rate in enumerate(sorted(rates)):
        sampler = sampler_factory() if sampler_factory is not None else None
        result = run(endpoint, scenario, rate, duration_s, sampler=sampler, check_endpoint=False, **kwargs)
        results.append(result)
        if result.interrupted:
            return SweepResult(results)
        if result.missed:
            return SweepResult(results, stopped_early=i < len(rates) - 1)
    return SweepResult(results)
