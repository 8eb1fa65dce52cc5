"""The fabric reset rung (scripted host, in-memory Consul): a fatal SXID in the unit's score body starts the
ladder there, the plan says so, the breaker is judged for the node, Fabric Manager is restarted right before the
whole board is reset, the units start once the fabric is back, a fabric that is not goes to the reboot; a
climbing ladder passes it by. And the agent's SXID verdict is what the ladder reads."""

from __future__ import annotations

import json

import pytest

from consul_io import layout
from eas_agent.collectors.kernel_log import KernelLogReading, SxidEvent
from eas_agent.kernel_verdict import sxid_verdict
from operate.remediate_board import fatal_sxid
from operate.remediate_breaker import Limits
from operate.remediate_reboot import RebootRun
from tests.unit.operate.test_remediate import UNIT, Consul, actions, gpu_host, ladder

pytestmark = pytest.mark.unit

NOW = 10_000.0
SXID = SxidEvent("nvidia-nvswitch2", "0000:05:00.0", 24007, "Fatal", "NVLink TX: Fatal data-path error", NOW - 4)
NAMED = "fatal SXID 24007 on NVSwitch nvidia-nvswitch2 (PCI:0000:05:00.0)"
FM_RESTART = ("systemctl", "restart", "nvidia-fabricmanager.service")
NOT_READY = ("\nGPU 00000000:18:00.0\n    Fabric\n        State                             : Completed\n"
             "        Status                            : Insufficient Resources\n")


def body(reason: str, status: str = "critical", ts: float = NOW) -> str:
    """The node's score body with the agent's verdict for every IU (a fatal SXID takes them all out)."""
    return json.dumps({"node": "n1", "ts": ts, "ius": {f"n1-iu{i}": {"score": None, "status": status,
                                                                     "reason": reason} for i in (0, 1)}})


def sxid_consul() -> Consul:
    consul = Consul()
    reason = sxid_verdict(KernelLogReading(fatal_sxid=SXID), NOW, 300.0)
    consul.kv[layout.score_key("dc1", "n1")] = body(reason)
    return consul


def fabric_ladder(host, consul, **kwargs):
    remediation = ladder(host, consul, **kwargs)
    remediation.wall_clock = lambda: NOW + 1
    return remediation


def test_the_agents_fatal_sxid_verdict_is_what_the_ladder_reads():
    reason = sxid_verdict(KernelLogReading(fatal_sxid=SXID), NOW, 300.0)
    assert fatal_sxid(body(reason), "n1-iu1", NOW, 3600) == NAMED
    assert fatal_sxid(body(reason, status="passing"), "n1-iu1", NOW, 3600) is None  # the verdict has passed
    assert fatal_sxid(body(reason, ts=NOW - 7200), "n1-iu1", NOW, 3600) is None  # a body too old to act on
    assert fatal_sxid(body("XID 79 on GPU 4"), "n1-iu1", NOW, 3600) is None
    assert fatal_sxid("not json", "n1-iu1", NOW, 3600) is None and fatal_sxid(None, "n1-iu1", NOW, 3600) is None


def test_a_fatal_sxid_starts_at_the_fabric_reset_and_the_plan_says_what_it_would_do():
    host, consul = gpu_host(), sxid_consul()
    plan = fabric_ladder(host, consul).plan()
    assert plan[1] == (f"first rung: fabric_reset: its score body names a {NAMED} (the Fabric Manager user guide: the "
                       f"GPUs and NVSwitches reset, Fabric Manager restarted)")
    assert [line.split(":")[0] for line in plan[3:]] == ["fabric_reset", "reboot", "repair", "release"]
    assert plan[3].startswith("fabric_reset: the breaker judged for the whole node; every unit of n1 drained and "
                              "stopped, eas-agent.service and nvidia-dcgm.service stopped and persistence mode off, "
                              "systemctl restart nvidia-fabricmanager.service, nvidia-smi --gpu-reset (every GPU of "
                              "the board), all put back, every GPU's fabric Completed + Success within 180 s")
    assert host.calls == [] and consul.calls == []  # a plan touches nothing


