"""The ladder around its gpu_reset rung (scripted host, in-memory Consul): a reset nvidia-smi refuses goes to the
reboot with its reason said; without Fabric Manager the whole board's units are drained (breaker for the
node), reset together and released once healthy."""

from __future__ import annotations

import pytest

from operate.remediate_breaker import Limits
from operate.remediate_reboot import RebootRun
from tests.unit.operate.test_remediate import RESET, UNIT, Consul, actions, gpu_host, ladder

pytestmark = pytest.mark.unit

IN_USE = ("The following GPUs could not be reset:\n  GPU 00000000:9A:00.0: In use by another client\n\n1 device is "
          "currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, graphics "
          "application such as an X server, or a monitoring application such as another instance of nvidia-smi). "
          "Please first kill all processes using this device and all compute applications running in the system.")


def test_a_reset_nvidia_smi_refuses_goes_to_the_reboot_with_its_reason():
    host = gpu_host({("nvidia-smi", "--gpu-reset"): (255, IN_USE)}, active_after=None)
    consul, lines, reboots = Consul(), [], []

    def reboot(node, why):
        reboots.append(node)
        host.active = True  # the unit starts with the node
        return RebootRun(True, ["ansible-playbook node-reboot.yml --limit n1", "n1 rebooted"])

    outcome = ladder(host, consul, start="gpu_reset", limits=Limits(0.5), reboot=reboot, log=lines.append).run()
    assert outcome.state == "released", outcome.message
    assert [(s.rung, s.ok) for s in outcome.steps] == [("drain", True), ("gpu_reset", False), ("reboot", True),
                                                       ("verify reboot", True), ("release", True)]
    refused = outcome.steps[1]
    assert refused.detail.startswith("nvidia-smi refused the reset: The following GPUs could not be reset: GPU "
                                     "00000000:9A:00.0: In use by another client")
    assert refused.detail.endswith("; the next rung")
    assert any("gpu_reset: REFUSED: The following GPUs could not be reset" in line for line in lines), lines
    # the unit is not started after a refused reset (the reboot brings it up); what the reset took off is back
    assert actions(host) == RESET[:7] and reboots == ["n1"]
    assert consul.maintenance == {}


def test_without_fabric_manager_the_boards_units_are_drained_reset_together_and_released():
    host = gpu_host({("nvidia-smi", "--query-gpu"): (0, "")}, active_after=("systemctl", "start", UNIT),
                    services={"nvidia-fabricmanager.service": False, "vllm-iu@0.service": True})
    consul = Consul()
    outcome = ladder(host, consul, start="gpu_reset", limits=Limits(0.5)).run()
    assert outcome.state == "released", outcome.message
    assert [(s.rung, s.ok) for s in outcome.steps] == [("drain", True), ("drain board", True), ("gpu_reset", True),
                                                       ("verify gpu_reset", True), ("release", True)]
    assert len(outcome.verdicts) == 2  # before the drain, and for the whole node before stopping its units
    assert outcome.steps[2].detail.startswith("nvidia-fabricmanager.service not active on n1")
    assert ("nvidia-smi", "--gpu-reset") in actions(host)  # no -i: every GPU of the board in one command
    assert ("systemctl", "stop", "vllm-iu@0.service") in actions(host)
    assert ("systemctl", "start", "vllm-iu@0.service") in actions(host)
    assert consul.calls == [("n1-iu1", True, "clusterctl remediate: unhealthy"),
                            ("n1-iu0", True, "clusterctl remediate: GPU reset of the board for n1-iu1"),
                            ("n1-iu1", False, ""), ("n1-iu0", False, "")]


def test_a_board_reset_the_breaker_refuses_stops_nothing():
    host = gpu_host(services={"nvidia-fabricmanager.service": False})
    consul = Consul()
    outcome = ladder(host, consul, start="gpu_reset").run()  # 6 units, 10%: the node's two are too many
    assert outcome.state == "breaker" and [v.open for v in outcome.verdicts] == [False, True]
    assert actions(host) == []  # only Fabric Manager's state was asked
    assert consul.maintenance == {"n1-iu1": "clusterctl remediate: unhealthy"}


def test_a_board_unit_that_does_not_come_back_stays_out_and_is_said():
    host = gpu_host({("nvidia-smi", "--query-gpu"): (0, "")}, active_after=("systemctl", "start", UNIT),
                    services={"nvidia-fabricmanager.service": False, "vllm-iu@0.service": False})
    consul = Consul()
    outcome = ladder(host, consul, start="gpu_reset", limits=Limits(0.5)).run()
    assert outcome.state == "released"  # the target is back
    assert consul.maintenance == {"n1-iu0": "clusterctl remediate: GPU reset of the board for n1-iu1"}
    assert outcome.left == ["n1-iu1: serving, in rotation", "n1-iu0: in maintenance for the board's reset; clear "
                                                            "it with `clusterctl preflight --release`"]
