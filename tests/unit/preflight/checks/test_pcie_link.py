"""preflight/checks/pcie_link.py: ``evaluate`` fed parsed facts directly (PASS, each FAIL mode), and ``gather`` through a scripted
transport (the commands it runs; unreadable output -> ERROR with an excerpt)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from preflight.checks import pcie_link
from preflight.parsers.ib_health import PcieLinkState
from preflight.profiles import profile_of
from preflight.result import Verdict
from preflight.transport import CommandResult
from tests.helpers.preflight import ScriptedTransport, context, fixture_text, node, only
from tests.helpers.preflight_checks import PROFILE, N, parsed, verdict

pytestmark = pytest.mark.unit


def pcie_facts(idle="h100-sxm-driver550-pci-performance-busy-gen5.txt", loaded=None, hcas=None, error=None):
    hcas = hcas if hcas is not None else {nic.device: PcieLinkState(5, 5, 16, 16) for nic in N.nics}
    return pcie_link.PcieFacts(parsed("nvsmi-pci", idle), parsed("nvsmi-pci", loaded) if loaded else None, error, hcas)


def test_pcie_healthy_gen5_x16_passes():
    assert verdict(pcie_link.CHECK.evaluate(pcie_facts(), PROFILE, N)) == (Verdict.PASS, "PCIE_OK")


def test_pcie_gpu_trained_x8_fails_width():
    result = pcie_link.CHECK.evaluate(pcie_facts("h100-sxm-gpu3-x8-width-downtrained.txt"), PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "PCIE_WIDTH") and "x8" in result.reason


def test_pcie_gpu_gen4_under_load_fails_gen():
    facts = pcie_facts("h200-sxm-gpu0-gen4-on-gen5-slot.txt")
    result = pcie_link.CHECK.evaluate(facts, PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "PCIE_GEN") and "Gen4" in result.reason


def test_pcie_idle_gen1_is_judged_by_the_reading_under_load():
    idle = "h100-sxm-driver550-idle-gen1-power-saving.txt"
    passed = pcie_link.CHECK.evaluate(pcie_facts(idle, loaded="h100-sxm-driver550-pci-performance-busy-gen5.txt"),
                                      PROFILE, N)
    assert verdict(passed) == (Verdict.PASS, "PCIE_OK")
    unverified = pcie_link.CHECK.evaluate(pcie_facts(idle, error="cannot start nvbandwidth"), PROFILE, N)
    assert verdict(unverified) == (Verdict.WARN, "PCIE_GEN_UNVERIFIED")


def test_pcie_hca_gen4_x8_and_missing_hca_fail():
    hcas = {"mlx5_0": PcieLinkState(gen=4, gen_max=5, width=8, width_max=16), "mlx5_1": None}
    result = pcie_link.CHECK.evaluate(pcie_facts(hcas=hcas), PROFILE, N)[0]
    assert result.verdict is Verdict.FAIL
    assert {p.split(":")[0] for p in result.evidence["problems"]} >= {"HCA mlx5_0 at x8, expected x16"}
    assert any("mlx5_1" in p for p in result.evidence["problems"])


def test_pcie_a100_profile_accepts_gen4():
    a100 = node(gpu_model="a100-sxm")
    facts = pcie_link.PcieFacts(parsed("nvsmi-pci", "a100-sxm4-driver535-gen4-x16.txt"), None, None, {})
    assert verdict(pcie_link.CHECK.evaluate(facts, profile_of(a100), a100)) == (Verdict.PASS, "PCIE_OK")


def test_pcie_gather_reads_under_load_only_when_idle_reads_low():
    busy = fixture_text("nvsmi_pci", "h100-sxm-driver550-pci-performance-busy-gen5.txt")
    idle = fixture_text("nvsmi_pci", "h100-sxm-driver550-idle-gen1-power-saving.txt")
    readings = iter([idle, busy])
    t = ScriptedTransport().on("n1", *pcie_link.NVSMI_PCI,
                               reply=lambda argv: CommandResult(0, next(readings), "", 0.0, argv=argv))
    t.on("n1", "grep", reply="".join(f"{p}:{v}\n" for nic in N.nics for p, v in
                                     zip(pcie_link.hca_paths(nic.device), ["32.0 GT/s PCIe", "16", "32.0 GT/s PCIe", "16"],
                                         strict=True)))
    pcie_link.LOAD_SETTLE_S, settle = 0.0, pcie_link.LOAD_SETTLE_S
    try:
        results = pcie_link.CHECK.run(context(t))
    finally:
        pcie_link.LOAD_SETTLE_S = settle
    assert verdict(results) == (Verdict.PASS, "PCIE_OK")
    assert t.started == [("n1", tuple(pcie_link.LOAD))] and t.stopped == t.started
    assert only(results).evidence["found"]["GPU0 (18:00.0)"]["read_under_load"] is True


def test_pcie_missing_hca_sysfs_fails_but_a_missing_grep_is_an_error():
    busy = fixture_text("nvsmi_pci", "h100-sxm-driver550-pci-performance-busy-gen5.txt")
    gone = CommandResult(2, "", "grep: /sys/class/infiniband/mlx5_0/device/current_link_speed: No such file or "
                                "directory", 0.0)
    t = ScriptedTransport().on("n1", *pcie_link.NVSMI_PCI, reply=busy).on("n1", "grep", reply=gone)
    result = pcie_link.CHECK.run(context(t))[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "PCIE_MISSING")
    t = ScriptedTransport().on("n1", *pcie_link.NVSMI_PCI, reply=busy)  # no grep: rc 127
    result = pcie_link.CHECK.run(context(t))[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER") and "exited 127" in result.reason


def test_pcie_gen4_host_slot_under_a_gen5_profile_fails_slot():
    """An A100 board's readings (Host Max 4) judged by the H100 profile: the slot cannot do Gen5."""
    facts = pcie_link.PcieFacts(parsed("nvsmi-pci", "a100-sxm4-driver535-gen4-x16.txt"), None, None, {})
    result = pcie_link.CHECK.evaluate(facts, PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "PCIE_SLOT")
    assert "slot (host side) max Gen4 < Gen5" in result.reason


