"""preflight/checks/gpu_health.py: ``evaluate`` judged on facts built directly (NHC style: the facts of a fault, never fixture text
edited to produce one), ``gather`` through a scripted transport on canned real-format outputs (a healthy
node passes; unreadable output is an ERROR)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from preflight import parsers
from preflight.checks import (
    gpu_health,
)
from preflight.parsers.kernel_log import KernelXids, XidEvent
from preflight.profiles import profile_of
from preflight.result import Verdict
from preflight.transport import CommandResult
from tests.helpers.preflight import ScriptedTransport, context, fixture_text, node

pytestmark = pytest.mark.unit


def health_transport(q_text: str, kernel_log: str = "", fabric: str = "active\n") -> ScriptedTransport:
    return (
        ScriptedTransport()
        .on("n1", "nvidia-smi", "-q", reply=q_text)
        .on("n1", "journalctl", reply=kernel_log)
        .on("n1", "systemctl", "is-active", "nvidia-fabricmanager", reply=fabric)
    )


def clean_q() -> str:
    return fixture_text("nvsmi_q", "h100-sxm-driver535-full-q-clean.txt")


def test_healthy_gpus_pass():
    [result] = gpu_health.CHECK.run(context(health_transport(clean_q())))
    assert (result.verdict, result.code) == (Verdict.PASS, "GPU_HEALTH_OK")


def health_facts(report=None, xids=(), fabric_unit=None) -> gpu_health.GpuHealthFacts:
    """gpu_health's facts, built (NHC style): the clean H100 report unless given, XIDs as (bus, xid)."""
    events = [XidEvent(xid, f"0000:{bus}:00", None, n, f"NVRM: Xid (PCI:0000:{bus}:00): {xid}")
              for n, (bus, xid) in enumerate(xids, 1)]
    return gpu_health.GpuHealthFacts(report or parsers.parse("nvsmi-q", clean_q()),
                                     KernelXids(events, len(events)), fabric_unit)


def judge_health(facts: gpu_health.GpuHealthFacts):
    n = node()
    return gpu_health.CHECK.evaluate(facts, profile_of(n), n)


def with_gpus(report, **fields):
    """The report with every GPU's ``fields`` set (the first GPU's only with ``first_only``)."""
    first_only = fields.pop("first_only", False)
    gpus = [replace(g, **fields) if (i == 0 or not first_only) else g for i, g in enumerate(report.gpus)]
    return replace(report, gpus=gpus)


def test_uncorrectable_ecc_and_pending_remap_fail():
    text = fixture_text("nvsmi_q", "h100-sxm-driver550-dram-uncorrectable-remap-pending.txt")
    [result] = judge_health(health_facts(parsers.parse("nvsmi-q", text)))
    assert (result.verdict, result.code) == (Verdict.FAIL, "ECC_UNCORRECTABLE")
    assert any("row remap pending" in p for p in result.evidence["problems"])


def test_critical_xid_fails_and_other_xids_warn():
    bus = re.search(r"^GPU 0000\w{4}:(\w\w):", clean_q(), re.M).group(1).lower()  # first GPU's bus
    [result] = judge_health(health_facts(xids=[(bus, 79)]))
    assert (result.verdict, result.code) == (Verdict.FAIL, "XID_CRITICAL")
    assert result.reason.startswith("GPU0 (n1-iu0): critical XID 79")
    [result] = judge_health(health_facts(xids=[("c3", 13)]))
    assert (result.verdict, result.code) == (Verdict.WARN, "XID_OTHER")


def test_xids_in_the_kernel_log_are_gathered_through_journalctl():
    bus = re.search(r"^GPU 0000(\w{4}:\w\w):", clean_q(), re.M).group(1)  # first GPU's domain:bus
    critical = (
        f"Nov 29 07:12:01 n1 kernel: NVRM: Xid (PCI:{bus}:00): 79, pid=0, GPU has fallen off the bus.\n"
    )
    [result] = gpu_health.CHECK.run(context(health_transport(clean_q(), critical)))
    assert (result.verdict, result.code) == (Verdict.FAIL, "XID_CRITICAL")
    assert result.reason.startswith("GPU0 (n1-iu0): critical XID 79")


