import re
from pathlib import Path

import pytest

from preflight.parsers import ParseError, nvsmi_q

DIR = Path(__file__).resolve().parents[2] / "fixtures" / "preflight" / "nvsmi_q"


def load(name: str) -> nvsmi_q.NvsmiReport:
    return nvsmi_q.parse((DIR / name).read_text())


def test_a100_clean_filtered_output():
    r = load("a100-sxm4-80gb-driver470-d-ecc-clean.txt")
    assert len(r.gpus) == 8 and r.driver_version == "470.199.02" and r.cuda_version == "11.4"
    assert r.gpus[0].to_json() == {"bus_id": "00000000:07:00.0", "ecc_mode_current": "Enabled",
                                   "volatile_uncorrectable": 0, "aggregate_uncorrectable": 0,
                                   "remap_pending": False, "remap_failure": False, "retired_pages_pending": None}
    assert r.gpu("47:00.0").aggregate_correctable == 3


def test_a100_remap_pending_after_correctable_errors():
    r = load("a100-sxm4-80gb-driver510-remap-pending-correctable.txt")
    pending = [g.bus_id for g in r.gpus if g.remap_pending]
    assert pending == ["00000000:90:00.0"]
    gpu = r.gpu("00000000:90:00.0")
    assert (gpu.volatile_correctable, gpu.remapped_correctable, gpu.volatile_uncorrectable) == (177, 1, 0)


