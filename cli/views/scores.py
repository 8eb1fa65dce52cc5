"""How ``clusterctl scores`` and the demo's routing view draw the pool: rows from the reader's view, each
score as the sum of its (weighted) terms, the inputs behind them, and what an anomaly flag means.

Rendering only, apart from the command: the demo (:mod:`demo.scenario`, above the CLI) draws the same table
through this module; the views are the part of ``cli`` the demo may import (tests/guards/test_import_lint.py).
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from eas_agent.score import SCORE_TERMS
from eas_wire.scorebody import ScoreTerms
from edge.pool import IUEntry, PoolView

HEALTH_STYLE = {"passing": "green", "warning": "yellow", "critical": "red", "maintenance": "magenta"}
WIDE = 140  # columns from which the inputs, rack and node get their own columns


def entry_json(entry: IUEntry, now: float) -> dict:
    return {
        "iu": entry.iu_id,
        "rack": entry.rack,
        "node": entry.node,
        "score": entry.score,
        "status": entry.status,
        "reason": entry.reason,
        "health": entry.health,
        "age_s": round(now - entry.ts, 3) if entry.ts else None,
        "stale": now > entry.stale_after,
        "anomaly": entry.anomaly,
        "weight": entry.weight,
        "components": entry.components,
    }


def rows(view: PoolView, expected: dict[str, tuple[str, str]], now: float) -> list[dict]:
    out = [entry_json(e, now) for e in view.snapshot().entries]
    seen = {r["iu"] for r in out}
    for iu_id, (rack, node) in sorted(expected.items()):
        if iu_id not in seen:
            out.append(
                {
                    "iu": iu_id,
                    "rack": rack,
                    "node": node,
                    "score": None,
                    "status": None,
                    "reason": "not registered in Consul",
                    "health": "unknown",
                    "age_s": None,
                    "stale": True,
                    "anomaly": None,
                    "weight": None,
                    "components": {},
                }
            )
    return sorted(out, key=lambda r: (r["rack"], r["node"], r["iu"]))


def _num(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def weighted_terms(components: dict) -> list[tuple[str, float, float]]:
    """(term, weight, value) of the profile whose terms ``components`` carries (an agent publishes one
    profile's: its weights are the agent's own, ``eas_agent.score.SCORE_TERMS``); [] when it carries none
    (an IU with no score)."""
    for weights in SCORE_TERMS.values():
        terms = [(k, w, components[k]) for k, w in weights.items() if isinstance(components.get(k), int | float)]
        if terms:
            return terms
    return []


def terms_text(components: dict) -> str:
    """``prefill_s 1.95 + step_s 0.0011``, or with weights ``kv_cache_gb 6 (0.3 x 20) + kv_cache_age_s 1.25
    (0.5 x 2.5)``: what each term adds to the score, largest first; terms that are 0 are left out (``0``
    when all are), so the numbers shown add up to the score."""
    terms = weighted_terms(components)
    if not terms:
        return ""
    shown = sorted(((k, w, v) for k, w, v in terms if v), key=lambda t: -abs(t[1] * t[2]))
    return " + ".join(
        f"{k} {_num(v)}" if w == 1 else f"{k} {_num(round(w * v, 6))} ({w:g} x {_num(v)})" for k, w, v in shown
    ) or "0"


def inputs_text(components: dict) -> str:
    """What the terms come from (requests, KV use, admitted prefill), in a few words."""
    terms = ScoreTerms.of(components)[0]
    parts = [f"{k} {_num(v)}" for k, v in (("waiting", terms.waiting), ("running", terms.running)) if v is not None]
    if terms.kv_usage is not None:
        parts.append(f"kv {terms.kv_usage * 100:.0f}%")
    if terms.admitted_prefill_tokens:
        parts.append(f"admitted {_num(terms.admitted_prefill_tokens)} tok")
    return ", ".join(parts)


def hit_text(components: dict) -> str:
    """The unit's prefix-cache hit rate (hit tokens / looked-up tokens, ``eas_agent.score``) as a percentage;
    ``off`` when the engine has prefix caching off (-1), ``-`` when its score carries none."""
    rate = components.get("prefix_hit_rate")
    if not isinstance(rate, int | float) or isinstance(rate, bool):
        return "-"
    return "off" if rate < 0 else f"{rate * 100:.0f}%"


# the detector's verdicts (edge/pool/anomaly.py) in an operator's words; "busy" is no anomaly (shown dim)
FLAG_WORDS = {"frozen": "stuck", "ramp": "warming up", "high_outlier": "odd score", "busy": "busy"}
NARROW = 100  # below this many columns a flag is its word alone (its why is in the wide table and --json)


def flag_why(row: dict, data: list[dict], short: bool = False) -> str:
    """The reader's flag on this IU (edge/pool/anomaly.py) in an operator's words: what is wrong (or, for
    ``busy``, that nothing is: a long prompt is being prefilled) and what routing does about it; ``short``:
    the word alone."""
    from edge.pool.anomaly import AnomalyDetector, own_prefill_s

    flag, detector = row["anomaly"], AnomalyDetector()
    if not flag:
        return ""
    word = FLAG_WORDS.get(flag, flag)
    if short:
        return word
    if flag == "busy":
        own = own_prefill_s(ScoreTerms.of(row["components"])[0])
        return f"{word}: {own:.2g}s of its own prompts to prefill; new requests go elsewhere until then"
    if flag == "high_outlier":
        scores = sorted(r["score"] for r in data if r["score"] is not None)
        median = f" vs pool median {scores[len(scores) // 2]:.3g}" if scores else ""
        score = f" {row['score']:.3g}" if row["score"] is not None else ""
        return f"{word}:{score}{median}, not explained by its own work; no traffic while it lasts"
    if flag == "frozen":
        terms = ScoreTerms.of(row["components"])[0]
        pending = (terms.running or 0) + (terms.waiting or 0)
        return (f"{word}: no new tokens for {detector.frozen_s:g}s with {_num(pending)} requests pending; "
                f"gets {_num(row['weight'] * 100)}% of its traffic")
    if flag == "ramp":
        return f"{word}: new or back in rotation; full traffic in {detector.ramp_s:g}s"
    return word


CAPTION = ("score = the sum of its terms (weighted ones: weight x value; zeros left out); hit = prefix-cache "
           "hit rate; every component: --json")


def table(data: list[dict], title: str, width: int = 160, caption: str | None = CAPTION) -> Table:
    """The scores table laid out for ``width`` columns: narrow terminals get the IU, score, its terms,
    prefix-cache hit rate, health and flag (its word alone below :data:`NARROW` columns); wide ones the rack, node and the inputs
    too. Cells fold, never cut to "..."."""
    wide = width >= WIDE
    t = Table(title=title, title_justify="left", caption_justify="left", caption=caption)
    columns = ["IU"] + (["rack", "node"] if wide else []) + ["score", "= terms"]
    columns += (["inputs"] if wide else []) + ["hit", "age", "health", "flag"]
    # the health column wraps at "maintenance" below WIDE, leaving a term and its value ("prefill_s 1.95")
    # and a flag's first words ("stuck: no new tokens") room for one line
    limits = {} if wide else {"health": {"max_width": 11}} if width < NARROW else {
        "health": {"max_width": 16}, "= terms": {"max_width": 18}}
    for column in columns:
        t.add_column(column, justify="right" if column in ("score", "hit", "age") else "left",
                     overflow="fold", no_wrap=column in ("IU", "rack", "node", "score", "hit", "age"),
                     **limits.get(column, {}))
    for r in data:
        age = "-" if r["age_s"] is None else f"{r['age_s']:.1f}s" + (" stale" if r["stale"] else "")
        score = "-" if r["score"] is None else f"{r['score']:.4g}"
        health = Text(r["health"], style=HEALTH_STYLE.get(r["health"], "dim"))
        if r["reason"]:
            health.append(f" ({r['reason']})")
        cells = [Text(r["iu"])] + ([Text(r["rack"]), Text(r["node"])] if wide else [])
        cells += [score, Text(terms_text(r["components"]))]
        cells += ([Text(inputs_text(r["components"]))] if wide else []) + [hit_text(r["components"])]
        flag_style = "dim" if r["anomaly"] == "busy" else "yellow"
        cells += [age, health, Text(flag_why(r, data, short=width < NARROW), style=flag_style)]
        t.add_row(*cells)
    return t


def publishing(data: list[dict]) -> int:
    return sum(1 for r in data if r["score"] is not None)
