from pathlib import Path

import pytest

from preflight.parsers import ParseError, nccl

pytestmark = pytest.mark.unit

DIR = Path(__file__).resolve().parents[3] / "fixtures" / "preflight" / "nccl"


def load(name: str) -> nccl.NcclResult:
    return nccl.parse((DIR / name).read_text())


def test_single_node_all_reduce():
    r = load("h100-sxm-8gpu-all_reduce-g8-single-node.txt")
    assert (r.test, r.complete, r.oob_values, r.avg_busbw_gbps, r.errors, r.n_gpus) == (
        "all_reduce_perf", True, 0, 209.7, [], 8)
    assert len(r.rows) == 32 and r.rows[0].size_bytes == 8
    assert r.largest_row().to_json() == {
        "size_bytes": 17179869184, "count": 4294967296, "type": "float", "redop": "sum", "root": -1,
        "oop_time_us": 62504.7, "oop_algbw_gbps": 274.86, "oop_busbw_gbps": 481.0, "oop_wrong": 0,
        "ip_time_us": 62754.7, "ip_algbw_gbps": 273.76, "ip_busbw_gbps": 479.08, "ip_wrong": 0}
    assert r.wrong_total() == 0


def test_iu_under_srun_label():
    r = load("h100-sxm-iu-4gpu-all_reduce-srun-label.txt")
    assert r.complete and r.n_gpus == 4 and r.test is None
    assert r.largest_row().oop_busbw_gbps == 368.0


def test_all_gather_under_mpirun_tag_output():
    r = load("a100-sxm4-8rank-all_gather-mpirun-tag-output.txt")
    assert r.test == "all_gather_perf" and r.complete and len(r.rows) == 23
    assert (r.rows[0].redop, r.rows[0].root, r.largest_row().oop_busbw_gbps) == ("none", -1, 231.0)


def test_collective_markers_name_the_test():
    r = load("h200-sxm-reduce_scatter-collective-markers.txt")
    assert (r.test, r.complete, r.largest_row().oop_busbw_gbps) == ("reduce_scatter_perf", True, 452.0)


def test_old_format_error_column_and_no_root():
    r = load("v100-sxm2-all_reduce-old-error-column.txt")
    assert r.complete and {row.root for row in r.rows} == {None}
    assert r.rows[0].oop_wrong == 0.0 and isinstance(r.rows[0].oop_wrong, float)
    assert r.largest_row().oop_wrong == 1e-07 and r.largest_row().oop_busbw_gbps == 131.0


def test_no_validation_wrong_is_null_and_broadcast_root_zero():
    r = load("h100-sxm-broadcast-root0-no-validation-wrong-na.txt")
    assert {(row.root, row.oop_wrong, row.ip_wrong) for row in r.rows} == {(0, None, None)}
    assert r.test == "broadcast_perf" and r.wrong_total() == 0


def test_wrong_values_and_out_of_bounds_are_reported_not_folded_into_complete():
    r = load("h100-sxm-all_reduce-wrong-values-oob-failed.txt")
    assert r.complete and r.oob_values == 24 and r.wrong_total() > 0
    assert r.errors == ["# Out of bounds values : 24 FAILED"]


def test_crashed_mid_sweep_keeps_rows_and_error_lines():
    r = load("h100-2node-all_reduce-crashed-ib-retry-exceeded.txt")
    assert (r.complete, r.avg_busbw_gbps, r.oob_values, len(r.rows)) == (False, None, None, 20)
    assert "IBV_WC_RETRY_EXC_ERR" in r.errors[0]
    assert r.errors[1].startswith("r01n02: Test NCCL failure common.cu:1005")
    assert not any("NCCL INFO" in line for line in r.errors)


def test_crashed_before_first_row():
    r = load("h100-all_reduce-crashed-before-first-row.txt")
    assert (r.test, r.complete, r.rows) == ("all_reduce_perf", False, [])
    assert r.errors[-1] == ".. r03n04 pid 19204: Test failure common.cu:842"


def test_nccl_info_lines_inside_the_table_are_skipped():
    r = load("h100-alltoall-nccl-debug-info-interleaved.txt")
    assert r.test == "alltoall_perf" and r.complete and len(r.rows) == 11 and r.errors == []


def test_last_complete_run_wins_over_a_later_crash():
    r = load("two-runs-complete-then-crashed.txt")
    assert r.complete and r.n_gpus == 4 and r.test is None


def test_several_complete_runs_read_the_last():
    a = (DIR / "h100-sxm-8gpu-all_reduce-g8-single-node.txt").read_text()
    b = (DIR / "h200-sxm-reduce_scatter-collective-markers.txt").read_text()
    assert nccl.parse(a + b).test == "reduce_scatter_perf"
    assert nccl.parse(b + a).test == "all_reduce_perf"


def test_row_cut_mid_line_names_the_line():
    with pytest.raises(ParseError) as info:
        load("truncated-mid-row.txt")
    assert info.value.line_no == 31 and "expected 13" in info.value.message


def test_text_without_nccl_output():
    with pytest.raises(ParseError) as info:
        load("garbage-mpirun-could-not-execute.txt")
    assert info.value.line_no == 1


def test_blank_redop_column():
    header = ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw"
              "   busbw #wrong\n")
    row = "        1024           256     float              -1    10.50    0.10    0.10      0    10.40    0.10    0.10      0\n"
    r = nccl.parse(header + row + "# Avg bus bandwidth    : 0.1\n")
    assert (r.rows[0].redop, r.rows[0].root, r.complete) == (None, -1, True)


def test_non_finite_values_become_null_so_the_json_stays_valid():
    header = ("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw"
              "   busbw #wrong\n")
    row = "           8             2     float     sum      -1     0.00     inf     inf      0     0.00     inf     inf      0\n"
    r = nccl.parse(header + row + "# Avg bus bandwidth    : nan\n")
    assert (r.rows[0].oop_algbw_gbps, r.rows[0].ip_busbw_gbps, r.avg_busbw_gbps, r.complete) == (None, None, None, True)
