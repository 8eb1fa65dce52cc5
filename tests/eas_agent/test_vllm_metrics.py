"""Parsing saved vLLM scrapes (V1 single/multi-engine, V0, missing metrics, truncated, garbage, appended)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from eas_agent import vllm_metrics
from eas_agent.vllm_metrics import MetricsParseError, parse_vllm_metrics
from tests.helpers import run_cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"


def parse(name: str):
    return parse_vllm_metrics((FIXTURES / name).read_text())


def test_v1_single_engine():
    m = parse("v1_single_engine.txt")
    assert (m.schema, m.num_requests_running, m.num_requests_waiting, m.kv_cache_usage) == (
        "v1",
        237.0,
        0.0,
        0.802489,
    )
    assert m.prompt_tokens_total == 987540.0 and m.generation_tokens_total == 182507.0
    assert m.request_success_total == 810.0  # summed over finished_reason labels
    assert m.prefix_cache_hits_total == 241215.0
    assert m.prompt_tokens_sum / m.prompt_tokens_count == pytest.approx(915.98, abs=0.01)
    assert m.engines == 1


def test_v1_two_engines_sums_counts_and_takes_max_kv():
    m = parse("v1_two_engines.txt")
    assert (m.schema, m.num_requests_running, m.num_requests_waiting, m.kv_cache_usage) == (
        "v1",
        304.0,
        238.0,
        0.7664,
    )
    assert m.engines == 2


def test_v0_names():
    m = parse("v0_single_model.txt")
    assert (m.schema, m.num_requests_running, m.kv_cache_usage, m.num_requests_swapped) == (
        "v0",
        16.0,
        0.064533,
        0.0,
    )
    assert m.prefix_cache_hit_rate == 0.25 and m.prefix_cache_queries_total is None


def test_missing_metrics_are_none_not_zero():
    m = parse("v1_missing_kv_and_waiting.txt")
    assert m.schema is None and m.kv_cache_usage is None and m.num_requests_waiting is None
    assert m.num_requests_running == 237.0


def test_last_complete_scrape_of_several_is_read():
    assert parse("v1_two_scrapes_appended.txt") == parse("v1_single_engine.txt")


def test_appended_scrapes_with_truncated_last_fall_back_to_previous():
    first = (FIXTURES / "v1_single_engine.txt").read_text()
    cut = (FIXTURES / "v1_truncated.txt").read_text()
    assert parse_vllm_metrics(first + cut) == parse_vllm_metrics(first)


@pytest.mark.parametrize(
    "name, line_no, words",
    [
        ("v1_truncated.txt", 39, "truncated"),
        ("garbage_html.txt", 1, "not a Prometheus sample line"),
    ],
)
def test_unparseable_names_the_line(name, line_no, words):
    with pytest.raises(MetricsParseError) as info:
        parse(name)
    assert info.value.line_no == line_no and words in str(info.value)


def test_bad_value_in_a_wanted_family_names_the_line():
    text = (
        (FIXTURES / "v1_single_engine.txt")
        .read_text()
        .replace(
            'vllm:num_requests_waiting{engine="0",model_name="meta-llama/Meta-Llama-3-70B-Instruct"} 0.0',
            'vllm:num_requests_waiting{engine="0",model_name="meta-llama/Meta-Llama-3-70B-Instruct"} zero',
        )
    )
    with pytest.raises(MetricsParseError) as info:
        parse_vllm_metrics(text)
    assert "num_requests_waiting" in str(info.value) and info.value.line_no is not None


@pytest.mark.parametrize(("value", "unlabelled"), [("NaN", False), ("-1e6", False), ("+Inf", True), ("NaN", True)])
def test_a_non_finite_or_negative_sample_names_its_line(value, unlabelled):
    """Operator review: `agent parse-metrics` said which sample but not where; a scrape is hundreds of lines."""
    good = (FIXTURES / "v1_single_engine.txt").read_text()
    old = 'vllm:num_requests_waiting{engine="0",model_name="meta-llama/Meta-Llama-3-70B-Instruct"} 0.0'
    new = "vllm:num_requests_waiting " + value if unlabelled else old.replace(" 0.0", " " + value)
    assert old in good
    with pytest.raises(MetricsParseError) as info:
        parse_vllm_metrics(good.replace(old, new))
    expected = good.split("\n").index(old) + 1
    assert info.value.line_no == expected, str(info.value)
    assert str(info.value) == f"line {expected}: non-finite or negative sample: {new!r}"


def test_empty_scrape():
    with pytest.raises(MetricsParseError, match="empty"):
        parse_vllm_metrics("\n")


def test_cli_json_follows_the_contract(capsys):
    code, out, err = run_cli(capsys, "agent", "parse-metrics", str(FIXTURES / "v1_two_engines.txt"), "--json")
    assert code == 0, err
    assert json.loads(out) == {
        "schema": "v1",
        "num_requests_running": 304.0,
        "num_requests_waiting": 238.0,
        "kv_cache_usage": 0.7664,
        "warnings": [],
    }
    code, out, _ = run_cli(
        capsys, "agent", "parse-metrics", str(FIXTURES / "v1_missing_kv_and_waiting.txt"), "--json"
    )
    assert code == 0 and json.loads(out) == {
        "schema": None,
        "num_requests_running": 237.0,
        "num_requests_waiting": None,
        "kv_cache_usage": None,
        "warnings": [],
    }


def test_cli_unparseable_exit_1_one_line(capsys):
    code, out, err = run_cli(capsys, "agent", "parse-metrics", str(FIXTURES / "garbage_html.txt"), "--json")
    assert code == 1 and out == "" and err.count("\n") == 1 and "line 1" in err and "Traceback" not in err


def _outcome(text: str):
    try:
        return parse_vllm_metrics(text).to_json()
    except MetricsParseError as exc:
        return f"error: {exc}"


ODD_LINES = [
    'vllm:num_requests_running{engine="0",model_name="a\\"b\\\\c\\nd"} 3',
    'vllm:num_requests_running{engine="0",} 3',
    'vllm:num_requests_running{} 3',
    'vllm:num_requests_running 3 1700000000000',
    'vllm:num_requests_running{engine="0"}\t3\t-5',
    'vllm:num_requests_running{engine="0"} 1_0',
    'vllm:num_requests_running{engine="0"} 0x10',
    'vllm:num_requests_running{engine="0"} +Inf',
    'vllm:num_requests_running{engine="0"} nan',
    'vllm:num_requests_running{engine=0} 3',
    'vllm:num_requests_running{engine="0" , model_name="m"} 3',
    'vllm:num_requests_running{engine="0"model_name="m"} 3',
    'vllm:num_requests_running{engine="0}"} 3',
    'vllm:num_requests_running{engine="\\q"} 3',
    'vllm:num_requests_running{0engine="0"} 3',
    'vllm:num_requests_running{engine="0"} 3 x',
]


@pytest.mark.parametrize("line", ODD_LINES)
def test_the_fast_sample_path_reads_what_prometheus_client_reads(line, monkeypatch):
    """The common-shape fast path (eas_agent.vllm_metrics._fast_samples) must never read a line otherwise than
    prometheus_client's parser, which decides every line outside that shape: same values, same errors."""
    text = FIXTURES.joinpath("v1_single_engine.txt").read_text().replace(
        next(ln for ln in FIXTURES.joinpath("v1_single_engine.txt").read_text().splitlines()
             if ln.startswith("vllm:num_requests_running")), line)
    fast = _outcome(text)
    monkeypatch.setattr(vllm_metrics, "_fast_samples", lambda kept: None)
    assert _outcome(text) == fast


