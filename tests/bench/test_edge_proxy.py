"""bench/edge_proxy.py's placement and steal accounting (the pure parts; the bench itself runs for minutes)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import edge_proxy  # noqa: E402


def stat_file(tmp_path: Path, *ticks: int) -> Path:
    path = tmp_path / "stat"
    path.write_text("cpu  " + " ".join(map(str, ticks)) + "\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 12345\n")
    return path


def test_steal_share_is_the_hypervisors_part_of_the_cpu_time_between_two_readings(tmp_path):
    before = edge_proxy.cpu_ticks(stat_file(tmp_path, 100, 0, 50, 800, 10, 0, 5, 35, 0, 0))
    after = edge_proxy.cpu_ticks(stat_file(tmp_path, 400, 0, 150, 1700, 10, 0, 15, 135, 7, 0))
    assert before[7] == 35
    # deltas: user 300, system 100, idle 900, softirq 10, steal 100 (guest 7 is inside user): 100 / 1410
    assert edge_proxy.steal_share(before, after) == pytest.approx(100 / 1410)
    assert edge_proxy.steal_share(before, before) == 0.0
    assert edge_proxy.steal_share(None, after) is None


def test_a_host_without_an_aggregate_cpu_line_has_no_steal_reading(tmp_path):
    assert edge_proxy.cpu_ticks(tmp_path / "missing") is None
    (tmp_path / "odd").write_text("intr 1 2 3\n")
    assert edge_proxy.cpu_ticks(tmp_path / "odd") is None


def test_the_proxy_gets_a_cpu_of_its_own_only_where_there_are_two():
    assert edge_proxy.dedicated_cpus({0, 1}) == ({1}, {0})
    assert edge_proxy.dedicated_cpus({0, 1, 2, 3}) == ({3}, {0, 1, 2})
    assert edge_proxy.dedicated_cpus({0}) is None


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
        edge_proxy.pin(os.getpid(), one)
        assert os.sched_getaffinity(worker.native_id) == one and os.sched_getaffinity(0) == one
    finally:
        edge_proxy.pin(os.getpid(), own)
        stop.set()
        worker.join()