def test_pcie_garbage_or_truncated_nvidia_smi_is_error_with_excerpt():
    for name, shown in (("garbage-no-devices-found.txt", "No devices were found"),
                        ("truncated-after-2-of-8-gpus.txt", "GPU 00000000")):
        text = fixture_text("nvsmi_pci", name)
        t = ScriptedTransport().on("n1", *pcie_link.NVSMI_PCI, reply=text)
        result = pcie_link.CHECK.run(context(t))[0]
        assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER"), name
        assert "cannot parse" in result.reason and shown in result.evidence["output"], name


def test_a_gpu_missing_from_nvidia_smi_fails_naming_it():
    """nvidia-smi listing 7 of the node's 8 GPUs (one fallen off the bus) passed as "7 GPUs ... at Gen5"."""
    facts = pcie_facts()
    short = pcie_link.PcieFacts(replace(facts.idle, gpus=facts.idle.gpus[:7]), None, None, facts.hcas)
    result = pcie_link.CHECK.evaluate(short, PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "PCIE_MISSING")
    assert "7 of 8 GPUs" in result.reason and "GPU7" in result.reason


def test_a_gpu_below_its_own_maximum_generation_fails_under_a_lower_profile():
    """The profile's generation is a floor, not the judgement: a GPU whose link can run Gen5 (its Max) and
    trained Gen4 under load passed on a Gen4 profile. As the width already was, it is judged against its own
    maximum too."""
    a100 = node(gpu_model="a100-sxm")
    facts = pcie_link.PcieFacts(parsed("nvsmi-pci", "h200-sxm-gpu0-gen4-on-gen5-slot.txt"), None, None, {})
    result = pcie_link.CHECK.evaluate(facts, profile_of(a100), a100)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "PCIE_GEN") and "GPU0" in result.reason
    assert "Gen4" in result.reason and "Gen5" in result.reason
