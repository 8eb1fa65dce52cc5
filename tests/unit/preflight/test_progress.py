"""preflight's progress where stderr is not a terminal (CI logs, `2> log`): plain lines, where the live line
drew nothing at all during checks that can run for many minutes; bounded for a fleet's fast checks. On a
terminal, the live line stays one line at any width."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from preflight.progress import LiveProgress, PlainProgress
from tests.helpers import cli_samples as samples

pytestmark = pytest.mark.unit


def plain(clock, **kwargs) -> tuple[PlainProgress, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=False, color_system=None)
    return PlainProgress(console, ["r01n01", "r01n02"], clock=lambda: clock[0], heartbeat_s=3600, **kwargs), out


def test_a_line_per_check_start_per_node_done_and_a_heartbeat_while_checks_run():
    now = [100.0]
    progress, out = plain(now)
    with progress:
        progress.start(2)
        progress.node_step("r01n01", "gpu_health")
        progress.node_step("r01n02", "dcgm_diag")
        now[0] += 3
        progress.node_step("r01n01", "dcgm_diag")
        now[0] += 135
        progress.heartbeat()
        progress.node_done("r01n01", [samples.r("r01", "r01n01", "dcgm_diag", "FAIL", "DCGM_FAIL", "level 3 failed")])
        progress.phase("rack checks: ib_pairs, nccl")
        progress.phase("rack checks: ib_pairs, nccl")  # the same phase again: no second line
        progress.node_done("r01n02", [samples.r("r01", "r01n02", "dcgm_diag", "WARN", "X", "warned")])
    assert out.getvalue().splitlines() == [
        "preflight: checking 2 nodes",
        "preflight: r01n01: gpu_health started",
        "preflight: r01n02: dcgm_diag started",
        "preflight: r01n01: dcgm_diag started (gpu_health took 3s)",
        "preflight: still running (0/2 nodes done): dcgm_diag 2m18s: r01n01, r01n02",
        "preflight: r01n01 done (1/2 nodes) (dcgm_diag took 2m15s): FAIL dcgm_diag",
        "preflight: rack checks: ib_pairs, nccl",
        "preflight: r01n02 done (2/2 nodes) (dcgm_diag took 2m18s): nothing failed",
    ]


def test_check_start_lines_are_rate_limited_and_the_rest_counted():
    now = [0.0]
    progress, out = plain(now, burst=3, window_s=10.0)
    with progress:
        for check in ("a", "b", "c", "d", "e"):
            progress.node_step("r01n01", check)
        now[0] += 10
        progress.node_step("r01n01", "f")  # a new window
    lines = out.getvalue().splitlines()
    assert [line.split(": ", 2)[2] for line in lines[:4]] == [
        "a started", "b started (a took 0s)", "c started (b took 0s)", "f started (e took 10s)"]
    assert lines[4:] == ["preflight: (2 check starts not shown: more than 3 in 10s)"]


def test_preflight_off_a_terminal_prints_progress_lines_to_stderr(clusterctl, virtual_inventory, tmp_path,
                                                                   monkeypatch):
    import preflight.runner

    def fake_run(cluster, checks, profiles, transport, options, parallel, progress):
        progress.start(1)
        progress.node_step("r01n01", "dcgm_diag")
        progress.node_done("r01n01", [])
        return samples.outcome()

    monkeypatch.setattr(preflight.runner, "run_preflight", fake_run)
    code, _, err = clusterctl("preflight", "-i", str(virtual_inventory), "--state-dir", str(tmp_path))
    assert code == 1
    assert err.splitlines()[:3] == ["preflight: checking 1 node", "preflight: r01n01: dcgm_diag started",
                                    "preflight: r01n01 done (1/1 nodes) (dcgm_diag took 0s): nothing failed"]


@pytest.mark.parametrize("width", [80, 120])
def test_the_live_line_stays_one_line_at_the_terminal_s_width_however_many_checks_run(width):
    now = [100.0]
    console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system=None)
    progress = LiveProgress(console, [f"r0{r}n0{n}" for r in range(1, 4) for n in range(1, 5)], clock=lambda: now[0])
    progress.start(12)
    for k, node in enumerate(["r01n01", "r01n02", "r01n03", "r01n04", "r02n01"]):
        progress.node_step(node, "dcgm_diag" if k < 3 else "nccl_allreduce_bandwidth")
    now[0] += 135
    lines = console.render_lines(progress._bar.get_renderable(), console.options, pad=False)
    text = ["".join(segment.text for segment in line) for line in lines]
    assert len(text) == 1 and len(text[0]) <= width, text
    assert text[0].startswith("preflight") and "0/12 nodes" in text[0] and "dcgm_diag 2m15s" in text[0], text
