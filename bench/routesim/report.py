"""Summaries of runs, the stdout tables, the target check and the PNG plot."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from rich.console import Console
from rich.table import Table
from verdict import shown  # bench/ (on the path of every script and test that imports routesim)

from .sim import RunResult


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class Summary:
    label: str
    load: float
    requests: int
    ttft_p50_ms: float
    ttft_p95_ms: float
    ttft_p99_ms: float
    wait_p99_ms: float
    e2e_p50_s: float
    e2e_p99_s: float
    iu_p99_spread_ms: float  # max - min over IUs of each IU's own P99 TTFT
    util_max: float  # compute share used, busiest IU
    util_min: float
    busy_min: float  # least busy IU's share of time executing steps (NVML-style utilization; ~1 under load)
    preemptions: int
    consul_writes_per_s: float | None
    consul_writes_per_node_s: float | None
    ttft_p99_short_ms: float  # class A only: short prompts, the ones head-of-line blocking hurts most
    misled: dict | None = None  # score-based policies: see runner.misled_share


def summarize(result: RunResult, load: float) -> Summary:
    records = result.records
    ttft = [r.ttft for r in records]
    per_iu: dict[int, list[float]] = {}
    for r in records:
        per_iu.setdefault(r.iu, []).append(r.ttft)
    iu_p99 = [percentile(v, 99) for v in per_iu.values()]
    writes = result.consul_writes
    return Summary(
        label=result.label, load=load, requests=len(records),
        ttft_p50_ms=1e3 * percentile(ttft, 50), ttft_p95_ms=1e3 * percentile(ttft, 95),
        ttft_p99_ms=1e3 * percentile(ttft, 99), wait_p99_ms=1e3 * percentile([r.queue_wait for r in records], 99),
        e2e_p50_s=percentile([r.e2e for r in records], 50), e2e_p99_s=percentile([r.e2e for r in records], 99),
        iu_p99_spread_ms=1e3 * (max(iu_p99) - min(iu_p99)) if iu_p99 else math.nan,
        util_max=max(result.compute_fraction), util_min=min(result.compute_fraction),
        busy_min=min(result.busy_fraction),
        preemptions=result.preemptions,
        consul_writes_per_s=None if writes is None else writes / result.window_s,
        consul_writes_per_node_s=None if writes is None else writes / result.window_s / result.nodes,
        ttft_p99_short_ms=1e3 * percentile([r.ttft for r in records if r.klass == "A"], 99),
        misled=result.extra.get("misled"),
    )


def as_json(summaries: list[Summary]) -> list[dict]:
    return [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(s).items()} for s in summaries]


@dataclass(frozen=True)
class SeedRows:
    """Every table's rows of one seed (each seed: its own arrival traces and tie-break seeds)."""

    seed: int
    main: list[Summary]
    edges: list[Summary]
    staleness: list[Summary]
    before: list[Summary]


def _mean(values: list):
    present = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not present:
        return values[0]
    mean = sum(present) / len(present)
    return round(mean) if all(isinstance(v, int) for v in present) else mean


def mean_summary(rows: list[Summary]) -> Summary:
    """One row whose every number is the mean over seeds of the same row (label and load must agree)."""
    first = rows[0]
    if any(r.label != first.label or r.load != first.load for r in rows):
        raise ValueError(f"rows of different scenarios: {sorted({(r.label, r.load) for r in rows})}")
    values = {}
    for name, value in asdict(first).items():
        if name in ("label", "load"):
            values[name] = value
        elif name == "misled":
            dicts = [r.misled for r in rows if r.misled and r.misled.get("long_waits")]
            values[name] = {k: _mean([d[k] for d in dicts]) for k in dicts[0]} if dicts else first.misled
        else:
            values[name] = _mean([getattr(r, name) for r in rows])
    return Summary(**values)


def mean_rows(per_seed: list[SeedRows]) -> SeedRows:
    """The tables' rows averaged over seeds (every seed runs the same scenarios in the same order)."""
    def rows(name: str) -> list[Summary]:
        return [mean_summary(list(group)) for group in zip(*(getattr(r, name) for r in per_seed), strict=True)]
    return SeedRows(-1, rows("main"), rows("edges"), rows("staleness"), rows("before"))


