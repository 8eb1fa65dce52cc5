"""bench/virtual_machines.py and what it asserts after `down` (sim.hosts.machines.leftovers), without machines."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.machines(order=5)

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import virtual_machines  # noqa: E402

from sim.hosts import machines  # noqa: E402


def test_a_clean_state_dir_has_no_leftovers(tmp_path):
    state = tmp_path / ".sim"
    (state / "ssh").mkdir(parents=True)  # kept across up/down: not a leftover
    assert machines.leftovers(state) == []


def test_an_overlay_upper_dir_left_by_down_is_reported(tmp_path):
    state = tmp_path / ".sim"
    (state / "machines" / "r01n01" / "upper" / "etc").mkdir(parents=True)
    assert machines.leftovers(state) == [f"overlay upper dir {state}/machines/r01n01/upper"]


@pytest.mark.skipif(os.geteuid() != 0 or not machines._cgroup_roots(), reason="needs root and a cgroup hierarchy")
def test_a_process_left_in_a_machine_cgroup_is_reported_until_it_is_gone(tmp_path):
    # e.g. a stub tool or sshd session that outlived its machine's PID 1: it stays in the machine's cgroup
    state = tmp_path / ".sim"
    state.mkdir()
    layout = machines.Layout(state)
    cgroups = machines.machine_cgroups(layout.host("r01n01"))
    for cgroup in cgroups:
        cgroup.mkdir(parents=True)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        for cgroup in cgroups:
            (cgroup / "cgroup.procs").write_text(f"{proc.pid}\n")
        found = machines.leftovers(state)
        assert f"process {proc.pid} (sleep)" in found
        assert [f for f in found if f.startswith("cgroup ")] == [f"cgroup {c}" for c in cgroups]
    finally:
        proc.kill()
        proc.wait()
        for cgroup in cgroups:  # empty once its process is gone
            cgroup.rmdir()
    assert machines.leftovers(state) == []


def test_a_controller_process_naming_the_state_dir_is_not_a_leftover(tmp_path):
    # Ansible's ControlPersist ssh master names the inventory's key under the state dir and outlives a run
    state = tmp_path / ".sim"
    state.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"{state}/ssh/id_ed25519"])
    try:
        time.sleep(0.3)
        assert machines.leftovers(state) == []
    finally:
        proc.kill()
        proc.wait()


def test_the_table_names_what_was_left_and_the_load():
    row = {"nodes": 4, "up_s": 10.0, "up_cpu_s": 1.0, "down_s": 2.0, "down_cpu_s": 0.5, "rss_mib": 100.0,
           "pss_mib": 60.0, "mem_drop_mib": 300.0, "processes": 40, "running": 4, "load": "3.0 2.5 2.0",
           "left": ["process 77 (sshd)", "mount /x", "cgroup /y", "overlay upper dir /z"]}
    lines = virtual_machines.table([row, {**row, "nodes": 16, "left": []}]).splitlines()
    assert lines[3].startswith("| 4 | 10.0 | 2.50 | 1.0 | 2.0 | 0.5 | 100 | 60 | 15.0 | 300 | 40 | 4 | ")
    assert "4: process 77 (sshd); mount /x; cgroup /y |" in lines[3]
    assert lines[3].endswith("| 3.0 2.5 2.0 |")
    assert "| none | 3.0 2.5 2.0 |" in lines[4]
