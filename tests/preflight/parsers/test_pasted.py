"""Outputs as an on-call engineer pastes them (security review: pasted input): hand annotations after a value, elided
sections, tabs and collapsed spaces, prompt lines. Each pasted fixture is an existing fixture with those
edits (tests/fixtures/preflight/<kind>/SOURCES.md lists them); it must parse to the same values, with one
warning per thing ignored, and never to null where the value is in the text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from preflight.parsers import ParseError, parse, paste_warnings, to_contract_json

FIXTURES = Path(__file__).parents[2] / "fixtures" / "preflight"

PASTED = {
    # kind: (original fixture, pasted fixture, warnings expected)
    "chrony": ("aws-time-sync-linklocal-chrony4.2-normal.txt", "pasted-annotated-elided-tab.txt", 3),
    "cpupower": ("intel-sapphire-rapids-intel_idle-c6-disabled.txt", "pasted-annotated-elided-tab.txt", 3),
    "ibping": ("h100-ndr-rdma-core50-count10-ok.txt", "pasted-annotated-elided.txt", 3),
    "ibstat": ("a100-dgx-cx6-hdr200-one-port-down-polling.txt", "pasted-annotated-elided-spaces.txt", 3),
    "perftest": ("h100-ndr-ib_write_lat-perftest23.txt", "pasted-annotated-elided-collapsed.txt", 3),
    "topo": ("h100-sxm-hgx-driver535-nic-legend.txt", "pasted-annotated-elided-tabs.txt", 2),
    "nvsmi-q": ("h100-sxm-driver550-i-3-one-gpu-remap-pending.txt", "pasted-remap-pending-annotated.txt", 2),
    "nccl": ("h100-sxm-8gpu-all_reduce-g8-single-node.txt", "pasted-annotated-elided-collapsed.txt", 2),
}


# Kinds added after the issue: one pasted fixture per damage, each made from the original fixture (SOURCES.md of
# the kind says how). kind: (original, {pasted fixture: (warnings expected, what the elision removed or None)}).
# What an elision removed is missing from the result, and only that: (key of the list, key of its items, values).
# (Or a function of the original's result giving the expected one.)
PASTED_EACH: dict[str, tuple[str, dict[str, tuple[int, Any]]]] = {
    "nvlink-status": ("h200-sxm-gpu6-two-links-inactive.txt", {
        "pasted-annotated-prompt.txt": (3, None),
        "pasted-elided-gpus-1-2.txt": (1, ("gpus", "index", (1, 2))),
        "pasted-tabs.txt": (0, None),
    }),
    "mlxlink": ("cx7-ndr-effective-ber-3E-10.txt", {
        "pasted-annotated-prompt.txt": (3, None),
        "pasted-elided-sections.txt": (1, None),  # Supported and Troubleshooting Info: no value of the contract
        "pasted-tabs-collapsed.txt": (0, None),
    }),
    "nvbandwidth": ("h200-sxm-gpu2-h2d-21gbps.txt", {
        "pasted-annotated-prompt.txt": (3, None),
        "pasted-elided-devices.txt": (1, None),  # Device 2-6 lines: the device list is no value of the contract
        "pasted-tabs-collapsed.txt": (0, None),
    }),
    "dcgm-diag": ("dcgm3.3-h100-r2-memory-fail-gpu3.txt", {
        "pasted-annotated-prompt.txt": (3, None),
        # a [snip] between the prompt and the JSON, and the memory test's GPUs 4-6 as "..."
        "pasted-elided-gpus-4-6.txt": (2, lambda want: _without_results(want, "memory", (4, 5, 6))),
        "pasted-tabs-collapsed.txt": (0, None),
    }),
    "nvsmi-pci": ("h100-sxm-gpu3-x8-width-downtrained.txt", {
        "pasted-annotated-prompt.txt": (3, None),
        "pasted-elided-gpus-2a-3a.txt": (1, ("gpus", "bus_id", ("00000000:2A:00.0", "00000000:3A:00.0"))),
        "pasted-tabs-collapsed.txt": (0, None),
    }),
    "nvsmi-perf": ("h100-sxm-gpu0-hw-thermal-slowdown.txt", {
        "pasted-annotated-prompt.txt": (3, None),
        "pasted-elided-gpus-2a-3a.txt": (1, ("gpus", "bus_id", ("00000000:2A:00.0", "00000000:3A:00.0"))),
        "pasted-tabs-collapsed.txt": (0, None),
    }),
}


def _without_results(want: dict, test: str, gpus: tuple[int, ...]) -> dict:
    for entry in want["tests"]:
        if entry["name"] == test:
            entry["results"] = [r for r in entry["results"] if r["gpu"] not in gpus]
    return want


def read(kind: str, name: str) -> str:
    return (FIXTURES / kind.replace("-", "_") / name).read_text()


@pytest.mark.parametrize("kind", sorted(PASTED))
def test_pasted_output_parses_to_the_same_values_with_warnings(kind):
    original, pasted, n_warnings = PASTED[kind]
    want = to_contract_json(kind, parse(kind, read(kind, original)))
    text = read(kind, pasted)
    got = to_contract_json(kind, parse(kind, text))
    if kind == "nccl":  # three rows were elided in the paste: exactly those are missing
        want["rows"] = [r for r in want["rows"] if r["size_bytes"] not in (16, 32, 64)]
    assert got == want
    warnings = paste_warnings(text)
    assert len(warnings) == n_warnings, warnings
    assert all(w.startswith("line ") for w in warnings)


@pytest.mark.parametrize("kind, pasted", [(k, p) for k in sorted(PASTED_EACH) for p in sorted(PASTED_EACH[k][1])])
def test_each_paste_damage_gives_the_real_values_and_a_warning_per_thing_ignored(kind, pasted):
    """An annotated paste (with its prompt line), an elided one and a tab-damaged one, each on its own: the same
    values as the tool's own output (minus exactly what was elided), one warning per annotation or elision."""
    original, cases = PASTED_EACH[kind]
    n_warnings, elided = cases[pasted]
    want = to_contract_json(kind, parse(kind, read(kind, original)))
    if callable(elided):
        want = elided(want)
    elif elided is not None:
        key, item_key, gone = elided
        want[key] = [item for item in want[key] if item[item_key] not in gone]
    text = read(kind, pasted)
    assert to_contract_json(kind, parse(kind, text)) == want
    warnings = paste_warnings(text)
    assert len(warnings) == n_warnings, warnings
    assert all(w.startswith("line ") for w in warnings)


