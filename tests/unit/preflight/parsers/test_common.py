"""Shared behaviour of every parser: normalisation, ParseError, the registry, and robustness on every
fixture cut at every line (a parser returns a result or raises ParseError, never anything else)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from preflight.parsers import PARSERS, ParseError, parse, to_contract_json
from preflight.parsers.common import lines

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "preflight"
KIND_DIRS = {kind: FIXTURES / kind.replace("-", "_") for kind in PARSERS}


def test_registry_has_exactly_the_contract_kinds():
    assert sorted(PARSERS) == [
        "chrony", "cmdline", "cpulist", "cpupower", "date-epoch", "dcgm-diag", "dpkg-version", "ecn-switch",
        "fabricmanager-version", "ibping", "ibstat", "kernel-links", "kernel-xids", "mlnx-qos", "mlxlink", "mokutil-sb-state", "nccl",
        "nvbandwidth", "nvlink-errors", "nvlink-status", "nvsmi-pci", "nvsmi-perf", "nvsmi-q", "ofed-info",
        "os-release", "perftest", "pm-qos", "sysfs", "systemctl-is-active", "systemctl-show", "topo",
    ]


def test_lines_strip_ansi_crlf_and_launcher_prefixes():
    text = "\x1b[1;32mGPU0\x1b[0m\tX\r\n[1,0]<stdout>:# Avg bus bandwidth    : 1.5\r\n 3: rtt min/avg/max\n12: a"
    assert [line.text for line in lines(text)] == ["GPU0\tX", "# Avg bus bandwidth    : 1.5", "rtt min/avg/max", "a"]
    assert [line.no for line in lines(text)] == [1, 2, 3, 4]


def test_lines_keep_tabs_and_text_that_only_looks_like_a_prefix():
    assert lines("Latency: 2\n\tRate: 400")[1].text == "\tRate: 400"
    assert lines("Latency: 2")[0].text == "Latency: 2"


def test_parse_error_is_one_line_naming_the_line():
    error = ParseError(7, "a\tb", "bad thing")
    assert str(error) == "line 7: bad thing: 'a\\tb'"
    assert (error.line_no, error.line, error.message) == (7, "a\tb", "bad thing")


def test_to_contract_json_rejects_unknown_kind():
    with pytest.raises(KeyError):
        to_contract_json("nvsmi", object())


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_every_kind_has_six_samples_plus_truncated_and_garbage(kind):
    names = [path.name for path in KIND_DIRS[kind].glob("*.txt")]
    samples = [name for name in names if not name.startswith(("truncated", "garbage", "broken"))]
    assert len(samples) >= 6, samples
    assert any(name.startswith("truncated") for name in names)
    assert any(name.startswith("garbage") for name in names)
    assert (KIND_DIRS[kind] / "SOURCES.md").is_file()


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_garbage_and_empty_input_raise_parse_error(kind):
    for text in ["", "\n\n", "hello world\n", "\x00\x01\x02 binary \xff\n", "Segmentation fault (core dumped)\n"]:
        with pytest.raises(ParseError):
            parse(kind, text)


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_any_prefix_of_any_fixture_parses_or_raises_parse_error(kind):
    """A cut at any line (a dropped SSH session, a partial paste) never escapes as another exception."""
    for path in sorted(KIND_DIRS[kind].glob("*.txt")):
        all_lines = path.read_text().split("\n")
        for cut in range(len(all_lines) + 1):
            try:
                parse(kind, "\n".join(all_lines[:cut]))
            except ParseError:
                pass


@pytest.mark.parametrize("kind", sorted(PARSERS))
def test_shuffled_and_mutated_lines_parse_or_raise_parse_error(kind):
    rng = random.Random(4)
    for path in sorted(KIND_DIRS[kind].glob("*.txt")):
        all_lines = path.read_text().split("\n")
        for _ in range(20):
            mutated = list(all_lines)
            index = rng.randrange(len(mutated))
            mutated[index] = mutated[index].replace(rng.choice("0123456789 :.X"), rng.choice(["", "x", "N/A", "-"]))
            if rng.random() < 0.3:
                rng.shuffle(mutated)
            try:
                parse(kind, "\n".join(mutated))
            except ParseError:
                pass


def test_non_breaking_spaces_are_spaces_with_one_warning_for_every_line():
    from preflight.parsers.common import paste_lines

    kept, warnings = paste_lines("a\u00a0\u00a0b\nc d\ne\u202ff\u2007g\n")
    assert [line.text for line in kept] == ["a  b", "c d", "e f g", ""]
    assert warnings == ["line 1: read non-breaking spaces as spaces (and 1 more line): a copy from a web page or chat"]


def test_parse_warnings_are_the_paste_and_the_parser_warnings_in_line_order():
    from preflight.parsers import parse_warnings

    class Parsed:
        warnings = ("line 3: row GPU1 has 4 cells, expected 5 (cells run together?): no facts taken from it",)

    text = "$ nvidia-smi topo -m\nx\ny\nz  <== here\n"
    assert [w.split(":")[0] for w in parse_warnings(text, Parsed())] == ["line 1", "line 3", "line 4"]
    assert parse_warnings(text, object()) == [w for w in parse_warnings(text, Parsed()) if "row GPU1" not in w]
