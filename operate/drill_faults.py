"""Fault steps of a drill: each acts on real processes, units and files of one target host through the same
transport as preflight (:class:`preflight.transport.RoutingTransport`: SSH to ``ansible_host``, or local
commands for ``ansible_connection: local``), and knows how to undo what it did.

=================  ======  ====================================================  ================================
kind               target  what it does on the host                              undo
=================  ======  ====================================================  ================================
engine_stall       unit    ``kill -STOP`` the unit's MainPID (systemd's)         ``kill -CONT`` that PID
engine_crash       unit    ``kill -KILL`` the MainPID (systemd restarts it:      ``systemctl start`` the unit
                           ``Restart=on-failure``)                               (after ``reset-failed``)
graceful_stop      unit    ``kill -TERM`` the MainPID: a clean stop, systemd     ``systemctl start`` the unit
                           does not restart it (the negative control)
weights_missing    unit    the model directory's weight files (``*.safetensors``  files moved back, then
                           ``*.bin``, ``*.pt``) moved to ``<dir>.drill-aside``,  ``systemctl restart`` the unit
                           then ``systemctl restart``: vLLM must exit with an
                           error, never serve
consul_agent_down  node    ``systemctl stop consul.service``                     ``systemctl start consul.service``
node_hang          node    ``systemctl freeze`` (cgroup freezer: every process   ``systemctl thaw`` each, in the
                           of the unit suspended) of each IU unit of the node,   reverse order (SIGCONT to every
                           then of ``eas-edge.service``, ``haproxy.service``,    process of a unit that was
                           ``eas-agent.service`` and ``consul.service`` where    stopped by SIGSTOP)
                           they run: nothing on the node answers, its
                           connections hang; sshd is left running, so the undo
                           can reach the node. Where systemd has no freezer
                           (no unified cgroup hierarchy: cgroup v1 or hybrid),
                           ``systemctl kill --signal=SIGSTOP`` stops every
                           process of the unit instead
edge_restart       edge    ``systemctl restart --no-block eas-edge.service``     ``systemctl start
                           on the node that runs the edge: systemd's SIGTERM,    eas-edge.service`` (a no-op once
                           the edge drains (its listener closed, requests in     the restart finished)
                           flight given ``drain_timeout_s``), then starts again
gpu_lost           unit    the unit's first GPU off the bus: XID 79 (NVIDIA's    the GPU answers NVML again, its
                           Xid catalog: ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_   lost mark off in the driver's
                           BUS, "GPU has fallen off the bus.") added to the      view, the XID 79 taken out of
                           driver's kernel log (``dmesg``, ``journalctl -k``)    both (the counts as they were)
                           and NVML's XID events, and every NVML call on it
                           ``NVMLError_GpuIsLost`` (NVML_ERROR_GPU_IS_LOST: "the
                           GPU has fallen off the bus or has otherwise become
                           inaccessible"); ``nvidia-smi`` exits 15
ib_port_down       node    every InfiniBand port of the node's ``rdma_nics``     ``ibportstate ... on`` for each
                           disabled with ``ibportstate -C CA -P PORT -D 0 PORT   port it disabled ("on": enable
                           disable`` (the local port by direct route): its       only while disabled); one
                           PhysLinkState Disabled, LinkState Down, ``ibstat``    already Disabled is left so
                           ``Down`` / ``Disabled``, the fabric's ``ibping``
                           from other hosts unanswered. Refused, nothing
                           touched, on a node with no InfiniBand port (RoCE
                           ports are Ethernet: no subnet management packets)
                           and where ``ansible_host`` is on the IPoIB netdev of
                           a port it would disable (the undo could not reach
                           the host)
=================  ======  ====================================================  ================================

``gpu_lost`` runs the host's device tool (``clusterctl-drill-device``, :mod:`operate.drill_devices`: the virtual
cluster's machines carry it; a real host has none and fails the step, nothing changed). ``ib_port_down`` runs
infiniband-diags' ``ibportstate`` on real hosts and machines alike (decision 0044); without root (no
``ansible_become``) it fails on its first query with its own reason, nothing changed.

The unit of IU ``N`` is ``vllm-iu@N.service`` and its model directory is ``VLLM_MODEL_PATH`` of
``/etc/vllm-iu/N.env`` (roles/inference_unit). Commands run as the inventory's connection user, under
``sudo -n`` when the host has ``ansible_become`` (as the provisioning playbooks become root; a sudo that wants a
password fails the step with sudo's own line instead of waiting for one).

An undo is recorded before the change it reverses is made, so a step that fails half way (or a Ctrl-C in the
middle of it) still restores what it may have changed. :meth:`FaultStep.undo` runs every recorded undo, newest
first, carries on past one that fails, and returns one line per undo saying what was restored or why not.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from cluster.model import IU, Node
from common.errors import ClusterctlError, ExitCode
from operate.drill_devices import (
    PORT_DISABLED,
    XID_FALLEN_OFF_THE_BUS,
    device_command,
    port_command,
    port_failure,
    port_states,
)

COMMAND_TIMEOUT_S = 60.0  # systemctl restart waits for the unit's ExecStop; vLLM's stop takes seconds
UNIT_TEMPLATE = "vllm-iu@{index}.service"
ENV_FILE_TEMPLATE = "/etc/vllm-iu/{index}.env"  # inference_unit_env_dir (roles/inference_unit/defaults)
CONSUL_UNIT = "consul.service"
AGENT_UNIT = "eas-agent.service"  # roles/eas_agent
EDGE_UNIT = "eas-edge.service"
BALANCER_UNIT = "haproxy.service"  # roles/edge_balancer
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
ASIDE_SUFFIX = ".drill-aside"


class FaultError(ClusterctlError):
    """A fault could not be injected (the target did not answer, the unit is not running): exit 1."""

    def __init__(self, message: str):
        super().__init__(message, ExitCode.FAILED)


@dataclass(frozen=True)
class Target:
    """What a drill faults: one IU (``iu`` set) or one whole node."""

    node: Node
    iu: IU | None = None
    become: bool = False  # the host's ansible_become: every command through sudo -n

    @property
    def label(self) -> str:
        return self.iu.id if self.iu is not None else self.node.name

    @property
    def unit(self) -> str:
        if self.iu is None:
            raise FaultError(f"{self.node.name}: a unit fault needs an IU as its target, not a node")
        return UNIT_TEMPLATE.format(index=self.iu.index)

    @property
    def iu_ids(self) -> tuple[str, ...]:
        """The IUs a client can see fail: the one IU, or every IU of the node."""
        return (self.iu.id,) if self.iu is not None else tuple(iu.id for iu in self.node.ius)


class HostStepError(ClusterctlError):
    """A command on the target host failed, timed out or found the host unreachable: exit 1."""

    def __init__(self, message: str):
        super().__init__(message, ExitCode.FAILED)


def host_command(target: Target, argv: Sequence[str]) -> list[str]:
    """``argv`` as run on the target: through ``sudo -n`` when the host becomes root."""
    return ["sudo", "-n", "--", *argv] if target.become else list(argv)


def run_on(target: Target, transport, argv: Sequence[str], *, check: bool = True,
           timeout_s: float = COMMAND_TIMEOUT_S):
    """Run ``argv`` on the target's host; with ``check`` a HostStepError naming the host, the command and how
    it ended (unreachable, timed out, its exit and last line) unless it succeeded."""
    result = transport.run(target.node, host_command(target, argv), timeout_s)
    if check and not result.ok:
        raise HostStepError(failure(target, argv, result))
    return result


def failure(target: Target, argv: Sequence[str], result) -> str:
    """How ``argv`` failed on the target: the host, the command, unreachable / timed out / its exit, last line."""
    why = "unreachable" if result.unreachable else "timed out" if result.timed_out else result.ended()
    detail = result.last_line()
    return f"{target.node.name}: `{shlex.join(argv)}` {why}" + (f": {detail}" if detail else "")


@dataclass(frozen=True)
class Undo:
    description: str
    commands: tuple[tuple[str, ...], ...]


@dataclass
class FaultStep:
    """One fault on one target; :meth:`inject` changes the host, :meth:`undo` puts it back."""

    kind: str
    target: Target
    transport: object  # preflight.transport.Transport: run(host, argv, timeout) -> CommandResult
    undos: list[Undo] = field(default_factory=list)
    done: list[str] = field(default_factory=list)  # what inject did, in order

    def command(self, argv) -> list[str]:
        return host_command(self.target, argv)

    def run(self, *argv: str, check: bool = True):
        try:
            return run_on(self.target, self.transport, argv, check=check)
        except HostStepError as exc:
            raise FaultError(str(exc)) from None

    def record(self, description: str, *commands: Sequence[str]) -> None:
        self.undos.append(Undo(description, tuple(tuple(c) for c in commands)))

    def inject(self) -> None:
        INJECTORS[self.kind](self)

    def undo(self) -> list[str]:
        """Run every recorded undo, newest first; one line per undo (restored, or why not)."""
        lines = []
        while self.undos:
            undo = self.undos.pop()
            failed = None
            for argv in undo.commands:
                result = self.transport.run(self.target.node, self.command(argv), COMMAND_TIMEOUT_S)
                if not result.ok:
                    failed = f"`{shlex.join(argv)}` {result.ended()}: {result.last_line() or 'no output'}"
                    break
            lines.append(f"{self.target.label}: {undo.description}" if failed is None
                         else f"{self.target.label}: NOT restored ({undo.description}): {failed}")
        return lines


def main_pid(step: FaultStep) -> int:
    """The unit's main PID as systemd reports it; a FaultError when the unit is not running."""
    out = step.run("systemctl", "show", "--property", "MainPID", "--value", step.target.unit).stdout.strip()
    if not out.isdigit() or int(out) == 0:
        raise FaultError(f"{step.target.label}: {step.target.unit} is not running (MainPID {out or 'empty'}): "
                         f"nothing to fault")
    return int(out)