def test_kernel_log_falls_back_to_dmesg_without_a_journal():
    t = health_transport(clean_q()).on("n1", "journalctl", reply=(1, "No journal files were found."))
    t.on("n1", "dmesg", reply="[ 12.3] NVRM: Xid (PCI:0000:1b:00): 48, pid=1, DBE\n")
    [result] = gpu_health.CHECK.run(context(t))
    assert result.code == "XID_CRITICAL"
    assert t.called("n1", "dmesg")


def test_the_kernel_log_is_filtered_on_the_host_to_the_xid_lines():
    """the whole `journalctl -k` window came to the controller; journalctl's own
    `--grep` keeps the driver's XID lines only (what the kernel-xids parser counts), stamps as before."""
    t = health_transport(clean_q())
    [result] = gpu_health.CHECK.run(context(t))
    assert result.verdict is Verdict.PASS
    assert t.called("n1", "journalctl") == [
        ("journalctl", "-k", "--no-pager", "--since", "-24h", "--grep", "NVRM: Xid")]


@pytest.mark.parametrize("stdout", ["-- No entries --\n", ""])
def test_no_xid_in_the_window_is_journalctls_no_match_not_a_missing_journal(stdout):
    """`journalctl --grep` exits 1 when nothing matched (as grep does) and prints `-- No entries --` (nothing
    with -q): an empty window, not a reason to read this boot's whole ring buffer with dmesg."""
    t = health_transport(clean_q()).on("n1", "journalctl", reply=(1, stdout))
    [result] = gpu_health.CHECK.run(context(t))
    assert (result.verdict, result.code) == (Verdict.PASS, "GPU_HEALTH_OK")
    assert not t.called("n1", "dmesg")


HINT = ("Hint: You are currently not seeing messages from other users and the system.\n"
        "      Users in groups 'adm', 'systemd-journal' can see all messages.\n"
        "      Pass -q to turn off this notice.\n")


def test_a_journal_the_user_cannot_see_is_not_an_empty_window():
    """Preflight connects as the inventory's ansible_user, without sudo; outside systemd-journal and adm,
    journalctl reads that user's own journal, which has no kernel message. With -q it said nothing and exited 1
    (no match): no XID, a PASS that read no log. Without -q its hint comes back, and the XIDs are read from
    this boot's ring buffer instead; where dmesg is restricted too, an ERROR naming both."""
    journal = CommandResult(1, "-- No entries --\n", HINT, 0.0)
    t = health_transport(clean_q()).on("n1", "journalctl", reply=journal)
    t.on("n1", "dmesg", reply="[ 12.3] NVRM: Xid (PCI:0000:1b:00): 48, pid=1, DBE\n")
    [result] = gpu_health.CHECK.run(context(t))
    assert result.code == "XID_CRITICAL" and t.called("n1", "dmesg")
    t.on("n1", "dmesg", reply=(1, "dmesg: read kernel buffer failed: Operation not permitted\n"))
    [result] = gpu_health.CHECK.run(context(t))
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER")
    assert "not seeing messages" in result.reason and "dmesg" in result.reason


def test_a_truncated_kernel_log_is_an_error_naming_the_command_and_the_cap():
    """Output over the transport's cap is never judged: XIDs past the cap would vanish silently."""
    from preflight.transport import OUTPUT_CAP_BYTES, CommandResult

    line = "Nov 29 07:12:01 n1 kernel: NVRM: Xid (PCI:0000:1b:00): 13, pid=1, Graphics Exception\n"
    partial = CommandResult(None, line * 10, "", 0.0, truncated=True)
    t = health_transport(clean_q()).on("n1", "journalctl", reply=partial)
    [result] = gpu_health.CHECK.run(context(t))
    assert result.verdict is Verdict.ERROR
    assert result.reason.startswith(
        f"`journalctl -k --no-pager --since -24h --grep 'NVRM: Xid'` output over {OUTPUT_CAP_BYTES // 2**20} MiB, "
        "truncated: ")
    assert not t.called("n1", "dmesg")


