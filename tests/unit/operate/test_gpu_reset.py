"""The gpu_reset rung's scope (nvidia-smi(1)'s NVSwitch table) and its host steps in order, over a scripted
host: what is stopped, what is put back whatever the reset's outcome, a refusal against a command that
cannot run."""

from __future__ import annotations

import dataclasses

import pytest

from cluster.model import build_cluster
from operate.drill_faults import HostStepError
from operate.gpu_reset import GpuReset, gpu_rows, refused, reset_scope
from preflight.transport import CommandResult

pytestmark = pytest.mark.unit


def node(gpu_model: str = "h100-sxm"):
    cluster = build_cluster({"n1": {"ansible_host": "127.0.86.1", "rack": "r1", "gpu_model": gpu_model,
                                    "gpu_count": 8, "iu_size": 4}})
    return cluster.node("n1")


@pytest.mark.parametrize("gpu_model", ["h100-sxm", "h200-sxm", "a100-sxm"])
def test_with_fabric_manager_active_an_ampere_or_newer_unit_is_reset_alone(gpu_model):
    n1 = node(gpu_model)
    scope = reset_scope(n1, n1.ius[1], fabric_manager_active=True)
    assert not scope.board and scope.gpus == (4, 5, 6, 7) and [iu.id for iu in scope.ius] == ["n1-iu1"]
    assert scope.argv() == ("nvidia-smi", "--gpu-reset", "-i", "4,5,6,7")


@pytest.mark.parametrize("gpu_model", ["h100-sxm", "a100-sxm"])
def test_without_fabric_manager_the_whole_nvswitch_board_and_every_unit_of_the_node(gpu_model):
    n1 = node(gpu_model)
    scope = reset_scope(n1, n1.ius[1], fabric_manager_active=False)
    assert scope.board and scope.gpus == tuple(range(8)) and [iu.id for iu in scope.ius] == ["n1-iu0", "n1-iu1"]
    assert scope.argv() == ("nvidia-smi", "--gpu-reset")  # no -i: every GPU of the system
    assert scope.why.startswith("nvidia-fabricmanager.service not active on n1: on an NVSwitch board every NVLink")


def test_a_board_of_an_unknown_generation_is_reset_whole_even_with_fabric_manager():
    n1 = dataclasses.replace(node(), gpu_model="v100-sxm")  # before Ampere: peers always together (nvidia-smi(1))
    scope = reset_scope(n1, n1.ius[0], fabric_manager_active=True)
    assert scope.board and scope.why.startswith("v100-sxm (architecture unknown) on NVSwitches")


def result(rc, out="", err="", **kw) -> CommandResult:
    return CommandResult(rc, out, err, 0.01, **kw)


def test_a_refusal_is_nvidia_smis_own_exit_not_a_command_that_could_not_run():
    assert refused(result(255, "The following GPUs could not be reset:"))
    assert refused(result(3, "Unable to reset GPU 00000000:18:00.0: Not Supported"))
    assert not refused(result(0))
    assert not refused(result(127, err="sh: nvidia-smi: not found"))
    assert not refused(result(None, err="No such file or directory"))  # the program is missing here
    assert not refused(result(None, unreachable=True)) and not refused(result(None, timed_out=True))


def test_persistence_mode_is_read_from_the_query_csv():
    assert gpu_rows("0, 00000000:18:00.0, Enabled\n1, 00000000:2A:00.0, Disabled\n[N/A], x, Enabled\n") == [
        (0, "00000000:18:00.0", True), (1, "00000000:2A:00.0", False)]


class Scripted:
    """A host answering argv by prefix; records what ran."""

    def __init__(self, answers: dict):
        self.answers, self.calls = answers, []

    def __call__(self, argv, check):
        argv = tuple(argv)
        self.calls.append(argv)
        rc, out = next((a for p, a in self.answers.items() if argv[:len(p)] == p), (0, ""))
        answer = result(rc, out, "" if rc == 0 else "failed")
        if check and not answer.ok:
            raise HostStepError(f"n1: `{' '.join(argv)}` {answer.ended()}")
        return answer


IN_USE = ("The following GPUs could not be reset:\n  GPU 00000000:9A:00.0: In use by another client\n\n"
          "1 device is currently being used by one or more other processes")