def test_the_fast_sample_path_agrees_with_prometheus_client_on_every_fixture_and_hostile_scrape(monkeypatch):
    from tests.faults.test_inputs import hostile_scrape

    rng = random.Random(2202)
    texts = [p.read_text() for p in sorted(FIXTURES.glob("*.txt"))] + [hostile_scrape(rng) for _ in range(1000)]
    fast = [_outcome(t) for t in texts]
    monkeypatch.setattr(vllm_metrics, "_fast_samples", lambda kept: None)
    assert [_outcome(t) for t in texts] == fast
    assert sum(not isinstance(o, str) for o in fast) > 100  # most still parse: the comparison is not vacuous


def test_real_scrapes_take_the_fast_path(monkeypatch):
    calls = []
    real = vllm_metrics._library_samples
    monkeypatch.setattr(vllm_metrics, "_library_samples", lambda *a: calls.append(a) or real(*a))
    for name in ("v1_single_engine.txt", "v1_two_engines.txt", "v0_single_model.txt"):
        parse(name)
    assert calls == []


GOOD_LINES = FIXTURES.joinpath("v1_single_engine.txt").read_text().split("\n")
RUNNING_LINE = next(i for i, ln in enumerate(GOOD_LINES) if ln.startswith("vllm:num_requests_running{"))