def engine_stall(step: FaultStep) -> None:
    pid = main_pid(step)
    step.record(f"SIGCONT to PID {pid}", ["kill", "-CONT", str(pid)])
    step.run("kill", "-STOP", str(pid))
    step.done.append(f"SIGSTOP to {step.target.unit} MainPID {pid}")


def start_commands(unit: str, verb: str = "start") -> list[tuple[str, ...]]:
    """Start (or restart) a unit past its start limit: the vLLM unit allows StartLimitBurst starts an hour
    (roles/inference_unit), and a drill's own restarts (a unit that exits at start is restarted every
    RestartSec) must not leave it refused. ``reset-failed`` resets the start rate limit counter (systemctl(1))."""
    return [("systemctl", "reset-failed", unit), ("systemctl", verb, unit)]


def _signal_engine(step: FaultStep, signal: str, undo_note: str = "") -> None:
    """``kill -<signal>`` the unit's MainPID; the undo starts the unit (``undo_note``: what that start means)."""
    unit = step.target.unit
    pid = main_pid(step)
    step.record(f"{unit} started{undo_note}", *start_commands(unit))
    step.run("kill", f"-{signal}", str(pid))
    step.done.append(f"SIG{signal} to {unit} MainPID {pid}")


def engine_crash(step: FaultStep) -> None:
    _signal_engine(step, "KILL", " (a no-op when systemd restarted it)")