ALIVE = {("systemctl", "is-active", "eas-agent.service"): (0, "active\n"),
         ("systemctl", "is-active", "nvidia-dcgm.service"): (0, "active\n"),
         ("nvidia-smi", "--query-gpu=index,pci.bus_id,persistence_mode"): (0, "4, 00000000:9A:00.0, Enabled\n5, 00000000:AB:00.0, Disabled\n6, 00000000:BA:00.0, Enabled\n7, 00000000:DB:00.0, Enabled\n")}
TAKEN_OFF = [("systemctl", "stop", "vllm-iu@1.service"), ("systemctl", "is-active", "eas-agent.service"),
             ("systemctl", "stop", "eas-agent.service"), ("systemctl", "is-active", "nvidia-dcgm.service"),
             ("systemctl", "stop", "nvidia-dcgm.service"),
             ("nvidia-smi", "--query-gpu=index,pci.bus_id,persistence_mode", "--format=csv,noheader", "-i", "4,5,6,7"),
             ("nvidia-smi", "-pm", "0", "-i", "4,6,7")]
PUT_BACK = [("nvidia-smi", "-pm", "1", "-i", "4,6,7"), ("systemctl", "start", "eas-agent.service"),
            ("systemctl", "start", "nvidia-dcgm.service")]
FABRIC = ("nvidia-smi", "-q", "-i", "4,5,6,7")


def test_the_reset_takes_every_client_off_resets_puts_them_back_then_starts_the_unit():
    n1 = node()
    host = Scripted(ALIVE)
    done = GpuReset(n1, n1.ius[1], host).carry_out(reset_scope(n1, n1.ius[1], True))
    assert done.ok and done.detail == ""
    assert host.calls == [*TAKEN_OFF, ("nvidia-smi", "--gpu-reset", "-i", "4,5,6,7"), *PUT_BACK, FABRIC,
                          ("systemctl", "reset-failed", "vllm-iu@1.service"), ("systemctl", "start", "vllm-iu@1.service")]


def test_a_refused_reset_puts_the_clients_back_leaves_the_unit_stopped_and_says_why():
    n1 = node()
    host = Scripted({**ALIVE, ("nvidia-smi", "--gpu-reset"): (255, IN_USE)})
    done = GpuReset(n1, n1.ius[1], host).carry_out(reset_scope(n1, n1.ius[1], True))
    assert not done.ok and done.detail.startswith("The following GPUs could not be reset: GPU 00000000:9A:00.0: In use "
                                                  "by another client 1 device is currently being used")
    assert host.calls == [*TAKEN_OFF, ("nvidia-smi", "--gpu-reset", "-i", "4,5,6,7"), *PUT_BACK]
    assert "nvidia-smi --gpu-reset -i 4,5,6,7 (exited 255)" in done.did


def test_a_reset_that_cannot_run_raises_after_putting_the_clients_back():
    n1 = node()
    host = Scripted({**ALIVE, ("nvidia-smi", "--gpu-reset"): (127, "")})
    with pytest.raises(HostStepError, match=r"n1: `nvidia-smi --gpu-reset -i 4,5,6,7` exited 127"):
        GpuReset(n1, n1.ius[1], host).carry_out(reset_scope(n1, n1.ius[1], True))
    assert host.calls[-3:] == PUT_BACK


def test_the_board_scope_stops_every_unit_and_resets_without_i():
    n1 = node()
    host = Scripted({("nvidia-smi", "--query-gpu"): (0, "")})  # nothing in persistence mode, no client running
    job = GpuReset(n1, n1.ius[1], host)
    scope = job.scope()  # Fabric Manager: the scripted is-active answers "" -> not active
    done = job.carry_out(scope)
    assert done.ok and scope.board
    assert host.calls[0] == ("systemctl", "is-active", "nvidia-fabricmanager.service")
    assert host.calls[1:3] == [("systemctl", "stop", "vllm-iu@0.service"), ("systemctl", "stop", "vllm-iu@1.service")]
    assert ("nvidia-smi", "--gpu-reset") in host.calls and host.calls[-2:] == [
        ("systemctl", "reset-failed", "vllm-iu@1.service"), ("systemctl", "start", "vllm-iu@1.service")]
    assert ("systemctl", "start", "vllm-iu@0.service") in host.calls
