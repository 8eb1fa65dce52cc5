"""Fault steps over a scripted transport: the commands each kind runs on the target, the undo recorded before
each change, undo newest first, and an undo that fails named as not restored."""

from __future__ import annotations

import pytest

from cluster.model import build_node
from operate.drill_faults import FaultError, FaultStep, Target
from preflight.transport import CommandResult

pytestmark = pytest.mark.unit

NODE = build_node("n1", {"ansible_host": "127.0.67.1", "rack": "r1", "gpu_model": "h100-sxm", "gpu_count": 8,
                         "iu_size": 4})
IU1 = Target(NODE, NODE.ius[1])
ENV = "VLLM_MODEL_PATH=/models/llama-70b\nVLLM_ARGS=--port 8001\n"


class ScriptedHost:
    """Answers argv by its first words; records every command run."""

    def __init__(self, answers: dict[tuple[str, ...], tuple[int, str]] | None = None):
        self.answers = answers or {}
        self.calls: list[tuple[str, ...]] = []

    def run(self, host, argv, timeout):
        self.calls.append(tuple(argv))
        rc, out = next((a for prefix, a in self.answers.items() if tuple(argv[:len(prefix)]) == prefix), (0, ""))
        return CommandResult(rc, out, "" if rc == 0 else "Operation not permitted", 0.01, argv=tuple(argv))


def pid_host(pid: str = "4242", more: dict | None = None) -> ScriptedHost:
    return ScriptedHost({("systemctl", "show"): (0, f"{pid}\n"), **(more or {})})


SHOW = ("systemctl", "show", "--property", "MainPID", "--value", "vllm-iu@1.service")


START = [("systemctl", "reset-failed", "vllm-iu@1.service"), ("systemctl", "start", "vllm-iu@1.service")]


@pytest.mark.parametrize(("kind", "signal", "undo"), [
    ("engine_stall", "-STOP", [("kill", "-CONT", "4242")]),
    ("engine_crash", "-KILL", START),  # past the unit's start limit: reset-failed first
    ("graceful_stop", "-TERM", START),
])
def test_signal_faults_hit_systemds_main_pid_and_undo_once(kind, signal, undo):
    host = pid_host()
    step = FaultStep(kind, IU1, host)
    step.inject()
    assert host.calls == [SHOW, ("kill", signal, "4242")]
    restored = step.undo()
    assert host.calls[2:] == undo and len(restored) == 1 and "NOT" not in restored[0]
    assert step.undo() == [] and len(host.calls) == 2 + len(undo)  # an undo runs once


def test_a_unit_that_is_not_running_is_not_faulted_and_nothing_needs_undoing():
    step = FaultStep("engine_crash", IU1, pid_host("0"))
    with pytest.raises(FaultError, match=r"n1-iu1: vllm-iu@1.service is not running \(MainPID 0\)"):
        step.inject()
    assert step.undo() == []


def test_a_signal_that_fails_still_leaves_its_undo_recorded():
    host = pid_host(more={("kill", "-STOP"): (1, "")})
    step = FaultStep("engine_stall", IU1, host)
    with pytest.raises(FaultError, match=r"`kill -STOP 4242` exited 1: Operation not permitted"):
        step.inject()
    assert step.undo() == ["n1-iu1: SIGCONT to PID 4242"] and host.calls[-1] == ("kill", "-CONT", "4242")


def test_weights_missing_moves_the_weights_aside_restarts_and_undoes_in_reverse():
    weights = "/models/llama-70b/model-00001.safetensors\n/models/llama-70b/model-00002.safetensors\n"
    host = ScriptedHost({("cat",): (0, ENV), ("find", "/models/llama-70b", "-maxdepth", "1", "-type", "f", "-name",
                                              "*.safetensors"): (0, weights)})
    step = FaultStep("weights_missing", IU1, host)
    step.inject()
    aside = "/models/llama-70b.drill-aside"
    assert host.calls[0] == ("cat", "/etc/vllm-iu/1.env")
    assert host.calls[-4:] == [("mkdir", "-p", aside),
                               ("mv", "-t", aside, *weights.split()),
                               ("systemctl", "reset-failed", "vllm-iu@1.service"),
                               ("systemctl", "restart", "vllm-iu@1.service")]
    mark = len(host.calls)
    assert step.undo() == ["n1-iu1: 2 weight files moved back to /models/llama-70b",
                           "n1-iu1: vllm-iu@1.service restarted with its weights"]
    assert host.calls[mark:] == [
        ("find", aside, "-maxdepth", "1", "-type", "f", "-exec", "mv", "-t", "/models/llama-70b", "{}", "+"),
        ("rmdir", aside), ("systemctl", "reset-failed", "vllm-iu@1.service"),
        ("systemctl", "restart", "vllm-iu@1.service")]


