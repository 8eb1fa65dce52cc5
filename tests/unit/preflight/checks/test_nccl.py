"""preflight/checks/nccl.py: ``evaluate`` judged on facts built directly (NHC style: the facts of a fault, never fixture text
edited to produce one), ``gather`` through a scripted transport on canned real-format outputs (a healthy
node passes; unreadable output is an ERROR)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from preflight.checks import (
    nccl,
)
from preflight.profiles import profile_of
from preflight.result import Verdict
from tests.helpers.preflight import ScriptedTransport, context, fixture_text, node, only

pytestmark = pytest.mark.unit


def nccl_transport(iu_text: str, node_text: str, rc: int = 0) -> ScriptedTransport:
    t = ScriptedTransport()
    t.on("n1", "env", "CUDA_VISIBLE_DEVICES=0,1,2,3", reply=(rc, iu_text))
    t.on("n1", "env", "CUDA_VISIBLE_DEVICES=4,5,6,7", reply=(rc, iu_text))
    t.on("n1", "env", "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7", reply=(rc, node_text))
    return t


IU_NCCL = fixture_text("nccl", "h100-sxm-iu-4gpu-all_reduce-srun-label.txt")
NODE_NCCL = fixture_text("nccl", "h100-sxm-8gpu-all_reduce-g8-single-node.txt")


def test_nccl_per_iu_and_per_node_pass_at_the_largest_size():
    t = nccl_transport(IU_NCCL, NODE_NCCL)
    results = nccl.CHECK.run(context(t))
    assert [(r.iu, r.verdict) for r in results] == [
        ("n1-iu0", Verdict.PASS),
        ("n1-iu1", Verdict.PASS),
        (None, Verdict.PASS),
    ]
    assert only(results, iu="n1-iu0").evidence["found"]["size_bytes"] == 17179869184
    argv = t.called("n1", "CUDA_VISIBLE_DEVICES=4,5,6,7")[0]
    assert argv[argv.index("-g") + 1] == "4" and argv[argv.index("-e") + 1] == "16G"


def test_nccl_gates_on_out_of_place_busbw_at_the_largest_size_not_the_average():
    # The 8-GPU sweep averages far below 460 (small sizes are latency bound) yet its 16 GiB row passes.
    node_result = only(nccl.CHECK.run(context(nccl_transport(IU_NCCL, NODE_NCCL))), iu=None)
    assert (
        node_result.evidence["found"]["avg_busbw_gbps"] < 460 <= node_result.evidence["found"]["busbw_gbps"]
    )
    [run] = [r for r in nccl.CHECK.gather(context(nccl_transport(IU_NCCL, NODE_NCCL))) if r.iu == "n1-iu0"]
    largest = max(run.parsed.rows, key=lambda r: r.size_bytes)
    slow_rows = [replace(r, oop_busbw_gbps=301.0) if r is largest else r for r in run.parsed.rows]
    slow = replace(run, parsed=replace(run.parsed, rows=slow_rows))
    n = node()
    bad = only(nccl.CHECK.evaluate([slow], profile_of(n), n), iu="n1-iu0")
    assert (bad.verdict, bad.code) == (Verdict.FAIL, "NCCL_BUSBW")
    assert "busbw 301 GB/s at 16 GiB < 330" in bad.reason


def test_wrong_values_fail_as_corruption_even_though_the_run_completed():
    text = fixture_text("nccl", "h100-sxm-all_reduce-wrong-values-oob-failed.txt")
    results = nccl.CHECK.run(context(nccl_transport(text, NODE_NCCL, rc=1)))
    assert only(results, iu="n1-iu0").code == "NCCL_WRONG"


@pytest.mark.parametrize(
    "name",
    ["h100-all_reduce-crashed-before-first-row.txt", "h100-2node-all_reduce-crashed-ib-retry-exceeded.txt"],
)
def test_crashed_run_fails_with_its_last_error_line(name):
    text = fixture_text("nccl", name)
    bad = only(nccl.CHECK.run(context(nccl_transport(text, NODE_NCCL, rc=1))), iu="n1-iu0")
    assert (bad.verdict, bad.code) == (Verdict.FAIL, "NCCL_INCOMPLETE")
    assert bad.reason.split(": ", 1)[1]  # carries the error line


def test_hung_nccl_run_fails_incomplete():
    from preflight.transport import CommandResult

    t = nccl_transport(IU_NCCL, NODE_NCCL)
    t.on(
        "n1",
        "env",
        "CUDA_VISIBLE_DEVICES=0,1,2,3",
        reply=CommandResult(None, "# nThread 1 nGpus 4\n", "", 5.0, timed_out=True),
    )
    results = nccl.CHECK.run(context(t))
    assert only(results, iu="n1-iu0").code == "NCCL_INCOMPLETE"
    assert (
        "not run" in only(results, iu="n1-iu1").reason
    )  # the host hung once: later commands are not started
