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
    # kind: (original fixture, pasted fixture, warnings expected: each includes the prompt line on line 1)
    "chrony": ("aws-time-sync-linklocal-chrony4.2-normal.txt", "pasted-annotated-elided-tab.txt", 4),
    "cpupower": ("intel-sapphire-rapids-intel_idle-c6-disabled.txt", "pasted-annotated-elided-tab.txt", 4),
    "ibping": ("h100-ndr-rdma-core50-count10-ok.txt", "pasted-annotated-elided.txt", 4),
    "ibstat": ("a100-dgx-cx6-hdr200-one-port-down-polling.txt", "pasted-annotated-elided-spaces.txt", 4),
    "perftest": ("h100-ndr-ib_write_lat-perftest23.txt", "pasted-annotated-elided-collapsed.txt", 4),
    "topo": ("h100-sxm-hgx-driver535-nic-legend.txt", "pasted-annotated-elided-tabs.txt", 3),
    "nvsmi-q": ("h100-sxm-driver550-i-3-one-gpu-remap-pending.txt", "pasted-remap-pending-annotated.txt", 3),
    "nccl": ("h100-sxm-8gpu-all_reduce-g8-single-node.txt", "pasted-annotated-elided-collapsed.txt", 3),
}


# Kinds added after the issue: one pasted fixture per damage, each made from the original fixture (SOURCES.md of
# the kind says how). kind: (original, {pasted fixture: (warnings expected, what the elision removed or None)}).
# What an elision removed is missing from the result, and only that: (key of the list, key of its items, values).
# The warnings expected count the prompt line of the annotated-prompt (and dcgm-diag's elided) fixtures.
# (Or a function of the original's result giving the expected one.)
PASTED_EACH: dict[str, tuple[str, dict[str, tuple[int, Any]]]] = {
    "nvlink-status": ("h200-sxm-gpu6-two-links-inactive.txt", {
        "pasted-annotated-prompt.txt": (4, None),
        "pasted-elided-gpus-1-2.txt": (1, ("gpus", "index", (1, 2))),
        "pasted-tabs.txt": (0, None),
    }),
    "mlxlink": ("cx7-ndr-effective-ber-3E-10.txt", {
        "pasted-annotated-prompt.txt": (4, None),
        "pasted-elided-sections.txt": (1, None),  # Supported and Troubleshooting Info: no value of the contract
        "pasted-tabs-collapsed.txt": (0, None),
    }),
    "nvbandwidth": ("h200-sxm-gpu2-h2d-21gbps.txt", {
        "pasted-annotated-prompt.txt": (4, None),
        "pasted-elided-devices.txt": (1, None),  # Device 2-6 lines: the device list is no value of the contract
        "pasted-tabs-collapsed.txt": (0, None),
    }),
    "dcgm-diag": ("dcgm3.3-h100-r2-memory-fail-gpu3.txt", {
        "pasted-annotated-prompt.txt": (4, None),
        # a [snip] between the prompt and the JSON, and the memory test's GPUs 4-6 as "..."
        "pasted-elided-gpus-4-6.txt": (3, lambda want: _without_results(want, "memory", (4, 5, 6))),
        "pasted-tabs-collapsed.txt": (0, None),
    }),
    "nvsmi-pci": ("h100-sxm-gpu3-x8-width-downtrained.txt", {
        "pasted-annotated-prompt.txt": (4, None),
        "pasted-elided-gpus-2a-3a.txt": (1, ("gpus", "bus_id", ("00000000:2A:00.0", "00000000:3A:00.0"))),
        "pasted-tabs-collapsed.txt": (0, None),
    }),
    "nvlink-errors": ("h100-sxm-gpu1-link0-replays-growing.txt", {
        "pasted-annotated-prompt.txt": (4, None),
        "pasted-elided-gpus-3-5.txt": (1, ("gpus", "index", (3, 4, 5))),
        # `GPU  0:`, `GPU\t1:`, `GPU 2:\t` headers: the header pattern dropped GPU 0 and its links without a word
        "pasted-tabs.txt": (0, None),
    }),
    "sysfs": ("h100-mlx5_1-symbol-errors.txt", {
        "pasted-annotated-prompt.txt": (4, None),
        "pasted-elided-mlx5_2.txt": (1, lambda want: {"values": {k: v for k, v in want["values"].items()
                                                                 if "/mlx5_2/" not in k}}),
        "pasted-tabs.txt": (0, None),
    }),
    "kernel-links": ("bsd-syslog-ubuntu22-ipoib-two-flaps.txt", {
        # the events name their line in the text given: one further down, under the prompt line
        "pasted-annotated-prompt.txt": (4, lambda want: _lines_moved(want, "events", 1)),
        "pasted-elided-nvrm-line.txt": (1, lambda want: {**want, "lines_read": want["lines_read"] - 1}),
        "pasted-tabs-in-stamps.txt": (0, None),
    }),
    "kernel-xids": ("journalctl-short-a100-xid48-dbe-xid63-remap.txt", {
        "pasted-annotated-prompt.txt": (3, lambda want: _lines_moved(want, "xids", 1)),
        "pasted-elided-sxid-line.txt": (1, lambda want: {**want, "lines_read": want["lines_read"] - 1}),
        "pasted-tabs-in-stamps.txt": (0, None),
    }),
    "cpulist": ("hgx-h100-xeon8480-smt-node0.txt", {
        "pasted-annotated-prompt.txt": (2, None),
        "pasted-elided-after.txt": (1, None),
        "pasted-tabs.txt": (0, None),
    }),
    "cmdline": ("ubuntu22-default.txt", {
        "pasted-annotated-prompt.txt": (2, None),
        "pasted-elided-after.txt": (1, None),
        "pasted-tabs.txt": (0, None),
    }),
    "nvsmi-perf": ("h100-sxm-gpu0-hw-thermal-slowdown.txt", {
        "pasted-annotated-prompt.txt": (4, None),
        "pasted-elided-gpus-2a-3a.txt": (1, ("gpus", "bus_id", ("00000000:2A:00.0", "00000000:3A:00.0"))),
        "pasted-tabs-collapsed.txt": (0, None),
    }),
}