def test_weights_missing_refuses_a_directory_without_weights_and_changes_nothing():
    host = ScriptedHost({("cat",): (0, ENV)})
    step = FaultStep("weights_missing", IU1, host)
    with pytest.raises(FaultError, match="holds no weight files"):
        step.inject()
    assert step.undos == [] and not any(c[0] in ("mv", "mkdir", "systemctl") for c in host.calls)


def test_an_undo_that_fails_is_named_and_the_others_still_run():
    host = ScriptedHost({("cat",): (0, ENV), ("find", "/models/llama-70b"): (0, "/models/llama-70b/a.bin\n")})
    step = FaultStep("weights_missing", IU1, host)
    step.inject()
    host.answers = {("find",): (1, "")}
    restored = step.undo()
    assert restored[0].startswith("n1-iu1: NOT restored (3 weight files moved back to /models/llama-70b): `find ")
    assert restored[0].endswith("exited 1: Operation not permitted")
    assert restored[1] == "n1-iu1: vllm-iu@1.service restarted with its weights"


def test_consul_agent_down_acts_on_the_node():
    host = ScriptedHost()
    step = FaultStep("consul_agent_down", Target(NODE), host)
    step.inject()
    assert step.undo() == ["n1: consul.service started"]
    assert host.calls == [("systemctl", "stop", "consul.service"), ("systemctl", "start", "consul.service")]
    assert Target(NODE).iu_ids == ("n1-iu0", "n1-iu1")


def test_a_host_with_ansible_become_gets_every_command_and_undo_through_sudo():
    host = pid_host(more={("sudo", "-n", "--", "systemctl", "show"): (0, "77\n")})
    step = FaultStep("engine_stall", Target(NODE, NODE.ius[1], become=True), host)
    step.inject()
    step.undo()
    assert host.calls == [("sudo", "-n", "--", *SHOW), ("sudo", "-n", "--", "kill", "-STOP", "77"),
                          ("sudo", "-n", "--", "kill", "-CONT", "77")]


def test_node_hang_freezes_every_engine_then_the_edge_and_the_agents_and_thaws_them_newest_first():
    host = ScriptedHost({("systemctl", "show"): (0, "4242\n"), ("systemctl", "is-active", "consul.service"):
                         (3, "inactive\n"), ("systemctl", "is-active", "haproxy.service"): (4, "inactive\n"),
                         ("systemctl", "is-active"): (0, "active\n")})
    step = FaultStep("node_hang", Target(NODE), host)
    step.inject()
    frozen = ("vllm-iu@0.service", "vllm-iu@1.service", "eas-edge.service", "eas-agent.service")
    assert [c for c in host.calls if c[1] == "freeze"] == [("systemctl", "freeze", u) for u in frozen]
    assert [d for d in step.done if "nothing to freeze" in d] == [
        f"{u} not running on n1: nothing to freeze" for u in ("haproxy.service", "consul.service")]
    host.calls.clear()
    assert step.undo() == [f"n1: {u} thawed" for u in reversed(frozen)]
    assert host.calls == [("systemctl", "thaw", u) for u in reversed(frozen)]


NO_FREEZER = "Failed to freeze unit {}: Unit '{}' does not support freezing."  # systemd 252 on cgroup v1/hybrid


def test_node_hang_stops_every_process_of_each_unit_where_systemd_has_no_freezer():
    host = ScriptedHost({("systemctl", "show"): (0, "4242\n"), ("systemctl", "is-active"): (3, "inactive\n"),
                         ("systemctl", "freeze"): (1, NO_FREEZER.format("vllm-iu@0.service", "vllm-iu@0.service"))})
    step = FaultStep("node_hang", Target(NODE), host)
    step.inject()
    engines = ("vllm-iu@0.service", "vllm-iu@1.service")
    assert [c for c in host.calls if c[1] == "kill"] == [("systemctl", "kill", "--signal=SIGSTOP", u) for u in engines]
    assert step.done[:2] == [f"{u} stopped (SIGSTOP to every process: no cgroup freezer on n1)" for u in engines]
    host.calls.clear()
    assert step.undo() == [f"n1: {u} continued (SIGCONT to every process)" for u in reversed(engines)]
    assert host.calls == [("systemctl", "kill", "--signal=SIGCONT", u) for u in reversed(engines)]


