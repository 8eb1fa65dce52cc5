"""The parsers that used to live inside checks (mlnx-qos, systemctl-show, cpulist, cmdline, kernel-xids):
the rules their docstrings state, on real-format fixtures (goldens hold every fixture's whole JSON)."""

from __future__ import annotations

from pathlib import Path

import pytest

from preflight.parsers import ParseError, cmdline, cpulist, ib_health, kernel_log, mlnx_qos, systemctl_show
from preflight.parsers.common import Line

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures" / "preflight"
NOW = 1764547200.0  # 2025-12-01T00:00:00Z


def text(kind: str, name: str) -> str:
    return (FIXTURES / kind / name).read_text()


# ------------------------------------------------------------------------------------------ cpulist

def test_cpulist_ranges_singles_and_holes():
    parsed = cpulist.parse(text("cpulist", "cpus-4-and-6-offline-node0.txt"))
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


# ----------------------------------------------------------------------------------- systemctl-show

def test_systemctl_show_typed_sets_and_policy():
    unit = systemctl_show.parse(text("systemctl_show", "vllm-iu1-preferred-numa1-systemd255.txt")).units[0]
    assert (unit.load_state, unit.numa_policy, unit.numa_mask) == ("loaded", "preferred", (1,))
    assert unit.cpu_affinity == tuple(range(48, 96)) + tuple(range(144, 192))


def test_systemctl_show_unset_sets_are_empty_and_absent_ones_null():
    unit = systemctl_show.parse(text("systemctl_show", "vllm-iu0-unpinned-defaults.txt")).units[0]
    assert (unit.cpu_affinity, unit.numa_mask, unit.numa_policy) == ((), (), "n/a")
    only_state = systemctl_show.parse("LoadState=loaded\n").units[0]
    assert (only_state.cpu_affinity, only_state.numa_mask, only_state.numa_policy) == (None, None, None)


def test_systemctl_show_several_units_and_values_with_equals_signs():
    two = systemctl_show.parse(text("systemctl_show", "two-units-blank-line-between.txt")).units
    assert [u.get("Id") for u in two] == ["vllm-iu@0.service", "vllm-iu@1.service"]
    full = systemctl_show.parse(text("systemctl_show", "full-show-excerpt-without-p.txt")).units[0]
    assert full.get("ExecStart").startswith("{ path=/opt/vllm/bin/vllm ; argv[]=")


@pytest.mark.parametrize("bad", ["Running in chroot, ignoring command 'show'\n", "LoadState=loaded\nNUMAPol",
                                 "LoadState=loaded\nCPUAffinity=0-x\n", "Failed to connect to bus: No medium found\n"])
def test_systemctl_show_never_reads_an_unreadable_answer_as_no_properties(bad):
    with pytest.raises(ParseError):
        systemctl_show.parse(bad)


# ----------------------------------------------------------------------------------------- mlnx-qos

def test_mlnx_qos_trust_and_pfc_per_priority():
    qos = mlnx_qos.parse(text("mlnx_qos", "cx7-dscp-pfc-3-and-4.txt"))
    assert qos.trust == "dscp" and [p.priority for p in qos.pfc if p.enabled] == [3, 4]
    assert qos.pfc_enabled(3) is True and qos.pfc_enabled(0) is False and qos.pfc_enabled(9) is None
    no_buffer = mlnx_qos.parse(text("mlnx_qos", "cx5-no-buffer-row-pfc3.txt"))
    assert {p.buffer for p in no_buffer.pfc} == {None} and no_buffer.pfc_enabled(3)


@pytest.mark.parametrize("bad", [
    "Priority trust state: dscp\n",  # no PFC table
    "Priority trust state: both\nPFC configuration:\n\tpriority 0 1\n\tenabled 0 1\n",  # unknown trust state
    "Priority trust state: dscp\nPFC configuration:\n\tpriority 0 1 2\n\tenabled 0 1\n",  # short row
    "Priority trust state: dscp\nPFC configuration:\n\tpriority 0 1\n\tenabled 0 2\n",  # not 0/1
    "Priority trust state: dscp\nwhat is this\nPFC configuration:\n\tpriority 0\n\tenabled 1\n",
])
def test_mlnx_qos_is_strict(bad):
    with pytest.raises(ParseError):
        mlnx_qos.parse(bad)