def _replaced(index: int, line: str) -> str:
    return "\n".join([*GOOD_LINES[:index], line, *GOOD_LINES[index + 1 :]])


@pytest.mark.parametrize(
    "line",
    [
        'python_gc_objects_collected_total{generation="0" 21873.0',  # labels never closed
        '{"process.cpu.seconds"} 18294.37',  # a quoted UTF-8 name (Prometheus 3's text format)
        "<<garbage \x01\x7f>>",
        "vllm:num_requests_runnin",  # a name cut short is another family's name
    ],
)
def test_a_malformed_line_of_a_family_not_read_leaves_the_scrape_readable(line):
    """Only the families the agent reads are parsed (vllm_metrics' docstring): a line of another family that is
    not Prometheus text (a newer exporter's syntax, corruption) is not looked at; the numbers are the same."""
    assert not GOOD_LINES[2].startswith("vllm:")
    assert parse_vllm_metrics(_replaced(2, line)) == parse("v1_single_engine.txt")


@pytest.mark.parametrize(
    "line",
    [
        'vllm:num_requests_running{engine="0",model_name="m" 3',  # labels never closed
        "vllm:num_requests_running",  # no value
        'vllm:num_requests_running{engine="0"}3',
        '  vllm:num_requests_running{engine="0"} 3 4 5',  # indented: still the family's line
        'vllm:num_requests_running{engine="0"} 3\r trailing',
    ],
)
def test_a_malformed_line_of_a_family_read_is_refused_naming_it(line):
    with pytest.raises(MetricsParseError, match="not a Prometheus sample line") as info:
        parse_vllm_metrics(_replaced(RUNNING_LINE, line))
    assert info.value.line_no == RUNNING_LINE + 1


def test_a_scrape_without_any_family_read_is_checked_whole():
    """Nothing to score from: the error names the first line that is not Prometheus text (an HTML page, an
    exporter that is not vLLM's), and a well-formed scrape of other families parses to unknowns."""
    others = GOOD_LINES[:RUNNING_LINE - 2]
    assert parse_vllm_metrics("\n".join(others) + "\n").schema is None
    broken = [*others[:4], "python_gc_objects_collected_total{generation=", *others[5:]]
    with pytest.raises(MetricsParseError, match="not a Prometheus sample line") as info:
        parse_vllm_metrics("\n".join(broken) + "\n")
    assert info.value.line_no == 5


def _read_family_line(line: str) -> bool:
    name = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", line.strip())
    return name is not None and name.group() in vllm_metrics.WANTED_SAMPLES


def _scrape_outcome(parse_one, *args):
    try:
        return parse_one(*args).to_json()
    except MetricsParseError as exc:
        return exc


def test_reading_only_the_families_read_differs_from_reading_every_line_only_where_another_family_is_malformed():
    """Each complete scrape of the fixtures and of 1000 hostile texts, read as parse_vllm_metrics reads it and by
    the walk over every line (what a scrape without any family read still gets): the outcome is the same, except
    where that walk refused a line of a family that is not read."""
    from tests.faults.test_inputs import hostile_scrape

    rng = random.Random(2203)
    texts = [p.read_text() for p in sorted(FIXTURES.glob("*.txt"))] + [hostile_scrape(rng) for _ in range(1000)]
    compared = differ = 0
    for text in texts:
        lines = text.split("\n")
        for offset, chunk in vllm_metrics.split_scrapes(lines[:-1]):
            if not chunk:
                continue
            compared += 1
            read = _scrape_outcome(vllm_metrics._parse_scrape, "\n".join(chunk) + "\n", offset)
            walked = _scrape_outcome(vllm_metrics._parse_checked_whole, chunk, offset)
            if not isinstance(walked, MetricsParseError):
                assert read == walked, text
            elif not isinstance(read, MetricsParseError) or str(read) != str(walked):
                assert walked.line_no and not _read_family_line(lines[walked.line_no - 1]), (str(walked), read)
                differ += 1
    assert compared > 1000 and differ > 50  # other families' lines do break: the comparison is not vacuous