def test_node_hang_fails_on_any_other_freeze_error_and_names_it():
    host = ScriptedHost({("systemctl", "show"): (0, "4242\n"), ("systemctl", "freeze"): (1, "Access denied")})
    step = FaultStep("node_hang", Target(NODE), host)
    with pytest.raises(FaultError, match=r"n1: `systemctl freeze vllm-iu@0.service` exited 1: "):
        step.inject()
    assert not [c for c in host.calls if c[1] == "kill"]


def test_node_hang_refuses_a_node_whose_engine_is_down_after_thawing_what_it_froze():
    host = ScriptedHost({SHOW: (0, "0\n"), ("systemctl", "show"): (0, "4242\n")})
    step = FaultStep("node_hang", Target(NODE), host)
    with pytest.raises(FaultError, match=r"n1-iu1: vllm-iu@1.service is not running \(MainPID 0\): a hang of n1"):
        step.inject()
    assert step.undo() == ["n1: vllm-iu@0.service thawed"]  # the drill's undo puts back what the fault did


def test_edge_restart_asks_systemd_for_the_restart_without_waiting_for_the_drain():
    host = ScriptedHost({("systemctl", "is-active"): (0, "active\n")})
    step = FaultStep("edge_restart", Target(NODE), host)
    step.inject()
    assert host.calls == [("systemctl", "is-active", "eas-edge.service"),
                          ("systemctl", "restart", "--no-block", "eas-edge.service")]
    assert step.undo() == ["n1: eas-edge.service started (a no-op once its restart finished)"]
    down = FaultStep("edge_restart", Target(NODE), ScriptedHost({("systemctl", "is-active"): (3, "inactive\n")}))
    with pytest.raises(FaultError, match=r"n1: eas-edge.service is not running: no edge to restart there"):
        down.inject()
    assert down.undo() == []


def device_op(argv: tuple[str, ...]) -> tuple[str, ...]:
    """A device command's operation and JSON arguments."""
    assert argv[0] == "clusterctl-drill-device"
    return argv[1:]


def test_gpu_lost_reads_the_gpus_state_records_its_undo_then_takes_it_off_the_bus():
    host = ScriptedHost({("clusterctl-drill-device",): (0, "[2, false, 1, false]\n")})
    step = FaultStep("gpu_lost", IU1, host)
    step.inject()
    assert [device_op(c) for c in host.calls] == [("gpu-state", "4"), ("gpu-lost", "4", "79")]  # IU 1: GPUs 4-7
    assert step.done == ["GPU 4 of vllm-iu@1.service off the bus: XID 79 in the kernel log and NVML's events, "
                         "NVML answers GPU is lost"]
    assert step.undo() == ["n1-iu1: GPU 4 back on the bus (NVML answers it, its XID 79 lines gone)"]
    assert device_op(host.calls[-1]) == ("gpu-restore", "4", "[2, false, 1, false]")


def test_a_host_without_the_gpus_state_fails_the_step_with_nothing_to_undo():
    host = ScriptedHost({("clusterctl-drill-device",): (1, "")})
    step = FaultStep("gpu_lost", IU1, host)
    with pytest.raises(FaultError, match=r"^n1: `clusterctl-drill-device gpu-state 4` exited 1: Operation not permitted$"):
        step.inject()
    assert step.undos == [] and len(host.calls) == 1


IB_NICS = [{"device": f"mlx5_{i}", "netdev": f"ibp{24 + i}s0", "link_layer": "infiniband"} for i in (0, 1)]
IB_NODE = build_node("n1", {"ansible_host": "127.0.67.1", "rack": "r1", "gpu_model": "h100-sxm", "gpu_count": 8,
                            "iu_size": 4, "rdma_nics": IB_NICS})


def port_info(link: str, phys: str) -> str:
    """ibportstate's query answer (infiniband-diags ibportstate.c show_port_info), the first lines."""
    return (f"CA/RT PortInfo:\n# Port info: DR path slid 65535; dlid 65535; 0 port 1\n"
            f"LinkState:.......................{link}\nPhysLinkState:...................{phys}\n"
            f"Lid:.............................17\n")


