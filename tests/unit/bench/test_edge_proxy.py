"""bench/edge_proxy.py's placement and steal accounting, in bench/edge_procs.py and bench/measure.py (the pure parts; the bench itself runs for minutes)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import edge_procs  # noqa: E402
import edge_proxy  # noqa: E402
import measure  # noqa: E402

pytestmark = pytest.mark.unit


def stat_file(tmp_path: Path, *ticks: int) -> Path:
    path = tmp_path / "stat"
    path.write_text("cpu  " + " ".join(map(str, ticks)) + "\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 12345\n")
    return path


def test_steal_share_is_the_hypervisors_part_of_the_cpu_time_between_two_readings(tmp_path):
    before = measure.cpu_ticks(stat_file(tmp_path, 100, 0, 50, 800, 10, 0, 5, 35, 0, 0))
    after = measure.cpu_ticks(stat_file(tmp_path, 400, 0, 150, 1700, 10, 0, 15, 135, 7, 0))
    assert before[7] == 35
    # deltas: user 300, system 100, idle 900, softirq 10, steal 100 (guest 7 is inside user): 100 / 1410
    assert measure.steal_share(before, after) == pytest.approx(100 / 1410)
    assert measure.steal_share(before, before) == 0.0
    assert measure.steal_share(None, after) is None


def test_a_host_without_an_aggregate_cpu_line_has_no_steal_reading(tmp_path):
    assert measure.cpu_ticks(tmp_path / "missing") is None
    (tmp_path / "odd").write_text("intr 1 2 3\n")
    assert measure.cpu_ticks(tmp_path / "odd") is None


def test_the_proxy_gets_a_cpu_of_its_own_only_where_there_are_two():
    assert edge_procs.dedicated_cpus({0, 1}) == ({1}, {0})
    assert edge_procs.dedicated_cpus({0, 1, 2, 3}) == ({3}, {0, 1, 2})
    assert edge_procs.dedicated_cpus({0}) is None


def test_the_steal_line_shows_kept_and_redone_rounds():
    row = {"rate": 200.0, "steal": [0.0005, None, 0.001], "redone": [0.028, 0.049]}
    line = edge_proxy.steal_line(row)
    assert "0.05%, -, 0.10%" in line
    assert "2 round(s) run again, their steal over 0.5%: 2.80%, 4.90%" in line
    assert "run again" not in edge_proxy.steal_line({"rate": 200.0, "steal": [0.0], "redone": []})


def test_pin_moves_every_thread_of_a_process(tmp_path):
    import threading

    ready, stop = threading.Event(), threading.Event()
    worker = threading.Thread(target=lambda: (ready.set(), stop.wait(5)))
    worker.start()
    ready.wait(5)
    own = os.sched_getaffinity(0)
    one = {min(own)}
    try:
        edge_procs.pin(os.getpid(), one)
        assert os.sched_getaffinity(worker.native_id) == one and os.sched_getaffinity(0) == one
    finally:
        edge_procs.pin(os.getpid(), own)
        stop.set()
        worker.join()


def overhead_row(steal: list[float | None], direct_ms: float, edge_ms: float) -> dict:
    def run(ttfb_ms: float) -> dict:
        return {"ttfb": [ttfb_ms / 1e3] * 100, "chunk": [0.005] * 100, "late": [0.0] * 100, "achieved_rate": 200.0,
                "errors": 0}

    return {"rate": 200.0, "cpu_s": {}, "steal": steal, "redone": [0.02] * len(steal),
            "round_added_p99": {"asyncio": [edge_ms - direct_ms] * len(steal)},
            "paths": {"direct": run(direct_ms), "bare asyncio": run(direct_ms), "edge asyncio": run(edge_ms)}}


def test_a_run_with_a_disturbed_round_kept_gives_no_verdict():
    # re-runs spent, a round with 19% steal kept: its direct p99 as inflated as the edge's, the difference noise
    verdict = edge_proxy.report_overhead([overhead_row([0.001, 0.19], direct_ms=9.0, edge_ms=8.0)], "asyncio")[-1]
    assert verdict.endswith("no verdict (1 of 2 kept round(s) with steal over 0.5%, re-runs spent: "
                            "run it on a quieter host)")
    assert ": met" not in verdict and "NOT met" not in verdict


def test_undisturbed_rounds_get_met_or_not_met():
    assert edge_proxy.report_overhead([overhead_row([0.001, None], 2.0, 3.5)], "asyncio")[-1].endswith("): met")
    assert edge_proxy.report_overhead([overhead_row([0.001, 0.0], 2.0, 4.5)], "asyncio")[-1].endswith("): NOT met")