def test_a_scrape_with_the_families_read_is_not_walked_line_by_line(monkeypatch):
    monkeypatch.setattr(vllm_metrics, "_parse_checked_whole", lambda *a: pytest.fail("walked every line"))
    for name in ("v1_single_engine.txt", "v1_two_engines.txt", "v0_single_model.txt", "v1_two_scrapes_appended.txt"):
        parse(name)


@pytest.mark.parametrize("text", [
    *(p.read_text() for p in sorted(FIXTURES.glob("*.txt"))),
    "# HELP a x\n# HELP b y\n", "# HELP \n# HELP  b\n", "#  HELP a\n # HELP b\nx # HELP c\n", "# HELP a\r\n# HELP b\n",
    "\n\n# HELP a\n", "# HELP", "", "# HELP a b c\n# HELP a\n",
])
def test_help_names_are_those_of_every_help_line_at_a_line_start(text):
    """The one-scrape test's names: the newline-prefixed search reads what ^ with re.MULTILINE read."""
    assert vllm_metrics._help_names(text) == re.findall(r"^# HELP ([^ \n]*)", text, re.MULTILINE)


def test_v0_prefix_caching_off_is_no_hit_rate_not_a_broken_scrape():
    m = parse_vllm_metrics((FIXTURES / "v0_prefix_caching_off.txt").read_text())
    assert m.schema == "v0" and m.kv_cache_usage is not None and m.num_requests_running is not None
    assert m.prefix_cache_hit_rate is None and m.warnings == ()


def test_a_bad_value_in_a_family_not_scored_is_left_out_with_a_warning():
    m = parse_vllm_metrics((FIXTURES / "v0_swapped_nan.txt").read_text())
    assert m.num_requests_swapped is None and m.num_requests_running is not None
    assert len(m.warnings) == 1 and m.warnings[0].startswith("vllm:num_requests_swapped{")
    assert "not scored" in m.warnings[0]


def test_a_negative_hit_rate_other_than_the_sentinel_is_left_out_with_a_warning():
    text = (FIXTURES / "v0_single_model.txt").read_text().replace("} 0.25\n", "} -0.5\n")
    m = parse_vllm_metrics(text)
    assert m.prefix_cache_hit_rate is None and "vllm:gpu_prefix_cache_hit_rate" in m.warnings[0]


def test_cli_reads_a_ticket_paste_with_warnings(capsys, tmp_path):
    text = (FIXTURES / "v0_prefix_caching_off.txt").read_text()
    lines = text.split("\n")
    kv = next(i for i, line in enumerate(lines) if line.startswith("vllm:gpu_cache_usage_perc"))
    lines[kv] += "    <-- this is the one that is high"
    pasted = tmp_path / "ticket.txt"
    pasted.write_text("$ curl -s 127.0.0.1:8000/metrics\n" + "\n".join(lines[:3] + ["..."] + lines[3:]))
    code, out, err = run_cli(capsys, "agent", "parse-metrics", str(pasted), "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["kv_cache_usage"] == parse_vllm_metrics(text).kv_cache_usage
    assert [w.split(":")[0] for w in data["warnings"]] == ["line 1", "line 5", f"line {kv + 3}"]
    assert "annotation '<-- this is the one that is high'" in data["warnings"][2]


def test_v1_deprecated_aliases_beside_the_current_names_are_not_counted_twice():
    assert parse("v1_0_10_deprecated_aliases.txt") == parse("v1_single_engine.txt")
