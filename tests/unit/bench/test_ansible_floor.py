"""bench/ansible_floor.py: a rerun's tasks counted by what they cost the controller, the per-task cost taken
from two playbook lengths (start-up cancels), and the floor printed as a reference, never as a verdict."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import ansible_floor as floor  # noqa: E402

pytestmark = pytest.mark.unit


def event(kind: str, host: str, action: str) -> str:
    return json.dumps({"event": kind, "event_data": {"host": host, "task_action": action}})


def test_tasks_are_counted_per_host_by_what_they_cost_the_controller():
    lines = []
    for host in ("r01n01", "r01n02"):
        lines += [event("runner_on_ok", host, "clusterctl.infra.config_files"),
                  event("runner_on_ok", host, "ansible.builtin.systemd_service"),
                  event("runner_item_on_ok", host, "ansible.builtin.systemd_service"),
                  event("runner_item_on_ok", host, "ansible.builtin.systemd_service"),
                  event("runner_on_ok", host, "ansible.builtin.assert"),
                  event("runner_on_ok", host, "validate_argument_spec"),
                  event("runner_on_skipped", host, "ansible.builtin.apt")]
    lines.append(json.dumps({"event": "playbook_on_task_start", "event_data": {"task": "x"}}))
    counts = floor.task_counts(lines)
    assert counts == floor.TaskCounts(module=2, controller=2, skipped=1, items=2)
    assert counts.total() == 5


def test_a_host_with_fewer_tasks_lowers_the_mean():
    lines = [event("runner_on_ok", "a", "ansible.builtin.command")] * 3 + [event("runner_on_ok", "b", "command")]
    assert floor.task_counts(lines).module == 2


def test_no_events_no_tasks():
    assert floor.task_counts([]) == floor.TaskCounts(0, 0, 0, 0)


def test_the_per_task_cost_is_the_slope_so_start_up_cancels():
    hosts, start_up, per_task = 4, 1.3, 0.06
    short = start_up + floor.TASKS_SHORT * hosts * per_task
    long = start_up + floor.TASKS_LONG * hosts * per_task
    assert floor.per_task_cost(short, long, hosts) == pytest.approx(per_task)
    assert floor.per_task_cost(2.0, 1.9, hosts) == 0.0  # noise never gives a negative cost


@pytest.mark.parametrize("kind, key", [("module", "ansible.builtin.ping"), ("controller", "ansible.builtin.debug"),
                                       ("skipped", "when")])
def test_each_floor_play_has_the_asked_number_of_its_kind(kind, key):
    (play,) = floor.floor_play(kind, 7)
    assert play["become"] is True and play["gather_facts"] is False
    assert len(play["tasks"]) == 7 and all(key in task for task in play["tasks"])


def test_the_floor_is_a_reference_with_the_measured_ratio_and_no_verdict():
    counts = floor.TaskCounts(module=40, controller=30, skipped=20, items=8)
    costs = {"module": 0.05, "controller": 0.03, "skipped": 0.02}
    lines = floor.floor_lines(4, counts, costs, measured_per_host=7.0, target_per_host=1.0)
    text = "\n".join(lines)
    assert all(line.startswith("reference: ") for line in lines)
    assert "floor for them 3.30 CPU-s per host; measured 7.00 (2.12x the floor)" in text
    assert "1.0 CPU-s per host is the cost of 20 no-op module tasks" in text
    assert "met" not in text.replace("measured", "")


def test_the_measurement_writes_both_lengths_and_divides_by_the_extra_task_hosts(tmp_path):
    seen = []

    def run_cpu(playbook: Path) -> float:
        seen.append(playbook.name)
        tasks = len(yaml.safe_load(playbook.read_text())[0]["tasks"])
        return 1.0 + tasks * 2 * 0.04  # 2 hosts, 40 ms a task-host

    costs = floor.measure_costs(tmp_path, 2, run_cpu)
    assert costs == pytest.approx({"module": 0.04, "controller": 0.04, "skipped": 0.04})
    assert len(seen) == 6
