"""The contract pages under docs/contracts/ say what the code does: field tables match the code's accepted
fields both ways, and the examples on the page are accepted by the code."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import yaml

from eas_agent import config
from eas_agent.scorebody import CollectorRun, IUScore, ScoreBody

pytestmark = pytest.mark.unit

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