# ------------------------------------------------------------------------------------------ cmdline

def test_cmdline_names_with_hyphens_last_value_wins_and_init_args():
    args = cmdline.parse(text("cmdline", "hyphenated-name-given-twice.txt"))
    assert args.value("intel_idle.max_cstate") == "1" and args.value("processor.max-cstate") == "1"
    quoted = cmdline.parse(text("cmdline", "quoted-value-and-init-args.txt"))
    assert quoted.params == {"root": "/dev/sda1", "dyndbg": "file drivers/usb/* +p"}
    assert quoted.flags == ["ro"] and quoted.args[-2:] == ["--", "single"]


@pytest.mark.parametrize("bad", ["ro quiet\n", 'root=/dev/sda ro x="y\n', "root=/ ro\nsecond line\n",
                                 "root=/dev/sda\x07 ro\n"])
def test_cmdline_is_strict(bad):
    with pytest.raises(ParseError):
        cmdline.parse(bad)


# -------------------------------------------------------------------------------------- kernel-xids

def test_xids_in_every_stamp_format():
    dmesg = kernel_log.parse_xids(text("kernel_xids", "dmesg-h100-xid79-fallen-off-bus.txt"), now=NOW)
    assert [(x.bus, x.xid, x.epoch) for x in dmesg.xids] == [("1b", 79, None)] and dmesg.lines_read == 4
    journal = kernel_log.parse_xids(text("kernel_xids", "journalctl-short-a100-xid48-dbe-xid63-remap.txt"), now=NOW)
    assert [(x.bus, x.xid) for x in journal.xids] == [("07", 48), ("07", 63)]  # the NVSwitch SXid is not a GPU XID
    human = kernel_log.parse_xids(text("kernel_xids", "dmesg-T-xid94-contained-ecc.txt"), now=NOW)
    assert human.xids[0].epoch == 1718012402.0  # [Mon Jun 10 09:40:02 2024]
    iso = kernel_log.parse_xids(text("kernel_xids", "syslog-rfc3339-xid31-two-gpus.txt"), now=NOW)
    assert [x.bus for x in iso.xids] == ["18", "2a"]


def test_an_empty_journal_window_is_real_but_unreadable_lines_are_errors():
    assert kernel_log.parse_xids("-- No entries --\n").xids == []
    for bad in ("dmesg: read kernel buffer failed: Operation not permitted\n",
                "[ 1.0] NVRM: Xid (PCI:0000:1b:00): 79, x\nNov 29 07:1"):
        with pytest.raises(ParseError):
            kernel_log.parse_xids(bad)


def test_kernel_links_refuses_dmesg_lines_it_cannot_place_in_the_flap_window():
    with pytest.raises(ParseError, match="no wall-clock time"):
        ib_health.parse_kernel_links("[ 5029.881102] ibp60s0: lost carrier\n", now=NOW)


def test_link_events_are_matched_whatever_their_case():
    """azurehpc-health-checks greps the log with -i; `Lost carrier` is the same event."""
    log = "".join(f"2025-11-30T23:50:00+00:00 r01n01 kernel: ibp60s0: {words}\n"
                  for words in ("Lost carrier", "LOST CARRIER", "lost carrier", "Link becomes ready"))
    events = ib_health.parse_kernel_links(log, now=NOW).events
    assert [(e.device, e.state) for e in events] == [("ibp60s0", "down")] * 3 + [("ibp60s0", "up")]


@pytest.mark.parametrize("stderr, gap", [
    (fixture := text("kernel_links", "garbage-journal-permission.txt"), fixture.splitlines()[0]),
    ("No journal files were found.\n", "No journal files were found."),
    ("No journal files were opened due to insufficient permissions.\n",
     "No journal files were opened due to insufficient permissions."),
    ("", None),
    ("Journal file /var/log/journal/x/system@0.journal~ corrupted, ignoring file.\n", None),
])
def test_journal_gap_is_journalctls_own_word_that_it_did_not_read_the_system_journal(stderr, gap):
    assert kernel_log.journal_gap(stderr) == gap


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