def graceful_stop(step: FaultStep) -> None:
    _signal_engine(step, "TERM")


def model_path(step: FaultStep) -> str:
    """``VLLM_MODEL_PATH`` from the unit's environment file."""
    env_file = ENV_FILE_TEMPLATE.format(index=step.target.iu.index)
    text = step.run("cat", env_file).stdout
    for line in text.splitlines():
        key, _, value = line.strip().partition("=")
        if key == "VLLM_MODEL_PATH" and value.strip():
            words = shlex.split(value)
            if words:
                return words[0]
    raise FaultError(f"{step.target.node.name}: {env_file} sets no VLLM_MODEL_PATH")


def weights_missing(step: FaultStep) -> None:
    unit, path = step.target.unit, model_path(step)
    aside = path.rstrip("/") + ASIDE_SUFFIX
    names = []
    for pattern in WEIGHT_PATTERNS:
        found = step.run("find", path, "-maxdepth", "1", "-type", "f", "-name", pattern).stdout.split()
        names += found
    if not names:
        raise FaultError(f"{step.target.label}: {path} holds no weight files ({', '.join(WEIGHT_PATTERNS)})")
    step.record(f"{unit} restarted with its weights", *start_commands(unit, "restart"))
    step.record(f"{len(names)} weight files moved back to {path}",
                ["find", aside, "-maxdepth", "1", "-type", "f", "-exec", "mv", "-t", path, "{}", "+"],
                ["rmdir", aside])
    step.run("mkdir", "-p", aside)
    step.run("mv", "-t", aside, *names)
    step.done.append(f"{len(names)} weight files of {path} moved to {aside}")
    for argv in start_commands(unit, "restart"):
        step.run(*argv, check=False)  # vLLM exiting at start is the point
    step.done.append(f"{unit} restarted without its weights")


