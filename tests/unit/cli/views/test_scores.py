"""`clusterctl scores` at 80/100/160 columns and piped: every score term (prefill_s included) shown, a flag in
an operator's words (what is wrong, what routing does about it), agent text is not markup, nothing cut to "…"."""

from __future__ import annotations

import pytest

from cli.views import scores
from tests.helpers import score_samples
from tests.helpers.cli import check_snapshot, render_at

pytestmark = pytest.mark.unit

WIDTHS = [80, 100, 160, None]
IDS = ["80", "100", "160", "piped"]


def scores_table(width):
    return scores.table(score_samples.rows(), "EAS scores (127.0.0.1:8500, dc1)", width)


@pytest.mark.parametrize("width", WIDTHS, ids=IDS)
def test_scores_table_snapshot(width, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    text = render_at(scores_table, width)
    check_snapshot(f"scores_{width or 'piped'}.txt", text)
    if width:
        assert all(len(line) <= width for line in text.splitlines())
        borders = [line for line in text.splitlines() if line[:1] in "┏┃┡│└"]
        assert all(line.rstrip()[-1] in "┓┃┩│┘" for line in borders), "the table is wider than the terminal"
    else:  # piped: the wide layout, each IU's row on one line whatever its flag says
        assert all(len([line for line in text.splitlines() if f"{r['iu']} " in line]) == 1
                   for r in score_samples.rows())
    assert "…" not in text
    assert "prefill_s 1.95" in text  # the term that explains the outlier
    assert "stuck" in text and "warming up" in text  # the flags in an operator's words
    for word in ("frozen", "ramp", "outlier", "gated", "weight 0"):  # never the detector's own
        assert word not in text, word
    busy = next(line for line in text.splitlines() if "r01n02-iu0" in line)
    assert "1.951" in busy and "busy" in busy and "odd" not in busy  # busy with its prompt: no anomaly
    if width and width >= 100:  # room for what the flag means
        assert "stuck: no new tokens" in text and "warming up: new or" in text
    assert "[/]" in text  # the agent's text as it is, not as markup


def test_the_hit_column_is_the_prefix_hit_rate_in_percent():
    assert scores.hit_text({"prefix_hit_rate": 0.315}) == "32%"
    assert scores.hit_text({"prefix_hit_rate": 1.0}) == "100%"
    assert scores.hit_text({"prefix_hit_rate": 0}) == "0%"
    assert scores.hit_text({"prefix_hit_rate": -1.0}) == "off"  # vLLM V0's sentinel: prefix caching off
    assert scores.hit_text({}) == "-" and scores.hit_text({"prefix_hit_rate": None}) == "-"
    lines = render_at(scores_table, 80).splitlines()
    assert [c.strip() for c in lines[2].split("┃")[1:-1]] == ["IU", "score", "= terms", "hit", "age", "health", "flag"]
    row = {line.split("│")[1].strip(): line.split("│")[4].strip() for line in lines if line.startswith("│ r0")}
    assert (row["r01n01-iu0"], row["r01n01-iu1"], row["r01n02-iu1"], row["r02n02-iu0"]) == ("32%", "off", "0%", "-")


def test_cells_say_it_all():
    rows = score_samples.rows()
    busy = rows[2]
    assert scores.terms_text(busy["components"]) == "prefill_s 1.95 + step_s 0.0011"
    assert scores.flag_why(busy, rows) == "busy: 1.9s of its own prompts to prefill; new requests go elsewhere until then"
    assert scores.flag_why(busy, rows, short=True) == "busy"


def test_terms_add_up_to_the_score():
    for row in score_samples.rows():
        if row["score"] is None:
            continue
        text = scores.terms_text(row["components"])
        total = sum(float(part.split()[1]) for part in text.split(" + ")) if text != "0" else 0.0
        assert abs(total - row["score"]) < 1e-3, (row["iu"], text)
    seed = next(row for row in score_samples.rows() if "kv_cache_gb" in row["components"])
    assert scores.terms_text(seed["components"]) == "kv_cache_gb 6 (0.3 x 20) + kv_cache_age_s 1.25 (0.5 x 2.5)"


def test_a_seed_score_from_the_agent_reads_as_its_weighted_terms():
    """The weights come from eas_agent.score itself: a score it computes adds up from the terms shown."""
    from eas_agent.collectors.network import NetReading
    from eas_agent.collectors.vllm import VllmReading
    from eas_agent.score import IUInputs, seed_score
    from eas_agent.vllm_metrics import VllmMetrics

    metrics = VllmMetrics(schema="v1", num_requests_running=6.0, num_requests_waiting=1.0, kv_cache_usage=0.5)
    inputs = IUInputs("r01n01-iu0", VllmReading(metrics, completions_per_s=1.5), net=NetReading(12e6, None),
                      kv_cache_gb=40.0)
    result = seed_score(inputs, now=0.0)
    text = scores.terms_text(result.components)
    assert text == "kv_cache_gb 6 (0.3 x 20) + net_mb_per_s 2.4 (0.2 x 12) + kv_cache_age_s 1 (0.5 x 2)"
    assert abs(sum(float(part.split()[1]) for part in text.split(" + ")) - result.score) < 1e-9


def test_flag_reasons_for_every_flag():
    rows = score_samples.rows()
    frozen = dict(rows[0], anomaly="frozen", weight=0.3)
    ramp = dict(rows[0], anomaly="ramp")
    odd = dict(rows[0], score=2.5, anomaly="high_outlier", weight=0.0)
    assert scores.flag_why(frozen, rows) == ("stuck: no new tokens for 6s with 2 requests pending; "
                                             "gets 30% of its traffic")
    assert scores.flag_why(ramp, rows) == "warming up: new or back in rotation; full traffic in 10s"
    assert scores.flag_why(odd, rows) == ("odd score: 2.5 vs pool median 0.0013, not explained by its own work; "
                                          "no traffic while it lasts")
    assert [scores.flag_why(r, rows, short=True) for r in (frozen, ramp, odd)] == ["stuck", "warming up", "odd score"]
