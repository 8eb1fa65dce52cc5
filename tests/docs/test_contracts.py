"""The contract pages under docs/contracts/ say what the code does: field tables match the code's accepted
fields both ways, and the examples on the page are accepted by the code."""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from pathlib import Path

import yaml

from eas_agent import config
from eas_wire import stream
from eas_wire.announce import ANNOUNCE_PATH, IGNORED_REASONS, batch_json, parse_batch, read_answer
from eas_wire.scorebody import DECLARED_TERMS, CollectorRun, IUScore, ScoreBody

REPO = Path(__file__).resolve().parents[2]
AGENT_CONFIG = REPO / "docs" / "contracts" / "agent-config.md"
SCORE_BODY = REPO / "docs" / "contracts" / "score-body.md"


def table_fields(markdown: str, heading: str) -> set[str]:
    """The backticked first cells of the table under ``## heading``."""
    section = markdown.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_]+)` \|", section, re.MULTILINE))


def accepted_fields(bad_key_parent: str) -> set[str]:
    """The fields ``parse_config`` accepts at one level, from its own "unknown field (known: ...)" error."""
    base = yaml.safe_load(example_yaml())
    target = base if bad_key_parent == "" else base[bad_key_parent] if bad_key_parent == "consul" else base["ius"][0]
    target["not_a_field"] = 1
    try:
        config.parse_config(base, "t.yml")
    except config.ConfigError as exc:
        known = re.search(r"unknown field \(known: ([^)]*)\)", str(exc))
        assert known, str(exc)
        return set(known.group(1).split(", "))
    raise AssertionError("an unknown field was accepted")


def example_yaml() -> str:
    return AGENT_CONFIG.read_text().split("```yaml\n", 1)[1].split("```", 1)[0]


def test_agent_config_tables_list_exactly_the_fields_the_agent_accepts():
    page = AGENT_CONFIG.read_text()
    assert table_fields(page, "Top level") == accepted_fields("")
    assert table_fields(page, "`consul`") == accepted_fields("consul")
    assert table_fields(page, "`ius[N]`") == accepted_fields("ius")


def test_agent_config_example_parses():
    parsed = config.parse_config(yaml.safe_load(example_yaml()), "example.yml")
    assert parsed.node == "r01n01" and [iu.id for iu in parsed.ius] == ["r01n01-iu0"]
    assert parsed.consul.token_file == "/etc/eas-agent/consul.token"


def test_the_table_reader_sees_a_missing_row():
    page = AGENT_CONFIG.read_text().replace("| `frozen_after_s` |", "| frozen |")
    assert "frozen_after_s" not in table_fields(page, "Top level")


def score_body_rows(markdown: str) -> set[str]:
    """The backticked first cells of the score body page's field table (``ius.*.score`` and the like)."""
    section = markdown.split("\n## Shape\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([a-z_.*]+)` \|", section, re.MULTILINE))


def score_body_fields() -> set[str]:
    """Every field the typed body has, named as on the page: the body's, each IU entry's, each collector run's."""
    names = {f.name for f in dataclasses.fields(ScoreBody)}
    names |= {f"ius.*.{f.name}" for f in dataclasses.fields(IUScore)}
    return names | {f"ius.*.collectors.*.{f.name}" for f in dataclasses.fields(CollectorRun)}


def test_score_body_page_lists_exactly_the_bodys_fields():
    """A field added to ScoreBody, IUScore or CollectorRun fails here until docs/contracts/score-body.md
    has its row (and a row for a field that is gone fails too)."""
    assert score_body_rows(SCORE_BODY.read_text()) == score_body_fields()


def test_score_body_page_example_is_read_back_whole():
    page = SCORE_BODY.read_text()
    block = page.split("\n## Shape\n", 1)[1].split("\n| Field", 1)[0]
    example = json.loads("\n".join(line[4:] for line in block.splitlines() if line.startswith("    ")))
    body, problems = ScoreBody.from_json(example)
    assert not problems and json.loads(body.dumps()) == example


def test_the_score_body_row_reader_sees_a_missing_row():
    page = SCORE_BODY.read_text().replace("| `ius.*.collectors.*.duration_s` |", "| duration |")
    assert "ius.*.collectors.*.duration_s" in score_body_fields() - score_body_rows(page)


ANNOUNCE = REPO / "docs" / "contracts" / "announce.md"
SCORES_STREAM = REPO / "docs" / "contracts" / "scores-stream.md"


def section(markdown: str, heading: str) -> str:
    return markdown.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def indented(text: str) -> list[str]:
    """The lines of the indented (code) blocks of ``text``, unindented; blank lines inside a block kept."""
    lines = text.splitlines()
    keep = []
    for i, line in enumerate(lines):
        if line.startswith("    "):
            keep.append(line[4:])
        elif not line.strip() and 0 < i < len(lines) - 1 and lines[i - 1].startswith("    ") \
                and lines[i + 1].startswith("    "):
            keep.append("")
    return keep