def test_the_fabric_reset_drains_the_node_restarts_fabric_manager_resets_the_board_and_releases_both_units():
    host = gpu_host({("nvidia-smi", "--query-gpu"): (0, "")}, active_after=("systemctl", "start", UNIT),
                    services={"vllm-iu@0.service": True})
    consul = sxid_consul()
    outcome = fabric_ladder(host, consul, limits=Limits(0.5)).run()
    assert outcome.state == "released", outcome.message
    assert [(s.rung, s.ok) for s in outcome.steps] == [("drain", True), ("drain board", True), ("fabric_reset", True),
                                                       ("verify fabric_reset", True), ("release", True)]
    assert len(outcome.verdicts) == 2 and outcome.verdicts[1].taking == ("n1-iu0", "n1-iu1")  # the node, first
    done = actions(host)
    stops = [done.index(("systemctl", "stop", f"vllm-iu@{i}.service")) for i in (0, 1)]
    restart, reset, fabric = done.index(FM_RESTART), done.index(("nvidia-smi", "--gpu-reset")), done.index(
        ("nvidia-smi", "-q", "-i", "0,1,2,3,4,5,6,7"))
    starts = [done.index(("systemctl", "start", f"vllm-iu@{i}.service")) for i in (0, 1)]
    assert max(stops) < restart < reset < fabric < min(starts)
    assert consul.calls == [("n1-iu1", True, "clusterctl remediate: unhealthy"),
                            ("n1-iu0", True, "clusterctl remediate: fabric reset of the board for n1-iu1"),
                            ("n1-iu1", False, ""), ("n1-iu0", False, "")]
    assert outcome.steps[2].detail.startswith(f"{NAMED}: nvidia-fabricmanager.service restarted and every GPU")


def test_the_breaker_refuses_the_fabric_reset_before_any_unit_is_stopped():
    host, consul = gpu_host(), sxid_consul()
    outcome = fabric_ladder(host, consul).run()  # 6 units, 10%: the node's two are too many
    assert outcome.state == "breaker" and [v.open for v in outcome.verdicts] == [False, True]
    assert actions(host) == [] and consul.maintenance == {"n1-iu1": "clusterctl remediate: unhealthy"}


def test_a_fabric_not_back_after_the_reset_goes_to_the_reboot_with_the_units_left_stopped():
    host = gpu_host({("nvidia-smi", "--query-gpu=index,pci.bus_id,persistence_mode"): (0, "0, 00000000:18:00.0, Disabled\n"),
                     ("nvidia-smi", "-q"): (0, NOT_READY)}, active_after=None, services={"vllm-iu@0.service": True})
    consul, reboots = sxid_consul(), []

    def reboot(node, why):
        reboots.append(node)
        host.active = True
        return RebootRun(True, ["ansible-playbook node-reboot.yml --limit n1", "n1 rebooted"])

    outcome = fabric_ladder(host, consul, limits=Limits(0.5), reboot=reboot).run()
    assert [(s.rung, s.ok) for s in outcome.steps][2:4] == [("fabric_reset", False), ("reboot", True)]
    assert outcome.steps[2].detail == ("FABRIC NOT READY: n1: the fabric did not come back after the reset: GPU 0 "
                                       "(00000000:18:00.0) fabric state Completed, status Insufficient Resources: "
                                       "the next rung")
    assert reboots == ["n1"] and ("systemctl", "start", UNIT) not in actions(host)


def test_a_climbing_ladder_passes_the_fabric_reset_by_and_the_operator_can_name_it():
    host, consul = gpu_host(), sxid_consul()
    assert [line.split(":")[0] for line in fabric_ladder(host, consul, start="restart").plan()[3:]] == [
        "restart", "gpu_reset", "reboot", "repair", "release"]
    named = fabric_ladder(host, consul, start="fabric_reset")
    assert [line.split(":")[0] for line in named.plan()[3:]] == ["fabric_reset", "reboot", "repair", "release"]
    assert named.start_why == "named by the operator (--from)" and named.fabric_fault is None
