"""Score calibration: does each unit's published score tell the wait a request then really has there?

Through the edge (it names the chosen unit and how the pick saw it in answer headers: ``X-Eas-IU``,
``X-Eas-Score``, ``X-Eas-Expected-S``, ``X-Eas-Prefill-S``, edge/proxy.py ``routing_headers``), a mixed
load is sent (:mod:`operate.loadgen`, open loop) and for every answered request:

- predicted wait: what the pick believed the request would wait in that unit's queue: its predicted TTFT
  minus its own prefill there (``X-Eas-Expected-S - X-Eas-Prefill-S``: the published score plus the work
  this edge sent since the score was written); the bare score when the edge gave no prediction;
- measured wait: its TTFT minus its own prefill at the pool's reference prefill rate (``prefill_tps``
  given, else the median over units of the rates they publish: one unit publishing a wrong rate cannot
  move the median of three or more).

A request the edge moved to another unit before its first byte (``X-Eas-Tried`` above 1: the first unit
went silent or failed) is counted as rerouted and left out: its TTFT began at another unit, and charging it
to the unit that answered would flag an honest unit for a misleading one's wait.

Per unit: bias (mean predicted - measured: negative = the unit looks less loaded than it is, so it draws
more than its share), mean absolute error, the correlation of predicted with measured, and the scale (mean
predicted / mean measured). A unit is flagged when both its bias is off the pool's median bias by more than
:data:`BIAS_FLOOR_S` and its scale is off the pool's median scale by more than a factor
:data:`SCALE_LIMIT` beyond the scale's own sampling error (what every unit shares, such as a common
prefill-rate error or the edge-to-unit hop, is not the unit's fault; waits vary a lot from request to
request, so a unit is compared in aggregate, and a ratio does not grow with the load the way an absolute
error does). The sampling error is the standard error of the log of the scale (a ratio of two means: the
delta method), and the scale must be off by more than the limit at the near end of its one-sided 95%
interval (:data:`Z_ONE_SIDED_95` standard errors): a few dozen answers of an honest unit, queued behind
bursts its stale score drew, scatter its scale by more than 1.5x on their own. A unit is also flagged when its
predictions do not follow its waits: its correlation below :data:`MIN_CORRELATION` at the far end of its
one-sided 95% interval (Fisher's z, :func:`correlation_at_most`) while its waits vary by more than
:data:`MIN_WAIT_SPREAD_S`. Every unit's correlation falls when the host starves the pool of CPU (the waits gain
stalls no score foresees): 0.19 from 161 answers may be 0.31 in truth, noise about the limit, where a unit
scoring at random is far below it.

A unit not flagged is cleared only when its answers could have flagged it: at its standard error, a unit whose
scale were off by ``detect_scale`` (default :data:`DETECT_SCALE`) would be flagged with 99% power
(:func:`max_log_se`). Otherwise, and with
fewer than :data:`MIN_SAMPLES` clean answers, its verdict is "insufficient evidence", with the clean answers it
needs (the standard error shrinks as one over the root of their count), never a silent pass: under load more
answers are rerouted and left out, and a fixed request count then says less. :func:`run` keeps sending, in
rounds of half what the undecided units need, given their share of the clean answers, until every unit is
decided or ``max_requests`` were sent.

Circuit breaker (:func:`breaker_share`): while a unit is in maintenance (or scored out), the requests the
edge sends it are counted: the check passes only at zero.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from rich.console import Group
from rich.table import Table
from rich.text import Text

from common.errors import ClusterctlError, ExitCode
from consul_io.client import ConsulIO
from operate.loadgen import Generator, Outcome, plan
from operate.scenario import Scenario

BIAS_FLOOR_S = 0.05
SCALE_LIMIT = 1.5
MIN_CORRELATION = 0.3
MIN_WAIT_SPREAD_S = 0.05
MIN_SAMPLES = 20
Z_ONE_SIDED_95 = 1.645
DETECT_SCALE = 2.5  # a unit whose scale is off the pool's by this factor must not pass for lack of answers
Z_POWER_99 = 2.326
MIN_ROUND = 50  # requests: a round smaller than this costs its ramp for little
# A further round sends this share of what :func:`more_requests` estimates the undecided units lack: the estimate
# rests on the standard errors of the answers so far, themselves noisy when few and heavy-tailed, so a unit is
# judged again halfway instead of being sent the whole estimate at once.
ROUND_SHARE = 0.5


def max_log_se(detect_scale: float = DETECT_SCALE) -> float:
    """The largest standard error of log(scale) at which a unit off the pool's scale by ``detect_scale`` is
    flagged with 99% power: its estimate, normal around the truth, beyond the limit by the one-sided 95% margin."""
    return (math.log(detect_scale) - math.log(SCALE_LIMIT)) / (Z_ONE_SIDED_95 + Z_POWER_99)


@dataclass(frozen=True)
class Sample:
    unit: str
    score_s: float | None
    predicted_s: float
    wait_s: float
    prompt_tokens: int


@dataclass(frozen=True)
class UnitCalibration:
    unit: str
    samples: int
    mean_score_s: float | None
    mean_predicted_s: float
    mean_wait_s: float
    bias_s: float
    mae_s: float
    correlation: float | None
    scale: float | None = None  # mean predicted / mean measured wait (None: no measured wait)
    flags: tuple[str, ...] = ()
    log_se: float = 0.0  # the standard error of log(scale) (:func:`log_scale_se`)
    needs: int = 0  # clean answers a unit not flagged needs for a verdict (0: decided)

    @property
    def undecided(self) -> bool:
        return not self.flags and self.needs > 0

    @property
    def verdict(self) -> str:
        return "misleads" if self.flags else "insufficient evidence" if self.undecided else "ok"

    def as_dict(self) -> dict:
        def r(v):
            return None if v is None else round(v, 4)

        return {"unit": self.unit, "samples": self.samples, "mean_score_s": r(self.mean_score_s),
                "mean_predicted_wait_s": r(self.mean_predicted_s), "mean_measured_wait_s": r(self.mean_wait_s),
                "bias_s": r(self.bias_s), "mae_s": r(self.mae_s), "correlation": r(self.correlation),
                "scale": r(self.scale), "log_scale_se": r(self.log_se), "verdict": self.verdict,
                "needs_samples": self.needs, "flags": list(self.flags)}


@dataclass(frozen=True)
class BreakerCheck:
    unit: str
    requests: int
    sent_to_unit: int

    @property
    def passed(self) -> bool:
        return self.requests > 0 and self.sent_to_unit == 0


@dataclass
class Calibration:
    endpoint: str
    reference_prefill_tps: float
    units: list[UnitCalibration]
    samples_by_unit: dict[str, list[Sample]]
    requests: int
    unrouted: int  # answered without the edge's headers, or failed
    rerouted: int = 0  # answered by a unit other than the first tried: left out of every unit's samples
    rounds: int = 1  # batches sent (:func:`run` sends more while a unit is undecided)
    breaker: BreakerCheck | None = None
    errors: Counter = field(default_factory=Counter)

    @property
    def flagged(self) -> list[str]:
        return [u.unit for u in self.units if u.flags]

    @property
    def undecided(self) -> list[str]:
        return [u.unit for u in self.units if u.undecided]

    @property
    def passed(self) -> bool:
        return not self.flagged and not self.undecided and (self.breaker is None or self.breaker.passed)

    def as_dict(self) -> dict:
        breaker = None if self.breaker is None else {
            "unit": self.breaker.unit, "requests": self.breaker.requests,
            "sent_to_unit": self.breaker.sent_to_unit, "passed": self.breaker.passed}
        return {"endpoint": self.endpoint, "reference_prefill_tps": round(self.reference_prefill_tps, 1),
                "requests": self.requests, "rounds": self.rounds, "unrouted": self.unrouted, "rerouted": self.rerouted,
                "errors": dict(self.errors), "units": [u.as_dict() for u in self.units], "flagged": self.flagged,
                "undecided": self.undecided, "breaker": breaker,
                "passed": self.passed}

    def render(self) -> Group:
        table = Table(title=f"score calibration ({self.endpoint}, reference prefill "
                            f"{self.reference_prefill_tps:,.0f} tokens/s)", title_justify="left")
        for name in ("unit", "requests", "score ms", "predicted wait ms", "measured wait ms", "bias ms",
                     "MAE ms", "corr", "scale", "verdict"):
            table.add_column(name, justify="left" if name in ("unit", "verdict") else "right")
        for u in self.units:
            verdict = (Text("misleads: " + ", ".join(u.flags), style="red") if u.flags else
                       Text(f"insufficient evidence: needs ~{u.needs} clean answers", style="yellow") if u.undecided
                       else Text("ok", style="green"))
            table.add_row(u.unit, str(u.samples), "-" if u.mean_score_s is None else f"{u.mean_score_s * 1000:,.0f}",
                          f"{u.mean_predicted_s * 1000:,.0f}", f"{u.mean_wait_s * 1000:,.0f}",
                          f"{u.bias_s * 1000:+,.0f}", f"{u.mae_s * 1000:,.0f}",
                          "-" if u.correlation is None else f"{u.correlation:.2f}",
                          "-" if u.scale is None else f"{u.scale:.2f}", verdict)
        lines = [table]
        if self.breaker is not None:
            b = self.breaker
            style = "green" if b.passed else "red"
            lines.append(Text(f"circuit breaker: {b.unit} got {b.sent_to_unit} of {b.requests} requests while out "
                              f"of rotation: {'passed' if b.passed else 'FAILED'}", style=style))
        flagged = self.flagged
        undecided = self.undecided
        lines.append(Text(f"{len(flagged)} of {len(self.units)} units flagged" +
                          (f": {', '.join(flagged)}" if flagged else "") +
                          (f"; {len(undecided)} undecided (insufficient evidence): {', '.join(undecided)}"
                           if undecided else "") +
                          (f"; {self.unrouted} requests failed or unrouted" if self.unrouted else "") +
                          (f"; {self.rerouted} rerouted before their first byte (left out)" if self.rerouted
                           else "")))
        return Group(*lines)


def _correlation(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 3 or statistics.pstdev(xs) == 0 or statistics.pstdev(ys) == 0:
        return None
    return statistics.correlation(xs, ys)


def reference_rate(outcomes: list[Outcome]) -> float | None:
    """The median over units of the prefill rate each publishes (prompt tokens / the edge's prefill seconds)."""
    per_unit: dict[str, list[float]] = {}
    for o in outcomes:
        if o.iu and o.prefill_s:
            per_unit.setdefault(o.iu, []).append(o.prompt_tokens / o.prefill_s)
    rates = [statistics.median(v) for v in per_unit.values()]
    return statistics.median(rates) if rates else None


def correlation_at_most(correlation: float, samples: int) -> float:
    """The upper end of the one-sided 95% interval of a correlation from ``samples`` pairs (Fisher's z)."""
    if samples <= 3:
        return 1.0
    z = math.atanh(max(-0.999999, min(correlation, 0.999999)))
    return math.tanh(z + Z_ONE_SIDED_95 / math.sqrt(samples - 3))


def rerouted(outcome: Outcome) -> bool:
    return outcome.tried is not None and outcome.tried > 1


def samples_of(outcomes: list[Outcome], prefill_tps: float) -> dict[str, list[Sample]]:
    by_unit: dict[str, list[Sample]] = {}
    for o in outcomes:
        if not o.ok or o.iu is None or o.ttft_s is None or rerouted(o):
            continue
        if o.expected_s is not None and o.prefill_s is not None:
            predicted = max(0.0, o.expected_s - o.prefill_s)
        elif o.score is not None:
            predicted = o.score
        else:
            continue
        wait = max(0.0, o.ttft_s - o.prompt_tokens / prefill_tps)
        by_unit.setdefault(o.iu, []).append(Sample(o.iu, o.score, predicted, wait, o.prompt_tokens))
    return by_unit


def log_scale_se(samples: list[Sample]) -> float:
    """The standard error of log(mean predicted / mean measured) over ``samples`` (the delta method for a
    ratio of means, with the covariance of the pairs); 0 when it cannot be estimated."""
    n = len(samples)
    predicted, waits = [s.predicted_s for s in samples], [s.wait_s for s in samples]
    if n < 3:
        return 0.0
    mp, mw = statistics.fmean(predicted), statistics.fmean(waits)
    if mp <= 0 or mw <= 0:
        return 0.0
    variance = (statistics.variance(predicted) / mp ** 2 + statistics.variance(waits) / mw ** 2
                - 2 * statistics.covariance(predicted, waits) / (mp * mw)) / n
    return math.sqrt(max(variance, 0.0))


def needed_samples(samples: int, log_se: float, detect_scale: float = DETECT_SCALE) -> int:
    """Clean answers a unit with ``samples`` at standard error ``log_se`` needs for a verdict (0: it has them)."""
    if samples < MIN_SAMPLES:
        return MIN_SAMPLES
    limit = max_log_se(detect_scale)
    if log_se <= limit:
        return 0
    return math.ceil(samples * (log_se / limit) ** 2)


def judge(by_unit: dict[str, list[Sample]], detect_scale: float = DETECT_SCALE) -> list[UnitCalibration]:
    """Per unit numbers, flags and what an undecided unit needs (module docstring)."""
    rows = []
    for unit, samples in sorted(by_unit.items()):
        predicted = [s.predicted_s for s in samples]
        waits = [s.wait_s for s in samples]
        scores = [s.score_s for s in samples if s.score_s is not None]
        errors = [p - w for p, w in zip(predicted, waits, strict=True)]
        mean_wait = statistics.fmean(waits)
        rows.append(UnitCalibration(unit, len(samples), statistics.fmean(scores) if scores else None,
                                    statistics.fmean(predicted), mean_wait, statistics.fmean(errors),
                                    statistics.fmean(abs(e) for e in errors), _correlation(predicted, waits),
                                    statistics.fmean(predicted) / mean_wait if mean_wait > 0 else None,
                                    log_se=log_scale_se(samples)))
    judged = [r for r in rows if r.samples >= MIN_SAMPLES]
    median_bias = statistics.median(r.bias_s for r in judged) if judged else 0.0
    scales = [r.scale for r in judged if r.scale is not None]
    median_scale = statistics.median(scales) if scales else None
    out = []
    for r in rows:
        flags = []
        if r.samples >= MIN_SAMPLES:
            off_scale = (r.scale is None or median_scale is None or median_scale <= 0 or r.scale <= 0
                         or abs(math.log(r.scale / median_scale)) - Z_ONE_SIDED_95 * r.log_se > math.log(SCALE_LIMIT))
            if abs(r.bias_s - median_bias) > BIAS_FLOOR_S and off_scale:
                direction = "reads low" if r.bias_s < median_bias else "reads high"
                scale = "-" if r.scale is None else f"{r.scale:.2f}"
                pool = "-" if median_scale is None else f"{median_scale:.2f}"
                flags.append(f"{direction}: bias {(r.bias_s - median_bias) * 1000:+,.0f} ms, scale {scale} vs pool "
                             f"{pool}")
            spread = statistics.pstdev(s.wait_s for s in by_unit[r.unit])
            at_most = None if r.correlation is None else correlation_at_most(r.correlation, r.samples)
            if spread > MIN_WAIT_SPREAD_S and (at_most is None or at_most < MIN_CORRELATION):
                flags.append("does not follow its waits" if r.correlation is None else
                             f"correlation {r.correlation:.2f} (at most {at_most:.2f})")
        needs = 0 if flags else needed_samples(r.samples, r.log_se, detect_scale)
        out.append(replace(r, flags=tuple(flags), needs=needs))
    return out


def calibration_of(endpoint: str, outcomes: list[Outcome], prefill_tps: float | None = None,
                   detect_scale: float = DETECT_SCALE) -> Calibration:
    routed = [o for o in outcomes if o.ok and o.iu is not None]
    if outcomes and not any(o.iu for o in outcomes):
        raise ClusterctlError(f"{endpoint}: no answer named its unit (no X-Eas-IU header): calibration needs the "
                              f"EAS edge as --endpoint, running with debug_headers: true (its routing headers "
                              f"name internal units and scores, so they are off by default)", ExitCode.USAGE)
    rate = prefill_tps or reference_rate(routed)
    if not rate:
        raise ClusterctlError(f"{endpoint}: the edge gave no prefill estimate (X-Eas-Prefill-S) and no "
                              f"--prefill-tps was given", ExitCode.USAGE)
    by_unit = samples_of(routed, rate)
    errors = Counter(o.error for o in outcomes if not o.ok)
    return Calibration(endpoint, rate, judge(by_unit, detect_scale), by_unit, len(outcomes), len(outcomes) - len(routed),
                       sum(1 for o in routed if rerouted(o)), errors=errors)


async def drive(endpoint: str, scenario: Scenario, rate: float, requests: int, *, seed: int = 1,
                model: str | None = None, timeout_s: float = 60.0, api_key: str | None = None) -> list[Outcome]:
    """``requests`` requests of the scenario's mix at ``rate`` per second (Poisson), through ``endpoint``
    (``api_key``: the client key an edge with ``client_keys`` wants)."""
    from operate.loadtest import probe

    model = model or await probe(endpoint, api_key)
    planned = plan(scenario, rate, requests / rate * 1.5 + 10, seed)[:requests]
    return await Generator(endpoint, model, timeout_s, seed, api_key).run(planned)


def more_requests(result: Calibration) -> int:
    """Requests likely to bring every undecided unit the clean answers it needs: what each lacks over its share
    of the requests sent so far (as many as were sent for a unit with no answer yet), the largest, a tenth more."""
    wanted = 0.0
    for u in result.units:
        if u.undecided:
            share = u.samples / result.requests if result.requests else 0.0
            wanted = max(wanted, (u.needs - u.samples) / share if share > 0 else result.requests)
    return math.ceil(wanted * 11 / 10)


def run(endpoint: str, scenario: Scenario, rate: float, requests: int = 1000, *, max_requests: int | None = None,
        prefill_tps: float | None = None, detect_scale: float = DETECT_SCALE, seed: int = 1,
        progress: Callable[[str], None] | None = None, **kwargs) -> Calibration:
    """``requests`` requests, then more rounds (:data:`ROUND_SHARE` of :func:`more_requests`, at least
    :data:`MIN_ROUND`) while a unit is undecided, up to ``max_requests`` in all (None: 3 x ``requests``); each
    round its own seed."""
    limit = 3 * requests if max_requests is None else max(max_requests, requests)
    outcomes = asyncio.run(drive(endpoint, scenario, rate, requests, seed=seed, **kwargs))
    result = calibration_of(endpoint, outcomes, prefill_tps, detect_scale)
    while result.undecided and len(outcomes) < limit:
        extra = min(max(math.ceil(more_requests(result) * ROUND_SHARE), MIN_ROUND), limit - len(outcomes))
        if progress:
            progress(f"insufficient evidence for {', '.join(result.undecided)}: {extra} more requests")
        outcomes += asyncio.run(drive(endpoint, scenario, rate, extra, seed=seed + 1000 * result.rounds, **kwargs))
        rounds = result.rounds + 1
        result = calibration_of(endpoint, outcomes, prefill_tps, detect_scale)
        result.rounds = rounds
    return result


def breaker_share(endpoint: str, scenario: Scenario, unit: str, rate: float, requests: int, **kwargs) -> BreakerCheck:
    """Requests sent while ``unit`` is out of rotation (the caller put it there): how many reached it."""
    outcomes = asyncio.run(drive(endpoint, scenario, rate, requests, **kwargs))
    return BreakerCheck(unit, sum(1 for o in outcomes if o.iu is not None),
                        sum(1 for o in outcomes if o.iu == unit))


def routable_units(endpoint: str) -> int | None:
    """The edge's count of routable units (its ``/healthz``), None when it does not say."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(endpoint + "/healthz", timeout=3) as answer:
            return json.load(answer).get("routable_ius")
    except urllib.error.HTTPError as exc:
        try:
            return json.loads(exc.read()).get("routable_ius")
        except ValueError:
            return None
    except (OSError, ValueError):
        return None


@contextmanager
def out_of_rotation(io: ConsulIO, unit: str, endpoint: str, settle_s: float = 15.0):
    """``unit`` in Consul maintenance for the block, once the edge counts one routable unit fewer (or after
    ``settle_s``: the check then measures an edge that did not notice, and fails if traffic reaches it)."""
    before = routable_units(endpoint)
    io.service_maintenance(unit, True, "clusterctl edge calibrate: circuit-breaker check")
    try:
        deadline = time.monotonic() + settle_s
        while before is not None and time.monotonic() < deadline:
            now = routable_units(endpoint)
            if now is not None and now < before:
                break
            time.sleep(0.1)
        yield
    finally:
        io.service_maintenance(unit, False)