def _fmt(value: float | None, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def main_table(summaries: list[Summary], title: str) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for name in ("load", "policy", "TTFT p50", "p95", "p99", "p99 A", "wait p99", "E2E p50", "p99",
                 "IU p99 spread", "util max/min", "preempt", "Consul w/s"):
        table.add_column(name, justify="left" if name == "policy" else "right")
    previous = None
    for s in summaries:
        if previous is not None and s.load != previous:
            table.add_section()
        previous = s.load
        table.add_row(f"{s.load:.0%}", s.label, _fmt(s.ttft_p50_ms), _fmt(s.ttft_p95_ms), _fmt(s.ttft_p99_ms),
                      _fmt(s.ttft_p99_short_ms), _fmt(s.wait_p99_ms), _fmt(s.e2e_p50_s, 2), _fmt(s.e2e_p99_s, 2),
                      _fmt(s.iu_p99_spread_ms), f"{s.util_max:.2f}/{s.util_min:.2f}", str(s.preemptions),
                      _fmt(s.consul_writes_per_s, 1))
    return table


def sensitivity_table(summaries: list[Summary], oracle: Summary | None, title: str) -> Table:
    table = Table(title=title, title_justify="left", header_style="bold")
    for name in ("variant", "TTFT p50", "p95", "p99", "p99 / oracle", "wait p99", "Consul w/s"):
        table.add_column(name, justify="left" if name == "variant" else "right")
    for s in summaries:
        ratio = s.ttft_p99_ms / oracle.ttft_p99_ms if oracle else math.nan
        table.add_row(s.label, _fmt(s.ttft_p50_ms), _fmt(s.ttft_p95_ms), _fmt(s.ttft_p99_ms), _fmt(ratio, 2),
                      _fmt(s.wait_p99_ms), _fmt(s.consul_writes_per_s, 1))
    return table


@dataclass(frozen=True)
class TargetCheck:
    """A target (``limit`` set: printed met / NOT met) or a reference number (``limit`` None: no verdict)."""

    name: str
    value: float
    limit: float | None

    @property
    def met(self) -> bool | None:
        return None if self.limit is None else self.value <= self.limit + 1e-12


ORACLE_LIMIT, LEAST_CONN_LIMIT, EDGES_LIMIT = 1.2, 0.85, 1.1
WRITES_BUDGET_PER_NODE_S = 1.0
# A thousand GPUs: 128 nodes x 2 IUs of 4 GPUs, whose Consul servers take at most 100 KV writes/s in all. Each
# node's publisher writes on its own clock, so the pool's rate is the simulated per-node rate x 128.
SCALE_NODES, SCALE_WRITES_BUDGET_S = 128, 100.0
# The Consul-only fallback (push off, or no agent reachable) is held to no worse than least-connections.
FALLBACK_LEAST_CONN_LIMIT = 1.0


def check_targets(main: list[Summary], edges: list[Summary], before: list[Summary],
                  load: float = 0.8) -> list[TargetCheck]:
    """The routing targets for every shipped `ours` row: at 80% load p99 TTFT <= 1.2x the oracle and
    <= 0.85x least-connections; at 95% no worse than least-connections; at 50% the ratios are references.
    The Consul-only fallback is also held to <= 1.0x least-connections at 80%. Edge scaling compares the most
    edges with one; Consul writes per node per second against the 1/s budget, and x 128 nodes against the
    100/s a thousand GPUs' servers take. The 'before' rows (the score without its admitted-prefill term) and
    round-robin are references."""
    checks: list[TargetCheck] = []
    for at_load in sorted({s.load for s in main}):
        at = {s.label: s for s in main + before if abs(s.load - at_load) < 1e-9}
        oracle, least = at.get("oracle"), at.get("least-conn")
        if oracle is None or least is None:
            continue
        for label, ours in at.items():
            if not label.startswith(("ours", "before")):
                continue
            reference = label.startswith("before")
            for name, base, limit in (("oracle", oracle, ORACLE_LIMIT), ("least-conn", least, LEAST_CONN_LIMIT)):
                if abs(at_load - load) < 1e-9:
                    target = None if reference else limit
                elif at_load >= 0.95 and name == "least-conn" and not reference:
                    target = 1.0  # "no worse than least-connections"
                else:
                    target = None
                checks.append(TargetCheck(f"{at_load:.0%} {label} p99 TTFT / {name}",
                                          ours.ttft_p99_ms / base.ttft_p99_ms, target))
            if label.endswith("(Consul only)") and not reference and abs(at_load - load) < 1e-9:
                checks.append(TargetCheck(f"{at_load:.0%} {label} p99 TTFT / least-conn (fallback: no worse)",
                                          ours.ttft_p99_ms / least.ttft_p99_ms, FALLBACK_LEAST_CONN_LIMIT))
            if ours.consul_writes_per_node_s is not None and not reference:
                checks.append(TargetCheck(f"{at_load:.0%} {label} Consul writes per node per s (budget 1/s)",
                                          ours.consul_writes_per_node_s, WRITES_BUDGET_PER_NODE_S))
                checks.append(TargetCheck(f"{at_load:.0%} {label} Consul writes per s at {SCALE_NODES} nodes "
                                          f"(budget {SCALE_WRITES_BUDGET_S:.0f}/s)",
                                          ours.consul_writes_per_node_s * SCALE_NODES, SCALE_WRITES_BUDGET_S))
        if "round-robin" in at:
            checks.append(TargetCheck(f"{at_load:.0%} round-robin p99 TTFT / oracle",
                                      at["round-robin"].ttft_p99_ms / oracle.ttft_p99_ms, None))
    if len(edges) >= 2:
        ratio = edges[-1].ttft_p99_ms / edges[0].ttft_p99_ms
        checks.append(TargetCheck(f"{edges[-1].label} p99 / {edges[0].label.split(', ')[-1]}", ratio, EDGES_LIMIT))
    return checks


# Two-sided 95% Student t quantiles by degrees of freedom (n seeds - 1); 1.96 beyond the table.
T_95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
        12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t_95(df: int) -> float:
    known = [d for d in T_95 if d <= df]
    return T_95[max(known)] if df <= 30 else 1.96


@dataclass(frozen=True)
class SeedCheck:
    """A target or reference over seeds: the per-seed values (each a ratio on that seed's own traces, so the
    two policies of a ratio saw the same arrivals), their mean, sample standard deviation and 95% t
    interval of the mean. The verdict is on the mean; the interval says how sure it is."""

    name: str
    seeds: tuple[int, ...]
    values: tuple[float, ...]
    limit: float | None

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values)

    @property
    def sd(self) -> float:
        n = len(self.values)
        if n < 2:
            return math.nan
        return math.sqrt(sum((v - self.mean) ** 2 for v in self.values) / (n - 1))

    @property
    def ci95(self) -> tuple[float, float]:
        n = len(self.values)
        if n < 2:
            return (math.nan, math.nan)
        half = t_95(n - 1) * self.sd / math.sqrt(n)
        return (self.mean - half, self.mean + half)

    @property
    def met(self) -> bool | None:
        return None if self.limit is None else self.mean <= self.limit + 1e-12

    @property
    def sure(self) -> bool | None:
        """True: the whole 95% interval is within the limit; False: entirely beyond; None: it straddles it
        (or one seed: no interval)."""
        low, high = self.ci95
        if self.limit is None or math.isnan(high):
            return None
        if high <= self.limit:
            return True
        return False if low > self.limit else None

    def line(self) -> str:
        per_seed = " / ".join(f"{v:.3f}" for v in self.values)
        mean = f"{self.mean:.3f}" if self.limit is None else shown(self.mean, self.limit, 3)
        if len(self.values) == 1:
            text = f"{self.name} = {mean} (seed {self.seeds[0]} only: no spread)"
        else:
            low, high = self.ci95
            text = (f"{self.name} = {mean} mean of seeds {','.join(map(str, self.seeds))} "
                    f"({per_seed}; sd {self.sd:.3f}, 95% CI {low:.3f} to {high:.3f})")
        if self.limit is None:
            return f"reference: {text}"
        sure = {True: "; CI within the limit", False: "; CI beyond the limit",
                None: "; CI straddles the limit" if len(self.values) > 1 else ""}[self.sure]
        verdict = "met" if self.met else "NOT met"
        return f"target: {text} (target <= {self.limit:g}{sure}): {verdict}"

    def as_json(self) -> dict:
        low, high = self.ci95
        return {"name": self.name, "seeds": list(self.seeds), "values": [round(v, 4) for v in self.values],
                "mean": round(self.mean, 4), "sd": None if math.isnan(self.sd) else round(self.sd, 4),
                "ci95": None if math.isnan(high) else [round(low, 4), round(high, 4)], "limit": self.limit,
                "met": self.met}


