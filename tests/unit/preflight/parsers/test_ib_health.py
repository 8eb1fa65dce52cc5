"""The InfiniBand health readers (preflight/parsers/ib_health.py): link events in the kernel log, PCIe link
attributes and port counters from sysfs."""

from __future__ import annotations

import pytest

from preflight.parsers import ParseError, ib_health
from tests.unit.preflight.parsers.test_kernel_log import NOW

pytestmark = pytest.mark.unit


def test_kernel_links_refuses_dmesg_lines_it_cannot_place_in_the_flap_window():
    with pytest.raises(ParseError, match="no wall-clock time"):
        ib_health.parse_kernel_links("[ 5029.881102] ibp60s0: lost carrier\n", now=NOW)


def test_link_events_are_matched_whatever_their_case():
    """azurehpc-health-checks greps the log with -i; `Lost carrier` is the same event."""
    log = "".join(f"2025-11-30T23:50:00+00:00 r01n01 kernel: ibp60s0: {words}\n"
                  for words in ("Lost carrier", "LOST CARRIER", "lost carrier", "Link becomes ready"))
    events = ib_health.parse_kernel_links(log, now=NOW).events
    assert [(e.device, e.state) for e in events] == [("ibp60s0", "down")] * 3 + [("ibp60s0", "up")]


def test_pcie_link_attributes_typed_from_sysfs():
    base = "/sys/class/infiniband/mlx5_0/device"
    values = ib_health.SysfsValues({f"{base}/current_link_speed": "16.0 GT/s PCIe", f"{base}/current_link_width": "8",
                                    f"{base}/max_link_speed": "32.0 GT/s PCIe", f"{base}/max_link_width": "16"})
    assert ib_health.pcie_link(values, base) == ib_health.PcieLinkState(gen=4, gen_max=5, width=8, width_max=16)
    down = ib_health.SysfsValues({f"{base}/current_link_speed": "Unknown", f"{base}/current_link_width": "0"})
    assert ib_health.pcie_link(down, base) == ib_health.PcieLinkState(None, None, 0, None)


def test_ib_counters_typed_and_unreadable_ones_none_never_zero():
    values = ib_health.parse_sysfs("/sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error:12\n"
                                   "/sys/class/infiniband/mlx5_0/ports/1/counters/link_downed:N/A\n")
    assert ib_health.counter_values(values) == {"/sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error": 12,
                                                "/sys/class/infiniband/mlx5_0/ports/1/counters/link_downed": None}