def consul_agent_down(step: FaultStep) -> None:
    step.record(f"{CONSUL_UNIT} started", ["systemctl", "start", CONSUL_UNIT])
    step.run("systemctl", "stop", CONSUL_UNIT)
    step.done.append(f"{CONSUL_UNIT} stopped on {step.target.node.name}")


# systemd's answer to `systemctl freeze` when the cgroup freezer is not available to it (src/core/unit.c: the
# freezer needs the unified cgroup hierarchy; a cgroup v1 or hybrid host, as systemd 252 in a hybrid container).
NO_FREEZER = "does not support freezing"


def _freeze(step: FaultStep, unit: str) -> None:
    """``unit``'s processes suspended: by the cgroup freezer, else (no freezer on this host) by SIGSTOP to each
    of them, which no process can catch or ignore either."""
    step.record(f"{unit} thawed", ["systemctl", "thaw", unit])
    frozen = step.run("systemctl", "freeze", unit, check=False)
    if frozen.ok:
        step.done.append(f"{unit} frozen")
        return
    if NO_FREEZER not in frozen.stderr + frozen.stdout:
        raise FaultError(failure(step.target, ["systemctl", "freeze", unit], frozen))
    step.undos.pop()  # systemd refused before it changed anything: nothing to thaw
    step.record(f"{unit} continued (SIGCONT to every process)", ["systemctl", "kill", "--signal=SIGCONT", unit])
    step.run("systemctl", "kill", "--signal=SIGSTOP", unit)
    step.done.append(f"{unit} stopped (SIGSTOP to every process: no cgroup freezer on {step.target.node.name})")


def node_hang(step: FaultStep) -> None:
    """Every serving process of the node suspended: its engines first (a unit that is not running is a fault
    that cannot be injected: nothing would hang), then the edge and the balancer, the agent and the Consul agent
    where they run (a node without them still hangs; it is said which were left). An edge or a balancer left
    answering on a hung machine would hide what its clients see when the machine really hangs: the balancer's
    checks time out instead of being refused. A Consul agent that is a server is frozen too: one server of three
    down keeps the quorum, as a hung machine would."""
    node = step.target.node
    for iu in node.ius:
        unit = UNIT_TEMPLATE.format(index=iu.index)
        out = step.run("systemctl", "show", "--property", "MainPID", "--value", unit).stdout.strip()
        if not out.isdigit() or int(out) == 0:
            raise FaultError(f"{iu.id}: {unit} is not running (MainPID {out or 'empty'}): a hang of {node.name} "
                             f"would leave it as it is")
        _freeze(step, unit)
    for unit in (EDGE_UNIT, BALANCER_UNIT, AGENT_UNIT, CONSUL_UNIT):
        if step.run("systemctl", "is-active", unit, check=False).stdout.strip() == "active":
            _freeze(step, unit)
        else:
            step.done.append(f"{unit} not running on {node.name}: nothing to freeze")


def edge_restart(step: FaultStep) -> None:
    node = step.target.node.name
    if step.run("systemctl", "is-active", EDGE_UNIT, check=False).stdout.strip() != "active":
        raise FaultError(f"{node}: {EDGE_UNIT} is not running: no edge to restart there")
    step.record(f"{EDGE_UNIT} started (a no-op once its restart finished)", ["systemctl", "start", EDGE_UNIT])
    # --no-block: the fault takes effect when systemd sends the SIGTERM, not when the drain and start are over
    step.run("systemctl", "restart", "--no-block", EDGE_UNIT)
    step.done.append(f"{EDGE_UNIT} restarting on {node} (SIGTERM: the edge drains, then starts again)")


