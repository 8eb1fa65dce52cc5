"""Ansible's own controller CPU per task and host, and what it sets as the floor of a site.yml rerun.

`bench/provision_scale.py` runs this after the rerun, on the same machines and through the same
connection settings (ansible.cfg: SSH as deploy with sudo, pipelining, ControlPersist): three playbooks of
no-op tasks, each kind at two lengths, so that the difference between the lengths divided by the extra
task-hosts is the cost of one task on one host, with start-up (inventory, playbook parse, the first
connection) cancelled out:

- module: `ansible.builtin.ping` with become: a module sent to the host's Python and answered (what every
  module task costs before its module does anything);
- controller: `ansible.builtin.debug`: an action that runs on the controller only (assert, set_fact,
  validate_argument_spec cost about this: a worker forked and the task templated, no connection);
- skipped: the ping task with `when: false` (a worker is still forked per host to evaluate it).

The rerun's events.jsonl gives how many tasks of each kind site.yml ran per host; their sum at these costs
is the floor: what the rerun would cost if every task were a no-op. It is a lower bound (a template task
renders on the controller, a loop's items each run the module); the gap between the floor and the measured
rerun is what the roles' own tasks add over Ansible's per-task cost.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

KINDS = ("module", "controller", "skipped")
# actions that run on the controller only (no module sent to the host); include_tasks/include_role report
# runner_on_ok per host too
CONTROLLER_ACTIONS = frozenset(
    f"{prefix}{name}" for prefix in ("", "ansible.builtin.")
    for name in ("assert", "set_fact", "debug", "fail", "meta", "validate_argument_spec", "include_tasks",
                 "include_role", "include_vars", "add_host", "group_by", "set_stats", "pause"))
FINAL_EVENTS = {"runner_on_ok": None, "runner_on_failed": None, "runner_on_skipped": "skipped",
                "runner_on_unreachable": None}
TASKS_SHORT, TASKS_LONG = 5, 25  # the two lengths: 20 extra tasks per host


@dataclass(frozen=True)
class TaskCounts:
    """Tasks per host of one run, by what they cost the controller; loop items separately."""
    module: float
    controller: float
    skipped: float
    items: float

    def total(self) -> float:
        return self.module + self.controller + self.skipped


def task_counts(events: Iterable[str]) -> TaskCounts:
    """Mean tasks per host by kind, from a run's events.jsonl lines."""
    per_host: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in events:
        event = json.loads(line)
        data = event.get("event_data") or {}
        host = data.get("host")
        if not host:
            continue
        if event.get("event") == "runner_item_on_ok":
            per_host[host]["items"] += 1
        elif event.get("event") in FINAL_EVENTS:
            kind = FINAL_EVENTS[event["event"]] or (
                "controller" if data.get("task_action") in CONTROLLER_ACTIONS else "module")
            per_host[host][kind] += 1
    if not per_host:
        return TaskCounts(0, 0, 0, 0)
    hosts = len(per_host)
    return TaskCounts(*(sum(c[kind] for c in per_host.values()) / hosts for kind in (*KINDS, "items")))


def floor_play(kind: str, tasks: int) -> list[dict]:
    """A play of ``tasks`` no-op tasks of ``kind`` on every host."""
    task = {"module": {"ansible.builtin.ping": {}},
            "controller": {"ansible.builtin.debug": {"msg": "floor"}},
            "skipped": {"ansible.builtin.ping": {}, "when": False}}[kind]
    return [{"name": f"floor: {tasks} {kind} tasks", "hosts": "all", "gather_facts": False, "become": True,
             "tasks": [{"name": f"{kind} {i}", **task} for i in range(tasks)]}]


def per_task_cost(short_cpu_s: float, long_cpu_s: float, hosts: int) -> float:
    """Controller CPU-s of one task on one host: the longer playbook's extra CPU over its extra task-hosts."""
    return max(0.0, long_cpu_s - short_cpu_s) / ((TASKS_LONG - TASKS_SHORT) * hosts)


def measure_costs(workdir: Path, hosts: int, run_cpu: Callable[[Path], float]) -> dict[str, float]:
    """CPU-s per task-host of each kind; ``run_cpu(playbook)`` runs ansible-playbook on the machines and
    returns its controller CPU (provision_scale measures it as it measures provision)."""
    costs = {}
    for kind in KINDS:
        cpu = []
        for tasks in (TASKS_SHORT, TASKS_LONG):
            playbook = workdir / f"floor-{kind}-{tasks}.yml"
            playbook.write_text(yaml.safe_dump(floor_play(kind, tasks), sort_keys=False))
            cpu.append(run_cpu(playbook))
        costs[kind] = per_task_cost(cpu[0], cpu[1], hosts)
    return costs


def floor_per_host(counts: TaskCounts, costs: dict[str, float]) -> float:
    return sum(getattr(counts, kind) * costs[kind] for kind in KINDS)


def floor_lines(hosts: int, counts: TaskCounts, costs: dict[str, float], measured_per_host: float,
                target_per_host: float) -> list[str]:
    """The reference lines: costs, the rerun's tasks, its floor and how many no-op module tasks fit the target.
    No verdict: the floor is context for the target, not a target."""
    floor = floor_per_host(counts, costs)
    fits = int(target_per_host / costs["module"]) if costs["module"] > 0 else 0
    return [
        f"reference: {hosts} hosts, Ansible's controller CPU per task and host (no-op tasks, same connection "
        f"settings): module {costs['module'] * 1000:.1f} ms, controller-only {costs['controller'] * 1000:.1f} ms, "
        f"skipped {costs['skipped'] * 1000:.1f} ms",
        f"reference: the rerun ran per host {counts.module:.0f} module, {counts.controller:.0f} controller-only and "
        f"{counts.skipped:.0f} skipped tasks (+{counts.items:.0f} loop items): Ansible's floor for them "
        f"{floor:.2f} CPU-s per host; measured {measured_per_host:.2f} "
        f"({measured_per_host / floor:.2f}x the floor)" if floor > 0 else
        f"reference: the rerun ran per host {counts.total():.0f} tasks; no floor (no per-task cost measured)",
        f"reference: {target_per_host} CPU-s per host is the cost of {fits} no-op module tasks and nothing else",
    ]