def over_seeds(per_seed: list[SeedRows]) -> list[SeedCheck]:
    """check_targets on every seed's own rows, gathered by name (every seed yields the same checks)."""
    seeds = tuple(r.seed for r in per_seed)
    lists = [check_targets(r.main, r.edges, r.before) for r in per_seed]
    names = [c.name for c in lists[0]]
    if any([c.name for c in checks] != names for checks in lists):
        raise ValueError("seeds produced different target lists")
    return [SeedCheck(name, seeds, tuple(checks[i].value for checks in lists), lists[0][i].limit)
            for i, name in enumerate(names)]


def seed_table(per_seed: list[SeedRows], title: str) -> Table:
    """P99 TTFT of every row on every seed: the spread the means hide."""
    table = Table(title=title, title_justify="left", header_style="bold")
    table.add_column("row", justify="left")
    for r in per_seed:
        table.add_column(f"seed {r.seed}", justify="right")
    table.add_column("mean", justify="right")
    table.add_column("sd", justify="right")
    groups = [("main", "{load:.0%} {label}"), ("edges", "{label}"), ("staleness", "{label}"), ("before", "{label}")]
    for name, fmt in groups:
        for rows in zip(*(getattr(r, name) for r in per_seed), strict=True):
            values = [row.ttft_p99_ms for row in rows]
            mean = sum(values) / len(values)
            sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else None
            table.add_row(fmt.format(load=rows[0].load, label=rows[0].label), *(_fmt(v) for v in values),
                          _fmt(mean), _fmt(sd))
    return table