def first_cells(text: str) -> list[str]:
    return re.findall(r"^\| `([^`]+)` \|", text, re.MULTILINE)


def test_announce_page_request_is_a_batch_the_agent_accepts_and_the_edge_writes():
    request = indented(section(ANNOUNCE.read_text(), "Request"))
    body = request[-1]
    headers = dict(line.split(": ", 1) for line in request[1:] if ": " in line and not line.startswith("{"))
    assert request[0] == f"POST {ANNOUNCE_PATH} HTTP/1.1" and int(headers["Content-Length"]) == len(body.encode())
    obj = json.loads(body)
    edge, kept, ignored = parse_batch(obj, {"r01n01-iu0"}, obj["announcements"][0]["sent"])
    assert kept and not ignored
    assert json.loads(batch_json(edge, kept)) == obj


def test_announce_page_answer_is_read_as_the_edge_reads_it():
    (answer,) = [line for line in indented(section(ANNOUNCE.read_text(), "Answers")) if line.startswith("{")]
    assert read_answer(answer.encode(), [17, 18]) == (1, [18])


def counted_reasons() -> set[str]:
    """Every reason the agent's code counts an ignored announcement under (``ignored["..."] += ...``)."""
    sources = (REPO / "eas_wire" / "announce.py").read_text() + (REPO / "eas_agent" / "announce.py").read_text()
    return set(re.findall(r'ignored\["([a-z_]+)"\] \+=', sources))


def test_announce_page_lists_exactly_the_reasons_the_agent_counts():
    rows = {cell for cell in first_cells(section(ANNOUNCE.read_text(), "Answers")) if not cell.isdigit()}
    assert rows == set(IGNORED_REASONS) == counted_reasons()


def test_announce_page_limits_are_the_codes():
    rows = re.findall(r"^\| `([A-Z_]+)` \| ([\d.]+) .*\| `([\w/]+\.py)` \|$", section(ANNOUNCE.read_text(), "Limits"),
                      re.MULTILINE)
    assert {name for name, _, _ in rows} == {"MAX_BATCH_ITEMS", "MAX_BATCH_BYTES", "SENT_TOLERANCE_S",
                                             "MAX_ANNOUNCED_EDGES"}
    for name, value, path in rows:
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        assert getattr(module, name) == float(value), name


def test_scores_stream_page_constants_are_the_codes():
    rows = re.findall(r"^\| `([A-Z_]+)` \| `([^`]+)` \|", section(SCORES_STREAM.read_text(), "Constants"),
                      re.MULTILINE)
    assert {name for name, _ in rows} == {n for n in dir(stream) if n.isupper() and isinstance(
        getattr(stream, n), str | float)}
    for name, value in rows:
        expected = getattr(stream, name)
        assert (float(value) if isinstance(expected, float) else value) == expected, name


def test_scores_stream_page_example_is_bodies_and_a_heartbeat():
    page = section(SCORES_STREAM.read_text(), "`GET /scores?stream=1`: the stream (what the edge follows)")
    frames = [stream.read_frame(line.encode() + b"\n") for line in indented(page)]
    assert frames[1] is None and len(frames) == 3
    for frame in (frames[0], frames[2]):
        body, problems = ScoreBody.from_json(frame)
        assert not problems and stream.frame(body.dumps().encode()) == json.dumps(
            frame, separators=(",", ":")).encode() + stream.HEARTBEAT


def test_score_body_page_lists_exactly_the_declared_terms():
    rows = set(first_cells(section(SCORE_BODY.read_text(), "Declared components")))
    assert rows == set(DECLARED_TERMS)


PARSE_JSON = REPO / "docs" / "contracts" / "parse-json.md"


def test_parse_json_verdict_example_has_the_keys_the_cli_prints(capsys):
    """The `--profile` verdict object on the page, key for key, is what `preflight parse --json` prints."""
    from tests.helpers import run_cli

    section = PARSE_JSON.read_text().split("\n## verdict", 1)[1].split("\n## ", 1)[0]
    example = json.loads(section.split("```json\n", 1)[1].split("```", 1)[0])["verdict"]
    fixture = REPO / "tests" / "fixtures" / "preflight" / "nccl" / "h100-sxm-8gpu-all_reduce-g8-single-node.txt"
    _, out, _ = run_cli(capsys, "preflight", "parse", "nccl", str(fixture), "--profile", "h100-sxm", "--json")
    printed = json.loads(out)["verdict"]
    assert set(example) == set(printed)
    assert {key for result in example["results"] for key in result} == {key for r in printed["results"] for key in r}
