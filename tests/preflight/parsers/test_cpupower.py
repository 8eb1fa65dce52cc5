from pathlib import Path

import pytest

from preflight.parsers import ParseError, cpupower

DIR = Path(__file__).resolve().parents[2] / "fixtures" / "preflight" / "cpupower"


def load(name: str) -> cpupower.CpuIdleInfo:
    return cpupower.parse((DIR / name).read_text())


def states(info: cpupower.CpuIdleInfo) -> list[tuple[str, bool, int]]:
    return [(s.name, s.disabled, s.latency_us) for s in info.states]


def test_intel_idle_with_c6_disabled():
    info = load("intel-sapphire-rapids-intel_idle-c6-disabled.txt")
    assert (info.driver, info.governor) == ("intel_idle", "menu")
    assert states(info) == [("POLL", False, 0), ("C1", False, 1), ("C1E", False, 2), ("C6", True, 290)]
    assert info.to_json()["states"][3] == {"name": "C6", "disabled": True, "latency_us": 290}
    assert info.states[3].description == "MWAIT 0x20" and info.states[1].usage == 91280113


def test_icelake_all_enabled_old_spelling():
    info = load("intel-icelake-intel_idle-all-enabled.txt")
    assert states(info)[-1] == ("C6", False, 170) and not any(s.disabled for s in info.states)


def test_amd_acpi_idle():
    info = load("amd-epyc-genoa-acpi_idle-all-enabled.txt")
    assert info.driver == "acpi_idle" and [s.name for s in info.states] == ["POLL", "C1", "C2", "C3"]
    assert info.states[2].description == "ACPI IOPORT 0x814"
    assert states(load("amd-epyc-milan-acpi_idle-c2-disabled.txt"))[-1] == ("C2", True, 400)


def test_two_cpus_states_are_the_first_and_all_are_kept():
    info = load("intel-skylake-sp-deep-states-disabled-two-cpus.txt")
    assert sorted(info.cpus) == [0, 1] and info.states == info.cpus[0]
    assert [s.disabled for s in info.cpus[1]] == [False, False, True, True]
    assert info.to_json() == {"driver": "intel_idle", "states": [
        {"name": "POLL", "disabled": False, "latency_us": 0}, {"name": "C1", "disabled": False, "latency_us": 2},
        {"name": "C1E", "disabled": True, "latency_us": 10}, {"name": "C6", "disabled": True, "latency_us": 133}]}


def test_state_names_with_spaces():
    assert states(load("kvm-guest-haltpoll.txt")) == [("POLL", False, 0), ("haltpoll idle", False, 1)]


def test_cpuidle_off():
    assert load("cpuidle-off-no-driver.txt").to_json() == {"driver": None, "states": []}


def test_truncated_inside_a_state():
    with pytest.raises(ParseError) as info:
        load("truncated-inside-c1e.txt")
    assert info.value.line_no == 19 and "C1E" in info.value.message


def test_fewer_blocks_than_announced():
    text = (DIR / "amd-epyc-milan-acpi_idle-c2-disabled.txt").read_text().split("\n")
    with pytest.raises(ParseError) as info:
        cpupower.parse("\n".join(text[:16]))
    assert "2 of 3" in info.value.message


def test_garbage():
    with pytest.raises(ParseError) as info:
        load("garbage-linux-tools-missing.txt")
    assert info.value.line.startswith("WARNING: cpupower not found")


def test_two_runs_read_the_last():
    a = (DIR / "intel-icelake-intel_idle-all-enabled.txt").read_text()
    b = (DIR / "intel-sapphire-rapids-intel_idle-c6-disabled.txt").read_text()
    assert cpupower.parse(a + b).states[-1].disabled is True
    assert cpupower.parse(b + a).states[-1].disabled is False


def test_a_paste_without_its_header_is_read_when_every_state_is_there():
    whole = load("intel-sapphire-rapids-intel_idle-c6-disabled.txt")
    for name in ("headerless-from-analyzing-cpu.txt", "headerless-from-number-of-states.txt"):
        info = load(name)
        assert info.driver is None and states(info) == states(whole), name
        assert info.warnings[0].startswith("line 1: no 'CPUidle driver:'/'CPUidle governor:' header"), name
    assert "read as CPU 0's idle states" in load("headerless-from-number-of-states.txt").warnings[1]
    assert load("intel-sapphire-rapids-intel_idle-c6-disabled.txt").warnings == ()


def test_a_paste_without_its_header_and_missing_a_state_is_refused():
    text = (DIR / "headerless-from-analyzing-cpu.txt").read_text()
    cut = text[: text.index("C6 (DISABLED)")]
    with pytest.raises(ParseError, match="CPU 0 lists 3 of 4 idle states"):
        cpupower.parse(cut)


def test_a_driver_line_without_a_driver_and_with_states_is_still_refused():
    text = (DIR / "intel-sapphire-rapids-intel_idle-c6-disabled.txt").read_text()
    with pytest.raises(ParseError, match="idle states without a 'CPUidle driver:' line"):
        cpupower.parse(text.replace("CPUidle driver: intel_idle", "CPUidle driver:"))


def test_newer_cpupower_residency_lines_are_not_read_and_break_nothing():
    info = load("amd-bc250-acpi_idle-residency-lines-cpu12.txt")
    assert info.driver == "acpi_idle" and list(info.cpus) == [12]
    assert states(info) == [("POLL", False, 0), ("C1", False, 1), ("C2", False, 350), ("C3", False, 400)]


def test_silent_output_names_states_without_their_blocks_and_is_refused_naming_silent():
    with pytest.raises(ParseError, match=r"names its 4 idle states but shows none of them \(`cpupower idle-info "
                                         r"--silent`\?\)"):
        load("garbage-silent-amd-bc250-all-cpus-state-names-only.txt")
