"""The systemctl-show parser (preflight/parsers/systemctl_show.py): typed CPU and NUMA sets, several units,
and no unreadable answer read as a unit without properties."""

from __future__ import annotations

import pytest

from preflight.parsers import ParseError, systemctl_show
from tests.helpers.preflight import fixture_text

pytestmark = pytest.mark.unit


def test_systemctl_show_typed_sets_and_policy():
    unit = systemctl_show.parse(fixture_text("systemctl_show", "vllm-iu1-preferred-numa1-systemd255.txt")).units[0]
    assert (unit.load_state, unit.numa_policy, unit.numa_mask) == ("loaded", "preferred", (1,))
    assert unit.cpu_affinity == tuple(range(48, 96)) + tuple(range(144, 192))


def test_systemctl_show_unset_sets_are_empty_and_absent_ones_null():
    unit = systemctl_show.parse(fixture_text("systemctl_show", "vllm-iu0-unpinned-defaults.txt")).units[0]
    assert (unit.cpu_affinity, unit.numa_mask, unit.numa_policy) == ((), (), "n/a")
    only_state = systemctl_show.parse("LoadState=loaded\n").units[0]
    assert (only_state.cpu_affinity, only_state.numa_mask, only_state.numa_policy) == (None, None, None)


def test_systemctl_show_several_units_and_values_with_equals_signs():
    two = systemctl_show.parse(fixture_text("systemctl_show", "two-units-blank-line-between.txt")).units
    assert [u.get("Id") for u in two] == ["vllm-iu@0.service", "vllm-iu@1.service"]
    full = systemctl_show.parse(fixture_text("systemctl_show", "full-show-excerpt-without-p.txt")).units[0]
    assert full.get("ExecStart").startswith("{ path=/opt/vllm/bin/vllm ; argv[]=")


@pytest.mark.parametrize("bad", ["Running in chroot, ignoring command 'show'\n", "LoadState=loaded\nNUMAPol",
                                 "LoadState=loaded\nCPUAffinity=0-x\n", "Failed to connect to bus: No medium found\n"])
def test_systemctl_show_never_reads_an_unreadable_answer_as_no_properties(bad):
    with pytest.raises(ParseError):
        systemctl_show.parse(bad)