def _device_state(step: FaultStep, *argv) -> object:
    out = step.run(*device_command(*argv)).stdout
    try:
        return json.loads(out)
    except ValueError:
        raise FaultError(f"{step.target.node.name}: `{argv[0]}` answered {out.strip()[:80]!r}, not JSON") from None


def gpu_lost(step: FaultStep) -> None:
    iu = step.target.iu
    if iu is None or not iu.gpus:
        raise FaultError(f"{step.target.label}: gpu_lost needs a unit with GPUs")
    gpu = iu.gpus[0]
    before = _device_state(step, "gpu-state", gpu)
    step.record(f"GPU {gpu} back on the bus (NVML answers it, its XID {XID_FALLEN_OFF_THE_BUS} lines gone)",
                device_command("gpu-restore", gpu, before))
    step.run(*device_command("gpu-lost", gpu, XID_FALLEN_OFF_THE_BUS))
    step.done.append(f"GPU {gpu} of {step.target.unit} off the bus: XID {XID_FALLEN_OFF_THE_BUS} in the kernel log "
                     f"and NVML's events, NVML answers GPU is lost")


def ib_port_down(step: FaultStep) -> None:
    node = step.target.node
    ports = [nic for nic in node.nics if nic.link_layer == "infiniband"]
    if not ports:
        raise FaultError(f"{node.name}: no InfiniBand port in rdma_nics (RoCE ports are Ethernet: ibportstate's "
                         f"subnet management packets cannot disable them): nothing to take down")
    for nic in ports:
        if nic.netdev and f" {node.address}/" in step.run("ip", "-o", "addr", "show", "dev", nic.netdev,
                                                          check=False).stdout:
            raise FaultError(f"{node.name}: ansible_host {node.address} is on {nic.netdev}, the IPoIB netdev of "
                             f"{nic.device}: disabling its port would cut the drill off the host it must restore")
    states = {nic: _port(step, nic, "query") for nic in ports}
    taken = []
    for nic, (link, phys) in states.items():
        name = f"{nic.device} port {nic.port}"
        if phys == PORT_DISABLED:
            step.done.append(f"{node.name}: {name} already Disabled: left as it is")
            continue
        # "on" enables a port only while it is disabled (ibportstate(8)): an undo of a disable that never
        # happened leaves a live link alone instead of sending it back to Polling
        step.record(f"{name} enabled (was {link}/{phys})", port_command(nic.device, nic.port, "on"))
        _port(step, nic, "disable")
        taken.append(name)
    if taken:
        step.done.append(f"{node.name}: {', '.join(taken)} disabled (ibportstate: PhysLinkState Disabled)")


def _port(step: FaultStep, nic, op: str) -> tuple[str, str]:
    """Run ibportstate ``op`` on ``nic``'s port: its (LinkState, PhysLinkState) before the operation, or a
    FaultError with ibportstate's own reason."""
    argv = port_command(nic.device, nic.port, op)
    result = step.transport.run(step.target.node, step.command(argv), COMMAND_TIMEOUT_S)
    states = port_states(result.stdout) if result.ok else None
    if states is None:
        why = port_failure(result) if not result.ok else f"no LinkState in its answer: {result.last_line()!r}"
        raise FaultError(f"{step.target.node.name}: `{shlex.join(argv)}` "
                         f"{'unreachable' if result.unreachable else result.ended()}: {why}")
    return states


INJECTORS = {"engine_stall": engine_stall, "engine_crash": engine_crash, "graceful_stop": graceful_stop,
             "weights_missing": weights_missing, "consul_agent_down": consul_agent_down, "node_hang": node_hang,
             "edge_restart": edge_restart, "gpu_lost": gpu_lost, "ib_port_down": ib_port_down}
SCOPE = {"engine_stall": "unit", "engine_crash": "unit", "graceful_stop": "unit", "weights_missing": "unit",
         "gpu_lost": "unit", "consul_agent_down": "node", "node_hang": "node", "ib_port_down": "node",
         "edge_restart": "edge"}
KINDS = tuple(INJECTORS)