def test_remap_pending_with_an_arrow_is_true_not_null():
    """The issue's case: "Pending : Yes   <===" was read as null (no remap pending known)."""
    gpu = parse("nvsmi-q", read("nvsmi-q", "pasted-remap-pending-annotated.txt")).gpus[0]
    assert gpu.remap_pending is True and gpu.remap_failure is False


@pytest.mark.parametrize("word", ["Maybe", "Yes?", "Pending"])
def test_unknown_yes_no_word_is_an_error_naming_the_line(word):
    text = read("nvsmi-q", "h100-sxm-driver550-i-3-one-gpu-remap-pending.txt")
    text = text.replace("Pending                           : Yes", f"Pending                           : {word}")
    with pytest.raises(ParseError) as caught:
        parse("nvsmi-q", text)
    assert "not Yes or No" in str(caught.value) and caught.value.line_no > 0


@pytest.mark.parametrize(
    "line, value, note",
    [
        ("Pending : Yes   <===", "Pending : Yes", "<==="),
        ("Pending : Yes <-- this", "Pending : Yes", "<-- this"),
        ("Failure : none  # comment", "Failure : none", "# comment"),
        ("Stratum : 4 (this one)", "Stratum : 4", "(this one)"),
        ("Reference ID : A9FEA97B (169.254.169.123)", "Reference ID : A9FEA97B (169.254.169.123)", ""),
        ("  NV#  = Connection traversing a bonded set of # NVLinks", None, ""),
        ("#       size         count      type   redop    root     time   algbw   busbw #wrong", None, ""),
        ("Pong from r01n02.(none) (Lid 1202): time 0.004 ms", None, ""),
    ],
)
def test_annotations_are_cut_and_tool_text_is_kept(line, value, note):
    from preflight.parsers.common import paste_lines

    kept, warnings = paste_lines(line)
    assert kept[0].text == (line if value is None else value)
    assert bool(warnings) == bool(note) and (not note or note in warnings[0])


@pytest.mark.parametrize("marker", ["...", "…", "[snip]", "<snip>", "[...]", "-- snip --", "[... 40 lines omitted ...]"])
def test_elision_lines_are_dropped_and_reported(marker):
    from preflight.parsers.common import paste_lines

    kept, warnings = paste_lines(f"a: 1\n{marker}\nb: 2")
    assert [(line.no, line.text) for line in kept] == [(1, "a: 1"), (3, "b: 2")]
    assert warnings and warnings[0].startswith("line 2:")


def test_clean_fixtures_have_no_warnings():
    """No false positives: not one of the existing real outputs is taken for a paste annotation."""
    for path in sorted(FIXTURES.rglob("*.txt")):
        if not path.name.startswith("pasted-"):
            assert paste_warnings(path.read_text(errors="replace")) == [], path