def _lines_moved(want: dict, key: str, by: int) -> dict:
    return {**want, key: [{**item, "line": item["line"] + by} for item in want[key]]}


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


# The captures that were taken with their command line ("$ ib_write_lat ..."): that line is a shell prompt,
# reported (fixture -> its line numbers); nothing else in a real output is.
PROMPTED = {
    "chrony/two-runs-crlf-unsynced-then-synced.txt": [1, 15],
    "cpupower/amd-bc250-acpi_idle-residency-lines-cpu12.txt": [1],
    "cpupower/garbage-silent-amd-bc250-all-cpus-state-names-only.txt": [1],
    "cpupower/intel-skylake-sp-deep-states-disabled-two-cpus.txt": [1],
    "dcgm_diag/dcgm4.2-r2-pcie-width-fail-gpu5.txt": [1],
    "ibping/flood-c1000-quiet.txt": [1],
    "ibping/h100-ndr-rdma-core50-count10-ok.txt": [1],
    "nccl/a100-sxm4-8rank-all_gather-mpirun-tag-output.txt": [1],
    "nccl/h100-all_reduce-crashed-before-first-row.txt": [1],
    "nccl/h100-alltoall-nccl-debug-info-interleaved.txt": [1],
    "nccl/h100-sxm-8gpu-all_reduce-g8-single-node.txt": [1],
    "nccl/h100-sxm-broadcast-root0-no-validation-wrong-na.txt": [1],
    "nccl/truncated-mid-row.txt": [1],
    "nccl/two-runs-complete-then-crashed.txt": [20],
    "perftest/h100-ndr-ib_write_bw-report-gbits.txt": [1],
    "perftest/h100-ndr-ib_write_lat-perftest23.txt": [1],
    "topo/tesla-p4-single-gpu-numa-affinity-na-tabs.txt": [1],
    "topo/two-pastes-second-cut-short.txt": [1, 19],
}


def test_clean_fixtures_have_no_warnings():
    """No false positives: not one of the existing real outputs is taken for a paste annotation, an elision or
    a prompt; the captures that include their command line have exactly that line reported."""
    for path in sorted(FIXTURES.rglob("*.txt")):
        if not path.name.startswith("pasted-"):
            name = path.relative_to(FIXTURES).as_posix()
            expected = [f"line {no}: a shell prompt line, not the tool's output" for no in PROMPTED.get(name, [])]
            got = [w.split(": '")[0] for w in paste_warnings(path.read_text(errors="replace"))]
            assert got == expected, path


@pytest.mark.parametrize("line, prompt", [
    ("$ cat /proc/cmdline", True),
    ("user@r01n01:~$ date +%s", True),
    ("root@r01n01:~# ibstat", True),
    ("[root@gpu06 ~]# nvidia-smi nvlink -s", True),
    ("# nThread 1 nGpus 8 minBytes 8", False),  # nccl-tests' own header: a bare "#" is never reported
    ("#  Rank  0 Group  0 Pid 1234", False),
    ("$", False),
    ("/sys/class/infiniband/mlx5_0/ports/1/counters/link_downed:0", False),
])
def test_prompt_lines_are_reported_and_kept_and_tool_lines_are_not(line, prompt):
    from preflight.parsers.common import paste_lines

    kept, warnings = paste_lines(line)
    assert [k.text for k in kept] == [line]  # kept: the nccl parser reads its test's name there
    assert warnings == ([f"line 1: a shell prompt line, not the tool's output: {line!r}"] if prompt else [])


@pytest.mark.parametrize("kind", ["nvlink-status", "nvlink-errors"])
@pytest.mark.parametrize("first", ["GPU0: NVIDIA H100 80GB HBM3", "GPU #0: NVIDIA H100 80GB HBM3", "lost text"])
def test_a_line_before_the_first_nvlink_header_is_an_error_not_a_lost_gpu(kind, first):
    """Lines before the first `GPU N:` header were dropped without a word: a header the pattern did not take
    lost that GPU and all its links. Only a shell prompt (reported) may come before it."""
    original = read(kind, "h100-sxm-driver550-18-links-26.562.txt" if kind == "nvlink-status"
                    else "h100-sxm-driver550-all-zero.txt")
    text = f"{first}\n" + "\n".join(original.split("\n")[1:])  # GPU 0's header replaced: its links follow
    with pytest.raises(ParseError) as caught:
        parse(kind, text)
    assert caught.value.line_no == 1 and "before the first 'GPU N:' header" in caught.value.message
    assert parse(kind, f"$ nvidia-smi nvlink\n{original}").gpus[0].index == 0