def test_h100_full_q_sections_around_ecc():
    r = load("h100-sxm-driver535-full-q-clean.txt")
    assert {g.product_name for g in r.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {(g.volatile_uncorrectable, g.aggregate_uncorrectable, g.remap_pending) for g in r.gpus} == {(0, 0, False)}
    assert r.gpus[2].aggregate_correctable == 1


def test_h100_dram_uncorrectable_and_pending_remap():
    gpu = load("h100-sxm-driver550-dram-uncorrectable-remap-pending.txt").gpu("5D:00.0")
    assert (gpu.volatile_uncorrectable, gpu.remap_pending, gpu.remapped_uncorrectable) == (2, True, 2)


def test_h200_remap_failure_and_sram_sources_not_double_counted():
    gpu = load("h200-sxm-driver550-remap-failure-sram-secded.txt").gpu("BA:00.0")
    assert (gpu.volatile_uncorrectable, gpu.aggregate_uncorrectable, gpu.remap_failure) == (1, 10, True)


def test_ecc_disabled_counts_are_null_not_zero():
    r = load("a100-pcie-driver525-ecc-disabled.txt")
    assert {(g.ecc_mode_current, g.volatile_uncorrectable, g.aggregate_uncorrectable) for g in r.gpus} == {
        ("Disabled", None, None)}


def test_legacy_single_double_bit_and_retired_pages():
    r = load("v100-sxm2-driver418-legacy-double-bit-retired-pending.txt")
    bad = r.gpu("07:00.0")
    assert (bad.volatile_uncorrectable, bad.aggregate_correctable, bad.retired_pages_pending) == (1, 14, True)
    assert (bad.remap_pending, bad.remap_failure) == (None, None)
    assert r.gpu("06:00.0").retired_pages_pending is False


def test_remapped_rows_na():
    text = ("GPU 00000000:3B:00.0\n    ECC Mode\n        Current                           : Enabled\n"
            "    Remapped Rows                         : N/A\n")
    gpu = nvsmi_q.parse(text).gpus[0]
    assert (gpu.remap_pending, gpu.remap_failure, gpu.volatile_uncorrectable) == (None, None, None)


def test_truncated_names_the_last_line():
    with pytest.raises(ParseError) as info:
        load("truncated-after-3-of-8-gpus.txt")
    assert "3 of 8" in info.value.message and info.value.line_no == 217


def test_garbage():
    with pytest.raises(ParseError) as info:
        load("garbage-no-devices-found.txt")
    assert info.value.line == "No devices were found"


def test_last_gpu_missing_a_section_is_truncated():
    text = (DIR / "a100-pcie-driver525-ecc-disabled.txt").read_text().split("\n")
    cut = text[: text.index("GPU 00000000:D8:00.0") + 4]
    with pytest.raises(ParseError) as info:
        nvsmi_q.parse("\n".join(line for line in cut if not line.startswith("Attached GPUs")))
    assert "D8:00.0" in info.value.message


def test_non_numeric_counter():
    text = re.sub(r"(DRAM Uncorrectable +: )0", r"\1many", (DIR / "a100-sxm4-80gb-driver470-d-ecc-clean.txt").read_text(),
                  count=1)
    with pytest.raises(ParseError) as info:
        nvsmi_q.parse(text)
    assert "many" in info.value.line


def test_two_outputs_read_the_last_complete():
    a = (DIR / "a100-sxm4-80gb-driver470-d-ecc-clean.txt").read_text()
    b = (DIR / "h100-sxm-driver550-dram-uncorrectable-remap-pending.txt").read_text()
    cut = (DIR / "truncated-after-3-of-8-gpus.txt").read_text()
    assert nvsmi_q.parse(a + b).driver_version == "550.90.07"
    assert nvsmi_q.parse(b + a).driver_version == "470.199.02"
    assert nvsmi_q.parse(a + cut).driver_version == "470.199.02"


def test_gpu_blocks_without_the_log_header():
    text = (DIR / "a100-pcie-driver525-ecc-disabled.txt").read_text()
    body = text[text.index("GPU 00000000:3B:00.0"):]
    assert [g.bus_id for g in nvsmi_q.parse(body).gpus] == ["00000000:3B:00.0", "00000000:D8:00.0"]


def test_one_gpu_query_is_not_truncation():
    """`nvidia-smi -q -i 3`: the header still counts 8 attached GPUs; the one block is whole."""
    report = load("h100-sxm-driver550-i-3-one-gpu-remap-pending.txt")
    assert [g.bus_id for g in report.gpus] == ["00000000:5D:00.0"]
    assert report.attached == 8
    gpu = report.gpus[0]
    assert (gpu.volatile_uncorrectable, gpu.remap_pending) == (2, True)


def test_one_gpu_cut_before_its_health_sections_is_truncated():
    text = (DIR / "h100-sxm-driver550-i-3-one-gpu-remap-pending.txt").read_text().split("\n")
    cut = "\n".join(text[: text.index("    ECC Errors")])
    with pytest.raises(ParseError) as info:
        nvsmi_q.parse(cut)
    assert "1 of 8" in info.value.message


def test_whole_output_keeps_the_attached_count():
    assert load("h100-sxm-driver550-dram-uncorrectable-remap-pending.txt").attached == 8


def test_an_elided_paste_is_read_as_far_as_it_goes_naming_the_gpus_not_shown():
    report = load("pasted-first-and-last-of-8-gpus-elided-between.txt")
    whole = load("h100-sxm-driver535-full-q-clean.txt")
    assert [g.bus_id for g in report.gpus] == [whole.gpus[0].bus_id, whole.gpus[7].bus_id]
    assert report.gpus == [whole.gpus[0], whole.gpus[7]] and report.attached == 8
    assert report.warnings == ("line 80: lines elided: 2 of 8 attached GPUs shown, no facts about the other 6",)


def test_an_elided_section_is_null_and_named():
    report = load("pasted-elided-after-first-gpu-ecc-mode.txt")
    (gpu,) = report.gpus
    assert gpu.ecc_mode_current == "Enabled" and gpu.volatile_uncorrectable is None and gpu.remap_pending is None
    assert any("GPU 00000000:18:00.0 shows no ECC Errors section" in w for w in report.warnings)
    assert any("1 of 8 attached GPUs shown" in w for w in report.warnings)


def test_the_same_shortfall_without_an_elision_marker_is_still_a_cut_output():
    text = (DIR / "pasted-first-and-last-of-8-gpus-elided-between.txt").read_text().replace("\n...\n", "\n\n")
    with pytest.raises(ParseError, match="output ends after 2 of 8 attached GPUs"):
        nvsmi_q.parse(text)