def ibportstate(device: str, op: str) -> tuple[str, ...]:
    return ("ibportstate", "-C", device, "-P", "1", "-D", "0", "1", op)


def test_ib_port_down_disables_each_infiniband_port_with_ibportstate_and_the_undo_turns_them_on():
    host = ScriptedHost({ibportstate("mlx5_0", "query"): (0, port_info("Active", "LinkUp")),
                         ibportstate("mlx5_1", "query"): (0, port_info("Down", "Disabled")),
                         ibportstate("mlx5_0", "disable"): (0, port_info("Active", "LinkUp"))})
    step = FaultStep("ib_port_down", Target(IB_NODE), host)
    step.inject()
    assert host.calls == [("ip", "-o", "addr", "show", "dev", "ibp24s0"), ("ip", "-o", "addr", "show", "dev", "ibp25s0"),
                          ibportstate("mlx5_0", "query"), ibportstate("mlx5_1", "query"),
                          ibportstate("mlx5_0", "disable")]  # mlx5_1 was Disabled already: left so
    assert step.done == ["n1: mlx5_1 port 1 already Disabled: left as it is",
                         "n1: mlx5_0 port 1 disabled (ibportstate: PhysLinkState Disabled)"]
    assert step.undo() == ["n1: mlx5_0 port 1 enabled (was Active/LinkUp)"]
    assert host.calls[-1] == ibportstate("mlx5_0", "on")  # "on": enables only a port that is disabled


def test_ib_port_down_refuses_a_roce_node_and_a_management_address_on_ipoib_touching_nothing():
    roce = build_node("n1", {"ansible_host": "127.0.67.1", "rack": "r1", "gpu_model": "h100-sxm", "gpu_count": 8,
                             "iu_size": 4, "rdma_nics": [{**IB_NICS[0], "link_layer": "ethernet"}]})
    host = ScriptedHost()
    with pytest.raises(FaultError, match=r"^n1: no InfiniBand port in rdma_nics \(RoCE ports are Ethernet"):
        FaultStep("ib_port_down", Target(roce), host).inject()
    assert host.calls == []
    ipoib = ScriptedHost({("ip", "-o", "addr", "show", "dev", "ibp25s0"): (
        0, "7: ibp25s0    inet 127.0.67.1/24 brd 127.0.67.255 scope global ibp25s0\n")})
    step = FaultStep("ib_port_down", Target(IB_NODE), ipoib)
    with pytest.raises(FaultError, match=r"^n1: ansible_host 127.0.67.1 is on ibp25s0, the IPoIB netdev of mlx5_1: "
                                         r"disabling its port would cut the drill off the host it must restore$"):
        step.inject()
    assert step.undos == [] and not any(c[0] == "ibportstate" for c in ipoib.calls)


class Answer(ScriptedHost):
    """Answers one argv prefix with exit, stdout and stderr of its own."""

    def __init__(self, prefix, rc, out, err):
        super().__init__()
        self.prefix, self.answer = prefix, (rc, out, err)

    def run(self, host, argv, timeout):
        if tuple(argv[:len(self.prefix)]) == self.prefix:
            self.calls.append(tuple(argv))
            return CommandResult(self.answer[0], self.answer[1], self.answer[2], 0.01, argv=tuple(argv))
        return super().run(host, argv, timeout)


def test_ib_port_down_without_root_fails_with_ibportstates_own_reason_and_nothing_changed():
    err = ("ibwarn: [4242] smi_gsi_port_open: Can't open SMI UMAD port (Permission denied) (mlx5_0:1)\n"
           "ibwarn: [4242] mad_rpc_open_port2: can't open UMAD port (mlx5_0:1)\n")
    host = Answer(("ibportstate",), 255, "ibportstate: iberror: failed: Failed to open 'mlx5_0' port '1'\n", err)
    step = FaultStep("ib_port_down", Target(IB_NODE), host)
    with pytest.raises(FaultError, match=r"^n1: `ibportstate -C mlx5_0 -P 1 -D 0 1 query` exited 255: Can't open SMI "
                                         r"UMAD port \(Permission denied\) \(mlx5_0:1\)$"):
        step.inject()
    assert step.undos == [] and host.calls[-1] == ibportstate("mlx5_0", "query")