def test_persistence_mode_off_fails():
    report = with_gpus(parsers.parse("nvsmi-q", clean_q()), persistence_mode="Disabled", first_only=True)
    [result] = judge_health(health_facts(report))
    assert (result.verdict, result.code) == (Verdict.FAIL, "PERSISTENCE_OFF")


def test_fabric_manager_down_on_an_nvswitch_board_fails():
    [result] = judge_health(health_facts(fabric_unit=gpu_health.FabricUnit("inactive", "inactive")))
    assert (result.verdict, result.code) == (Verdict.FAIL, "FABRIC_MANAGER_DOWN")
    [unknown] = judge_health(health_facts(fabric_unit=gpu_health.FabricUnit("", "Failed to connect to bus")))
    assert (unknown.verdict, unknown.code) == (Verdict.WARN, "FABRIC_UNKNOWN")


def test_gpu_fabric_state_is_read_where_the_driver_prints_it():
    fabric = (
        "    Fabric\n        State                             : In Progress\n"
        "        Status                            : N/A\n"
    )
    text = re.sub(r"(\n    Persistence Mode[^\n]*)", r"\1\n" + fabric.rstrip("\n"), clean_q())
    assert text.count("In Progress") == 8
    report = parsers.parse("nvsmi-q", text)  # the parser reads the section ...
    assert {(g.fabric_state, g.fabric_status) for g in report.gpus} == {("In Progress", "N/A")}
    [result] = judge_health(health_facts(report))  # ... and evaluate judges it, systemd not asked
    assert (result.verdict, result.code) == (Verdict.FAIL, "FABRIC_MANAGER_DOWN")
    assert "not trained" in result.reason
    trained = with_gpus(report, fabric_state="Completed", fabric_status="Success")
    assert judge_health(health_facts(trained))[0].verdict is Verdict.PASS


def test_one_gpu_block_of_eight_attached_is_an_error_not_a_pass():
    """The parser reads a whole lone block as `-q -i N`; gpu_health asked for every GPU, so the other 7
    are unknown: ERROR with an excerpt, never a PASS on one GPU's health."""
    text = fixture_text("nvsmi_q", "h100-sxm-driver550-i-3-one-gpu-remap-pending.txt")
    [result] = gpu_health.CHECK.run(context(health_transport(text)))
    assert result.verdict is Verdict.ERROR
    assert "printed 1 of 8 attached GPUs" in result.reason
    assert "GPU 00000000:5D:00.0" in result.evidence["output"]


def test_unparseable_nvidia_smi_q_is_an_error():
    t = health_transport(fixture_text("nvsmi_q", "truncated-after-3-of-8-gpus.txt"))
    [result] = gpu_health.CHECK.run(context(t))
    assert result.verdict is Verdict.ERROR
    assert "cannot parse" in result.reason


def test_systemctl_is_active_output_that_is_no_state_is_an_error():
    """The fabric manager's state goes through the systemctl-is-active parser: a stdout that is no unit
    state is an ERROR with the excerpt (it used to be a WARN "cannot tell"); an empty stdout (no systemd,
    the reason on stderr) still is FABRIC_UNKNOWN, and two lines for one unit are an ERROR."""
    def run(fabric):  # the clean H100 report prints no Fabric section: systemd is asked
        [result] = gpu_health.CHECK.run(context(health_transport(clean_q(), fabric=fabric)))
        return result

    chroot = run("Running in chroot, ignoring command 'is-active'\n")
    assert (chroot.verdict, chroot.code) == (Verdict.ERROR, "GATHER") and "Running in chroot" in chroot.evidence["output"]
    assert run((3, "active\ninactive\n")).verdict is Verdict.ERROR
    assert run((1, "")).code == "FABRIC_UNKNOWN"
    assert run((3, "inactive\n")).code == "FABRIC_MANAGER_DOWN"
    assert run("active\n").verdict is Verdict.PASS
