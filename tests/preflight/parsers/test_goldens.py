"""Parser goldens: every fixture ``tests/fixtures/preflight/<kind>/<name>.txt`` has ``<name>.json`` beside
it holding exactly what ``clusterctl preflight parse <kind> <name>.txt --json`` prints (the contract
object with its ``warnings``), or ``{"error": "<the one-line ParseError>"}`` for a fixture the parser
rejects (truncated-*, garbage-*). Goldens are discovered, not listed: a new ``.txt`` without its
``.json`` fails here.

To write or refresh the goldens after a deliberate parser change, run::

    CLUSTERCTL_UPDATE_GOLDENS=1 .venv/bin/python -m pytest -q tests/preflight/parsers/test_goldens.py

then review ``git diff tests/fixtures/preflight`` like code: every changed value is a behaviour change.

The kernel-log kinds read BSD syslog stamps, which carry no year, relative to "now"; the goldens use a
fixed now (``NOW``) so that they do not change at New Year.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from preflight.parsers import PARSERS, ParseError, parse_warnings, to_contract_json

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "preflight"
UPDATE = os.environ.get("CLUSTERCTL_UPDATE_GOLDENS") == "1"
NOW = 1764547200.0  # 2025-12-01T00:00:00Z
KIND_OF_DIR = {kind.replace("-", "_"): kind for kind in PARSERS}
WITH_NOW = ("kernel-links", "kernel-xids")


def cases() -> list[tuple[str, Path]]:
    return [(KIND_OF_DIR[path.parent.name], path) for path in sorted(FIXTURES.glob("*/*.txt"))
            if path.parent.name in KIND_OF_DIR]


def golden_of(kind: str, text: str) -> dict:
    parser = PARSERS[kind]
    try:
        result = parser(text, now=NOW) if kind in WITH_NOW else parser(text)
    except ParseError as exc:
        return {"error": str(exc)}
    return to_contract_json(kind, result, parse_warnings(text, result))


def test_every_fixture_directory_is_a_registered_kind():
    assert sorted(p.name for p in FIXTURES.iterdir() if p.is_dir()) == sorted(KIND_OF_DIR)


def test_no_golden_without_its_fixture():
    orphans = [p.relative_to(FIXTURES) for p in FIXTURES.glob("*/*.json") if not p.with_suffix(".txt").is_file()]
    assert orphans == []


@pytest.mark.parametrize("kind, path", cases(), ids=lambda v: v if isinstance(v, str) else v.name)
def test_parser_output_equals_its_golden(kind, path):
    got = golden_of(kind, path.read_text())
    golden = path.with_suffix(".json")
    if UPDATE:
        golden.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert golden.is_file(), f"{golden.relative_to(FIXTURES)} missing: run with CLUSTERCTL_UPDATE_GOLDENS=1"
    assert json.loads(golden.read_text()) == got


@pytest.mark.parametrize("name", ["truncated", "garbage"])
def test_every_kind_rejects_its_broken_fixtures(name):
    """The broken fixtures' goldens are errors (a golden that "parsed" a garbage file would be a bug)."""
    for _kind, path in cases():
        if path.name.startswith(name):
            assert "error" in json.loads(path.with_suffix(".json").read_text()), path.name


def test_the_contract_document_names_every_kind():
    contract = (FIXTURES.parents[2] / "docs" / "contracts" / "parse-json.md").read_text()
    missing = [kind for kind in PARSERS if not re.search(rf"^## {re.escape(kind)}(\s|$)", contract, re.MULTILINE)]
    assert missing == []


@pytest.mark.parametrize("kind", sorted(set(PARSERS) - set(WITH_NOW)))
def test_the_cli_prints_the_golden(capsys, kind):
    """`clusterctl preflight parse KIND FILE --json` is the golden, for one sample of every kind."""
    from cli.main import main

    path = next(p for k, p in cases() if k == kind and not p.name.startswith(("truncated", "garbage")))
    main(["preflight", "parse", kind, str(path), "--json"])
    captured = capsys.readouterr()
    assert captured.err == "" and json.loads(captured.out) == json.loads(path.with_suffix(".json").read_text())


@pytest.mark.parametrize("kind, name", [("kernel-links", "rfc3339-syslog-ubuntu24-ipoib-two-flaps.txt"),
                                        ("kernel-links", "journalctl-short-iso-mlx5e-roce-link-down-up.txt")])
def test_the_cli_prints_the_golden_for_the_kernel_log_kinds_on_stamps_with_a_year(capsys, kind, name):
    """The kernel-log kinds are left out above (BSD stamps have no year: the CLI reads them against the real
    now, the goldens against NOW); RFC 3339 and short-iso stamps carry their year, so the CLI prints the golden."""
    from cli.main import main

    path = FIXTURES / kind.replace("-", "_") / name
    main(["preflight", "parse", kind, str(path), "--json"])
    captured = capsys.readouterr()
    assert captured.err == "" and json.loads(captured.out) == json.loads(path.with_suffix(".json").read_text())
    assert json.loads(captured.out)["events"]