def print_report(console: Console, header: list[str], per_seed: list[SeedRows]) -> list[SeedCheck]:
    for line in header:
        console.print(line, highlight=False)
    means = mean_rows(per_seed)
    main, edges, staleness, before = means.main, means.edges, means.staleness, means.before
    n = len(per_seed)
    of = f"mean of {n} seeds" if n > 1 else f"seed {per_seed[0].seed}"
    console.print(main_table(main, f"Routing quality ({of}; times in ms unless noted; E2E in s)"))
    oracle80 = next((s for s in main if s.label == "oracle" and abs(s.load - 0.8) < 1e-9), None)
    if edges:
        console.print(sensitivity_table(edges, oracle80, f"Sensitivity of ours to the number of edges (80% load, {of})"))
    if staleness:
        console.print(sensitivity_table(staleness, oracle80, f"Sensitivity of ours to score staleness (80% load, {of})"))
    if before:
        console.print(sensitivity_table(before, oracle80, "Before/after: the same `ours` rows with drain as it was "
                                                          f"before its admitted-prefill term (prefill_s), 80% load, {of}"))
    if n > 1:
        console.print(seed_table(per_seed, "P99 TTFT per seed (ms): the spread behind the means"))
    for s in main + before:
        if s.label.startswith(("ours", "before")) and abs(s.load - 0.8) < 1e-9 and s.misled \
                and s.misled.get("long_waits"):
            console.print(why_line(s), highlight=False)
    checks = over_seeds(per_seed)
    for check in checks:
        console.print(check.line(), highlight=False, soft_wrap=True)  # one line per target, for grep
    return checks


def why_line(s: Summary) -> str:
    """Of the requests that queued > 500 ms, the share routed on a score that said 'free', and what the score
    did or did not count then."""
    m = s.misled
    if s.label.startswith("before"):
        cause = ("without prefill_s, a prompt being prefilled in chunks counts as 'running', not 'waiting', and vLLM "
                 "adds its tokens to prompt_tokens_total only at its first token, so the score cannot see it")
    else:
        cause = ("the score counts waiting prompts and, through prefill_s, prompts admitted but not yet prefilled "
                 "(prefix_cache_queries_total - prompt_tokens_total), so the work these requests queued behind "
                 "was not in the score they were routed on yet (score age above; requests other edges sent "
                 "since are only in the reader's own count)")
    return (f"why ({s.label}, 80%): {m['long_waits']} requests waited > 500 ms; {m['looked_free']:.0%} of them went "
            f"to an IU whose published drain score was < 100 ms (median score age "
            f"{1e3 * m['score_age_median_s']:.0f} ms) while its true wait was {m['true_wait_median_s']:.2f} s "
            f"(median): {cause}")


def plot(path: str, main: list[Summary], edges: list[Summary], staleness: list[Summary]) -> str | None:
    """P99 TTFT per policy and load, and the two sensitivities; returns why not when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); no plot written"
    loads = sorted({s.load for s in main})
    labels = list(dict.fromkeys(s.label for s in main))
    fig, axes = plt.subplots(1, 3, figsize=(16, 5), gridspec_kw={"width_ratios": [3, 1, 1]})
    width = 0.8 / max(1, len(labels))
    for i, label in enumerate(labels):
        values = [next((s.ttft_p99_ms for s in main if s.label == label and s.load == load), math.nan)
                  for load in loads]
        axes[0].bar([x + i * width for x in range(len(loads))], values, width, label=label)
    axes[0].set_xticks([x + width * (len(labels) - 1) / 2 for x in range(len(loads))])
    axes[0].set_xticklabels([f"{load:.0%} load" for load in loads])
    axes[0].set_ylabel("P99 TTFT (ms)")
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    axes[0].set_title("P99 time to first token")
    oracle = next((s.ttft_p99_ms for s in main if s.label == "oracle" and abs(s.load - 0.8) < 1e-9), None)
    for ax, rows, title in ((axes[1], edges, "ours (push) vs edges, 80%"),
                            (axes[2], staleness, "push vs agent cycle, 80%")):
        ax.bar(range(len(rows)), [s.ttft_p99_ms for s in rows], color="tab:purple")
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([s.label.split(", ")[-1] for s in rows], rotation=20, fontsize=8)
        ax.set_title(title)
        ax.set_ylabel("P99 TTFT (ms)")
        if oracle is not None:
            ax.axhline(oracle, color="tab:brown", linestyle="--", label="oracle")
            ax.axhline(ORACLE_LIMIT * oracle, color="tab:red", linestyle=":",
                       label=f"{ORACLE_LIMIT} x oracle (target)")
            ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
