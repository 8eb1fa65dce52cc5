"""The cpulist parser (preflight/parsers/cpulist.py): ranges, singles and holes, a CPU-less node, and the
formatter that writes what the parser reads."""

from __future__ import annotations

import pytest

from preflight.parsers import ParseError, cpulist
from preflight.parsers.common import Line
from tests.helpers.preflight import fixture_text

pytestmark = pytest.mark.unit


def test_cpulist_ranges_singles_and_holes():
    parsed = cpulist.parse(fixture_text("cpulist", "cpus-4-and-6-offline-node0.txt"))
    assert parsed.cpus[:6] == (0, 1, 2, 3, 5, 7) and len(parsed.cpus) == 94
    assert cpulist.format_cpus(parsed.cpus) == "0-3,5,7-47,96-143"


def test_cpulist_of_a_cpu_less_node_is_empty_but_no_output_is_an_error():
    assert cpulist.parse("\n").cpus == ()
    for bad in ("", "0-47 96-143\n", "47-0\n", "0-47\n48-95\n", "0-99999999\n"):
        with pytest.raises(ParseError):
            cpulist.parse(bad)


def test_formatter_round_trips_what_the_parser_reads():
    for cpus in ([0], [0, 1, 2, 5], list(range(56)) + list(range(112, 168)), []):
        formatted = cpulist.format_cpus(cpus)
        assert (cpulist.parse(formatted + "\n").cpus if cpus else ()) == tuple(cpus)
    assert cpulist.cpus_of("", Line(1, "CPUAffinity=")) == frozenset()
