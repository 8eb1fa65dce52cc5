"""The gpu_reset rung's scope (nvidia-smi(1)'s NVSwitch table) and its host steps in order, over a scripted
host: what is stopped, what is put back whatever the reset's outcome, a refusal against a command that
cannot run."""

from __future__ import annotations

import dataclasses

import pytest

from cluster.model import build_cluster
from operate.drill_faults import HostStepError
from operate.gpu_reset import GpuReset, fabric_scope, fabric_states, gpu_rows, refused, reset_scope
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


def q_block(bus: str, state: str, status: str) -> str:
    """One GPU's block of ``nvidia-smi -q`` as the R550 driver prints it (the Fabric section between Voltage and
    Processes)."""
    return (f"GPU {bus}\n    Product Name                          : NVIDIA H100 80GB HBM3\n"
            f"    Voltage\n        Graphics                          : 670.000 mV\n"
            f"    Fabric\n        State                             : {state}\n"
            f"        Status                            : {status}\n"
            f"        CliqueId                          : 0\n    Processes                             : None\n\n")


BUSES = {4: "00000000:9A:00.0", 5: "00000000:AB:00.0", 6: "00000000:BA:00.0", 7: "00000000:DB:00.0"}


def fabric_q(states: dict[int, tuple[str, str]]) -> str:
    return "\n==============NVSMI LOG==============\n\n" + "".join(q_block(BUSES[g], *s) for g, s in states.items())


class Training(Scripted):
    """A host whose ``nvidia-smi -q`` answers the next of ``answers`` each time (the last one from then on)."""

    def __init__(self, answers: dict, fabric: list[str]):
        super().__init__(answers)
        self.fabric = fabric

    def __call__(self, argv, check):
        if tuple(argv)[:2] == ("nvidia-smi", "-q"):
            self.calls.append(tuple(argv))
            return result(0, self.fabric.pop(0) if len(self.fabric) > 1 else self.fabric[0])
        return super().__call__(argv, check)


class Clock:
    def __init__(self):
        self.t, self.sleeps = 100.0, []

    def __call__(self):
        return self.t

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.t += seconds


def every(state: str, status: str) -> dict[int, tuple[str, str]]:
    return {g: (state, status) for g in BUSES}


START = [("systemctl", "reset-failed", "vllm-iu@1.service"), ("systemctl", "start", "vllm-iu@1.service")]


def test_the_units_start_only_once_every_reset_gpus_fabric_is_completed_with_success():
    n1, clock = node(), Clock()
    states = [fabric_q(every("Not Started", "N/A")), fabric_q(every("In Progress", "N/A")),
              fabric_q({**every("Completed", "Success"), 6: ("In Progress", "N/A")}), fabric_q(every("Completed",
                                                                                                   "Success"))]
    host = Training(ALIVE, states)
    done = GpuReset(n1, n1.ius[1], host, clock=clock, sleep=clock.sleep).carry_out(reset_scope(n1, n1.ius[1], True))
    assert done.ok and not done.fabric
    assert host.calls[-6:] == [FABRIC] * 4 + START and len(clock.sleeps) == 3  # four polls, the units after
    assert done.did[-3] == "nvidia-smi -q -i 4,5,6,7: fabric Completed/Success on 4 GPU(s) after 4 poll(s)"


def test_a_fabric_that_completes_with_an_error_status_leaves_the_units_stopped_and_names_gpu_state_and_status():
    n1, clock = node(), Clock()
    host = Training(ALIVE, [fabric_q({**every("Completed", "Success"), 5: ("Completed", "Insufficient Resources")})])
    done = GpuReset(n1, n1.ius[1], host, clock=clock, sleep=clock.sleep).carry_out(reset_scope(n1, n1.ius[1], True))
    assert not done.ok and done.fabric and clock.sleeps == []  # Completed is final: no waiting out the bound
    assert done.detail == ("n1: the fabric did not come back after the reset: GPU 5 (00000000:AB:00.0) fabric state "
                           "Completed, status Insufficient Resources")
    assert host.calls[-1] == FABRIC and not any(c[:2] == ("systemctl", "start") and "vllm" in c[2] for c in host.calls)


def test_a_fabric_still_training_at_the_bound_fails_naming_each_gpu_left():
    n1, clock = node(), Clock()
    host = Training(ALIVE, [fabric_q({**every("Completed", "Success"), 4: ("In Progress", "N/A"),
                                      7: ("Not Started", "N/A")})])
    job = GpuReset(n1, n1.ius[1], host, fabric_wait_s=3, clock=clock, sleep=clock.sleep)
    done = job.carry_out(reset_scope(n1, n1.ius[1], True))
    assert not done.ok and done.fabric and sum(clock.sleeps) == 3.0
    assert done.detail == ("n1: the fabric did not come back after the reset within 3 s: GPU 4 (00000000:9A:00.0) "
                           "fabric state In Progress, status N/A; GPU 7 (00000000:DB:00.0) fabric state Not Started, "
                           "status N/A")
    assert ("systemctl", "start", "vllm-iu@1.service") not in host.calls


def test_gpus_without_a_fabric_are_not_waited_for():
    n1, clock = node(), Clock()
    host = Training(ALIVE, [fabric_q(every("N/A", "N/A"))])  # PCIe: nvidia-smi -q says N/A
    done = GpuReset(n1, n1.ius[1], host, clock=clock, sleep=clock.sleep).carry_out(reset_scope(n1, n1.ius[1], True))
    assert done.ok and clock.sleeps == [] and host.calls[-3:] == [FABRIC, *START]
    assert "nvidia-smi -q -i 4,5,6,7: no GPU on an NVSwitch fabric: nothing to wait for" in done.did


def test_the_fabric_section_is_read_per_gpu_from_nvidia_smi_q():
    text = fabric_q({4: ("Completed", "Success"), 5: ("In Progress", "N/A")}) + "GPU 00000000:DB:00.0\n    Fabric\n"
    assert fabric_states(text) == {BUSES[4]: ("Completed", "Success"), BUSES[5]: ("In Progress", "N/A"),
                                   BUSES[7]: ("", "")}
    assert fabric_states("GPU 00000000:9A:00.0\n    Product Name : x\n    Processes : None\n") == {}  # no section


def test_the_fabric_reset_restarts_fabric_manager_right_before_resetting_the_whole_board():
    n1 = node()
    host = Scripted({("nvidia-smi", "--query-gpu"): (0, "")})
    scope = fabric_scope(n1, "fatal SXID 24007 on NVSwitch nvidia-nvswitch2 (PCI:0000:05:00.0)")
    done = GpuReset(n1, n1.ius[1], host).carry_out(scope, restart_fabric_manager=True)
    assert done.ok and scope.board and scope.gpus == tuple(range(8))
    at = host.calls.index(("systemctl", "restart", "nvidia-fabricmanager.service"))
    assert host.calls[at + 1] == ("nvidia-smi", "--gpu-reset")  # no -i: every GPU of the board
    assert host.calls[:2] == [("systemctl", "stop", "vllm-iu@0.service"), ("systemctl", "stop", "vllm-iu@1.service")]
    assert scope.why == ("fatal SXID 24007 on NVSwitch nvidia-nvswitch2 (PCI:0000:05:00.0): nvidia-fabricmanager.service "
                         "restarted and every GPU of the NVSwitch board (all 8) reset")
