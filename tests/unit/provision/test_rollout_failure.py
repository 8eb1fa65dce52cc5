"""A failed task always says why in the provision output. A task with ``no_log: true`` (the consul_agent role's
"Write the agent configuration", which holds the gossip key, tokens and TLS key) comes back from Ansible with
only ``censored``: the line read "r01n01: FAILED Write the agent configuration: " with nothing after it."""

from __future__ import annotations

import pytest

from provision.plan import make_plan
from provision.rollout import Rollout
from sim.hosts import create

pytestmark = pytest.mark.unit

CENSORED = "the output has been hidden due to the fact that 'no_log: true' was specified for this result"


def _failed(tmp_path, res: dict) -> str:
    inventory = tmp_path / "inv"
    create.write(inventory, 2, 1, faults="none")
    rollout = Rollout(make_plan(inventory, batch_sizes=["100%"]))
    for event in ({"event": "playbook_on_play_start", "event_data": {}},
                  {"event": "runner_on_failed", "event_data": {"host": "r01n01", "task": "Write the agent configuration",
                                                              "res": res}}):
        rollout.handle(event)
    [notice] = [n for n in rollout.notices if " FAILED " in n]
    return notice


def test_a_no_log_failure_says_that_its_reason_is_hidden_and_where_to_look(tmp_path):
    notice = _failed(tmp_path, {"censored": CENSORED, "changed": False, "failed": True})
    assert notice.startswith("r01n01: FAILED Write the agent configuration: the reason is hidden (no_log: the task "
                             "handles secrets)"), notice
    assert "" not in notice.split(": ")[2:], notice


def test_a_failure_with_a_message_keeps_it(tmp_path):
    assert _failed(tmp_path, {"msg": "boom"}) == "r01n01: FAILED Write the agent configuration: boom"


def test_a_failure_without_any_message_names_the_result_keys(tmp_path):
    notice = _failed(tmp_path, {"rc": 3, "stderr": "disk full"})
    assert notice == "r01n01: FAILED Write the agent configuration: exit 3: disk full", notice


def test_a_loop_failure_names_the_item_and_its_reason(tmp_path):
    """A loop task's own msg is only "One or more items failed": the item that failed and why come from its
    results (Ansible's loop label first, as the live output shows it)."""
    res = {"msg": "One or more items failed", "failed": True, "changed": False, "results": [
        {"item": {"device": "mlx5_0"}, "_ansible_item_label": "mlx5_0", "failed": False, "changed": False},
        {"item": {"device": "mlx5_1"}, "_ansible_item_label": "mlx5_1", "failed": True, "rc": 2,
         "stderr": "-E- Failed to open device"},
        {"item": "nccl", "failed": True, "msg": "No package matching 'nccl' is available"},
    ]}
    notice = _failed(tmp_path, res)
    assert notice == ("r01n01: FAILED Write the agent configuration: item mlx5_1: exit 2: -E- Failed to open device "
                      "(and 1 more item)"), notice
