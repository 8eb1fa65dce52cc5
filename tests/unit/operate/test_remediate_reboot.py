"""The reboot rung's runner: the node-reboot playbook planned for one node, run with reboots allowed and the
reason passed, and judged rebooted only when its reboot task rebooted that node; the node maintenance it may
leave behind, as Consul lists it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from operate.remediate_reboot import NODE_MAINTENANCE_CHECK, PLAYBOOK, PlaybookReboot, node_maintenance

pytestmark = pytest.mark.unit


@pytest.fixture
def runner(monkeypatch, tmp_path):
    """PlaybookReboot over a recorded make_plan and run_playbook; ``outcome`` sets what the run reports."""
    calls: dict = {}
    outcome = {"rc": 0, "rebooted": ["n1"], "messages": [], "succeeded": True}

    def make_plan(inventory, playbook, limit=None, batch_sizes=(), vault_secrets=None):
        calls["plan"] = (inventory, playbook, limit, tuple(batch_sizes))
        return SimpleNamespace(inventory=tmp_path / "inventory")

    def run_playbook(plan, run_dir, **kwargs):
        calls["run"] = kwargs
        rollout = SimpleNamespace(rebooted=outcome["rebooted"], messages=outcome["messages"], notices=["n1: done"],
                                  summary=lambda: "rollout stopped in batch 1/1: failed/unreachable: n1")
        kwargs["on_event"](rollout)
        return SimpleNamespace(rollout=rollout, succeeded=lambda: outcome["succeeded"])

    monkeypatch.setattr("provision.plan.make_plan", make_plan)
    monkeypatch.setattr("provision.run.run_playbook", run_playbook)
    lines: list[str] = []
    return PlaybookReboot("inv/prod", runs_dir=tmp_path / "runs", log=lines.append), calls, outcome, lines


def test_the_playbook_runs_on_the_node_alone_with_reboots_allowed_and_the_reason(runner):
    reboot, calls, _, lines = runner
    done = reboot("n1", "clusterctl remediate: n1-iu0 XID 79")
    assert done.ok and done.detail == ""
    assert calls["plan"] == ("inv/prod", PLAYBOOK, "n1", (1,))
    assert calls["run"]["allow_reboot"] is True
    assert calls["run"]["extravars"] == {"clusterctl_reboot_reason": "clusterctl remediate: n1-iu0 XID 79"}
    assert done.did[0].startswith("ansible-playbook node-reboot.yml --limit n1 (events: ") and done.did[1] == "n1 rebooted"
    assert lines == ["reboot: n1: done"]


def test_a_run_that_did_not_reboot_the_node_is_not_carried_out(runner):
    reboot, _, outcome, _ = runner
    outcome.update(rebooted=[], succeeded=False,
                   messages=["n1: Check that the edges no longer see the node's IUs before it reboots: not rebooted"])
    done = reboot("n1", "why")
    assert not done.ok and done.detail.startswith("n1: Check that the edges no longer see")
    outcome.update(rebooted=[], succeeded=True, messages=[])  # a play that skipped its reboot is no reboot either
    done = reboot("n1", "why")
    assert not done.ok and done.detail == "rollout stopped in batch 1/1: failed/unreachable: n1"


def test_the_node_maintenance_is_read_from_the_nodes_unit_entries():
    entries = [{"Service": {"ID": "n2-iu0"}, "Checks": [{"CheckID": NODE_MAINTENANCE_CHECK, "Notes": "theirs"}]},
               {"Service": {"ID": "n1-iu0"}, "Checks": [{"CheckID": "serfHealth"},
                                                        {"CheckID": NODE_MAINTENANCE_CHECK, "Notes": "clusterctl reboot"}]}]
    assert node_maintenance(entries, ("n1-iu0", "n1-iu1")) == "clusterctl reboot"
    assert node_maintenance(entries[:1], ("n1-iu0",)) is None
