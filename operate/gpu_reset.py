"""The ``gpu_reset`` rung of ``clusterctl remediate``: which GPUs ``nvidia-smi --gpu-reset`` must take in one
command, what must let go of them first, and the host steps in order.

The scope follows nvidia-smi(1) (``-r, --gpu-reset``; https://docs.nvidia.com/deploy/nvidia-smi/index.html):

- "There can't be any applications using these devices (e.g. CUDA application, graphics application like X
  server, monitoring application like other instance of nvidia-smi). There also can't be any compute
  applications running on any other GPU in the system if individual GPU reset is not feasible."
- NVSwitch systems: an Ampere or newer GPU "can be reset individually" while Fabric Manager runs; with Fabric
  Manager not running (and for any GPU before Ampere) "All PEER connected GPUs must be reset in same command"
  and the command refuses an ``-i`` that leaves one out. On an HGX baseboard every GPU is an NVLink peer of
  every other through the NVSwitches (Fabric Manager user guide, "GPU Baseboard Topologies";
  https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html), so that is the whole board:
  every GPU of the node, which means every unit of the node stopped.
- The man page also says Hopper "removed" the dependency on Fabric Manager while its table still asks for the
  peers with Fabric Manager down; the board is what satisfies both readings, so a board without a running
  Fabric Manager is reset whole, whatever its generation.

What holds a GPU besides the units: persistence mode (``nvidia-persistenced``, started by roles/nvidia_stack)
makes the reset fail "In use by another client" until ``nvidia-smi -pm 0`` (NVIDIA/NVSentinel#1690, #1692;
NVIDIA/gpu-operator#118), and any NVML or DCGM client (the node's ``eas-agent`` reads NVML; DCGM's host
engine, IBM/CAST#551). Those services are stopped for the reset and started again after it, whatever its
outcome; persistence mode is put back on the GPUs that had it.

A reset ``nvidia-smi`` refuses (a non-zero exit of its own) is not a host that fails to do what it is told: it
is NVIDIA's answer that a reset cannot clear this GPU now, and the next rung (the reboot) can. A command that
cannot run at all (the host unreachable, the program missing, sudo refusing a unit stop) stops the ladder.

**The fabric after a reset.** On an NVSwitch board a reset GPU is not usable for CUDA (``cudaErrorSystemNotReady``)
until Fabric Manager has registered it with the fabric again: ``nvidia-smi -q`` shows each GPU's ``Fabric``
``State`` going ``Not Started`` -> ``In Progress`` -> ``Completed`` and, once Completed, its ``Status``
(``Success`` or the error; NVML's ``nvmlDeviceGetGpuFabricInfoV``: "must be checked only if state returns
complete"). The units are started only when every reset GPU reads Completed + Success, polled for at most
``fabric_wait_s``; a GPU without a fabric (``N/A``: PCIe, no NVSwitch) is not waited for. A fabric that ends in
an error status or does not complete in time is, like a refusal, the reset not clearing the fault: the units stay
stopped and the next rung (the reboot) runs, the failure naming each GPU with its state and status.

**The fabric reset** (:func:`fabric_scope`, a fatal NVSwitch SXID): every unit of the node stopped, Fabric
Manager restarted, the whole board reset (no ``-i``), the fabric waited for as above, the units started. The
Fabric Manager user guide ("Bare Metal Mode", "Runtime NVSwitch and GPU Errors"): a fatal SXID stops NVLink
traffic through the switch port, the CUDA jobs of the GPUs behind it are aborted, and the fabric is usable again
only after the GPUs and NVSwitches are reset and Fabric Manager brought back; NVIDIA/nccl#1488 (a maintainer):
after Fabric Manager is stopped and started the GPUs must be reset before NVLink works again, which is why the
reset comes after the restart.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from cluster.model import IU, Node
from operate.drill_faults import AGENT_UNIT, UNIT_TEMPLATE, HostStepError, start_commands

FABRIC_MANAGER_UNIT = "nvidia-fabricmanager.service"
DCGM_UNIT = "nvidia-dcgm.service"  # DCGM's host engine (roles/nvidia_stack)
GPU_CLIENT_UNITS = (AGENT_UNIT, DCGM_UNIT)  # hold NVML handles on every GPU of the node while they run
# Inventory GPU model -> NVIDIA architecture; every supported model is an SXM board on NVSwitches
# (roles/nvidia_stack's nvidia_stack_nvswitch: gpu_model ending -sxm).
ARCHITECTURE = {"a100-sxm": "Ampere", "h100-sxm": "Hopper", "h200-sxm": "Hopper"}
INDIVIDUAL_RESET_ARCHITECTURES = ("Ampere", "Hopper", "Blackwell")
CANNOT_RUN = (126, 127)  # the shell's "not executable" / "not found": nothing was asked of the driver
# Fabric Manager trains an HGX board's NVLinks and registers its GPUs in seconds to tens of seconds after a reset
# or its own start; three minutes is far past that and still well inside the ladder's five-minute target
FABRIC_WAIT_S = 180.0
FABRIC_POLL_S = 0.5
FABRIC_READY = ("Completed", "Success")
NO_FABRIC = "N/A"  # nvidia-smi -q's Fabric State of a GPU that is not on an NVSwitch fabric


@dataclass(frozen=True)
class ResetScope:
    """The GPUs one ``nvidia-smi --gpu-reset`` takes and the units that must be stopped for it."""

    board: bool  # every GPU of the node (no -i)
    gpus: tuple[int, ...]
    ius: tuple[IU, ...]
    why: str

    def argv(self) -> tuple[str, ...]:
        # without -i nvidia-smi resets every GPU of the system (nvidia-smi(1))
        return ("nvidia-smi", "--gpu-reset") if self.board else ("nvidia-smi", "--gpu-reset", "-i", self.ids)

    @property
    def ids(self) -> str:
        return ",".join(str(g) for g in self.gpus)


def nvswitch_board(gpu_model: str) -> bool:
    return gpu_model.endswith("-sxm")


def reset_scope(node: Node, iu: IU, fabric_manager_active: bool) -> ResetScope:
    """The smallest scope nvidia-smi(1) allows for resetting ``iu``'s GPUs on ``node``."""
    arch = ARCHITECTURE.get(node.gpu_model)
    board = tuple(sorted(g for unit in node.ius for g in unit.gpus))
    if not nvswitch_board(node.gpu_model):
        if arch in INDIVIDUAL_RESET_ARCHITECTURES:
            return ResetScope(False, tuple(iu.gpus), (iu,), f"{node.gpu_model} ({arch}) without NVSwitches: "
                                                          f"each GPU can be reset individually")
        return ResetScope(True, board, tuple(node.ius), f"{node.gpu_model}: NVLink peers are reset together")
    if arch not in INDIVIDUAL_RESET_ARCHITECTURES:
        return ResetScope(True, board, tuple(node.ius), f"{node.gpu_model} ({arch or 'architecture unknown'}) on "
                                                        f"NVSwitches: every NVLink peer is reset in the same command")
    if not fabric_manager_active:
        return ResetScope(True, board, tuple(node.ius), f"{FABRIC_MANAGER_UNIT} not active on {node.name}: on an "
                                                        f"NVSwitch board every NVLink peer (all {len(board)} GPUs) "
                                                        f"is reset in the same command")
    return ResetScope(False, tuple(iu.gpus), (iu,), f"{node.gpu_model} ({arch}) with Fabric Manager active: each "
                                                    f"GPU can be reset individually")


def fabric_scope(node: Node, sxid: str) -> ResetScope:
    """The fabric reset's scope: the whole board, every unit of the node (a fatal SXID stops the fabric all of
    the board's GPUs share)."""
    board = tuple(sorted(g for unit in node.ius for g in unit.gpus))
    return ResetScope(True, board, tuple(node.ius), f"{sxid}: {FABRIC_MANAGER_UNIT} restarted and every GPU of the "
                                                    f"NVSwitch board (all {len(board)}) reset")


def fabric_states(text: str) -> dict[str, tuple[str, str]]:
    """PCI bus id -> (State, Status) of each GPU's ``Fabric`` section in ``nvidia-smi -q`` output (``""`` for a
    line the section lacks); a GPU whose block has no such section (a driver before the fabric was reported) is
    left out."""
    states: dict[str, list[str]] = {}
    bus, inside = None, False
    for line in text.splitlines():
        indent, stripped = len(line) - len(line.lstrip()), line.strip()
        if indent == 0 and stripped.startswith("GPU "):
            bus, inside = stripped[4:].strip(), False
        elif bus is not None and indent == 4:
            inside = stripped == "Fabric"
            if inside:  # a section without its State (output cut short) is a fabric not known ready
                states.setdefault(bus, ["", ""])
        elif inside and indent == 8 and ":" in stripped:
            key, _, value = stripped.partition(":")
            if key.strip() in ("State", "Status"):
                states.setdefault(bus, ["", ""])[0 if key.strip() == "State" else 1] = value.strip()
    return {b: (v[0], v[1]) for b, v in states.items()}


def refusal(result) -> str:
    """nvidia-smi's own reason for a refused reset, on one line (its message spans several)."""
    lines = [line.strip() for line in f"{result.stdout}\n{result.stderr}".splitlines() if line.strip()]
    return " ".join(lines)[:600] or result.ended()


def refused(result) -> bool:
    """nvidia-smi ran and said no (its own exit), as opposed to a command that could not be run at all."""
    return (result.rc is not None and result.rc != 0 and result.rc not in CANNOT_RUN and not result.unreachable
            and not result.timed_out and not result.truncated)


@dataclass
class ResetRun:
    """What the reset step did: ``ok`` the GPUs were reset, their fabric ready and the units started; else
    ``detail`` says why the reset was refused or the fabric not ready (``fabric`` set; the units stay stopped:
    the next rung reboots the node)."""

    scope: ResetScope | None = None
    did: list[str] = field(default_factory=list)
    ok: bool = False
    detail: str = ""
    fabric: bool = False  # the reset ran but the fabric did not come back: detail names each GPU's state


GPU_QUERY = "--query-gpu=index,pci.bus_id,persistence_mode"


def gpu_rows(text: str) -> list[tuple[int, str, bool]]:
    """(index, PCI bus id, persistence mode Enabled) of each GPU in ``GPU_QUERY``'s CSV (noheader)."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 3 and cells[0].isdigit():
            rows.append((int(cells[0]), cells[1], cells[2] == "Enabled"))
    return rows


@dataclass
class GpuReset:
    """The host steps of the rung on ``node`` for ``iu``. ``run(argv, check)`` runs one command on the node and
    returns its CommandResult; with ``check`` a failure raises HostStepError (the ladder stops)."""

    node: Node
    iu: IU
    run: Callable[[Sequence[str], bool], object]
    result: ResetRun = field(default_factory=ResetRun)
    fabric_wait_s: float = FABRIC_WAIT_S
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def _do(self, argv: Sequence[str], check: bool = True):
        outcome = self.run(argv, check)
        self.result.did.append(shlex.join(argv) + ("" if outcome.ok else f" ({outcome.ended()})"))
        return outcome

    def scope(self) -> ResetScope:
        active = self.run(("systemctl", "is-active", FABRIC_MANAGER_UNIT), False)
        return reset_scope(self.node, self.iu, active.ok and active.stdout.strip() == "active")

    def carry_out(self, scope: ResetScope, restart_fabric_manager: bool = False) -> ResetRun:
        """Stop, reset, put back, wait for the fabric, start; with ``restart_fabric_manager`` Fabric Manager is
        restarted right before the reset (the fabric reset)."""
        self.result.scope = scope
        for unit in scope.ius:
            self._do(("systemctl", "stop", UNIT_TEMPLATE.format(index=unit.index)))
        clients, pm_off = [], []
        try:
            for unit in GPU_CLIENT_UNITS:
                state = self.run(("systemctl", "is-active", unit), False)
                if state.ok and state.stdout.strip() == "active":
                    clients.append(unit)
                    self._do(("systemctl", "stop", unit))
            listed = self._do(("nvidia-smi", GPU_QUERY, "--format=csv,noheader", "-i", scope.ids))
            rows = [r for r in gpu_rows(listed.stdout) if r[0] in scope.gpus]
            pm_off = [index for index, _, enabled in rows if enabled]
            if pm_off:
                self._do(("nvidia-smi", "-pm", "0", "-i", ",".join(map(str, pm_off))))
            if restart_fabric_manager:
                self._do(("systemctl", "restart", FABRIC_MANAGER_UNIT))
            reset = self._do(scope.argv(), check=False)
            if not reset.ok and not refused(reset):
                raise HostStepError(f"{self.node.name}: `{shlex.join(scope.argv())}` "
                                    f"{'unreachable' if reset.unreachable else reset.ended()}: {refusal(reset)}")
            self.result.ok, self.result.detail = reset.ok, "" if reset.ok else refusal(reset)
        finally:
            # what the reset needed off is put back whatever came of it: the node's other units and its
            # monitoring depend on them
            if pm_off:
                self._do(("nvidia-smi", "-pm", "1", "-i", ",".join(map(str, pm_off))), check=False)
            for unit in clients:
                self._do(("systemctl", "start", unit), check=False)
        if self.result.ok and not self.wait_for_fabric(scope, {bus: index for index, bus, _ in rows}):
            self.result.ok, self.result.fabric = False, True
        if self.result.ok:
            for unit in scope.ius:
                for argv in start_commands(UNIT_TEMPLATE.format(index=unit.index)):
                    self._do(argv)
        return self.result

    def wait_for_fabric(self, scope: ResetScope, index_of: dict[str, int]) -> bool:
        """True once every GPU of ``scope`` reads Completed + Success (or has no fabric); else False with
        ``detail`` naming each GPU that does not, its state and its status (an error status ends the wait at once:
        Completed is final)."""
        argv = ("nvidia-smi", "-q", "-i", scope.ids)
        deadline, polls = self.clock() + self.fabric_wait_s, 0
        while True:
            polls += 1
            states = fabric_states(self.run(argv, True).stdout)
            pending, failed = [], []
            for bus, (state, status) in sorted(states.items(), key=lambda item: index_of.get(item[0], -1)):
                if state == NO_FABRIC or (state, status) == FABRIC_READY:
                    continue
                name = f"GPU {index_of[bus]} ({bus})" if bus in index_of else f"GPU {bus}"
                (failed if state == FABRIC_READY[0] else pending).append(f"{name} fabric state {state or '-'}, "
                                                                         f"status {status or '-'}")
            if not pending and not failed:
                waited = [s for s in states.values() if s[0] != NO_FABRIC]
                self.result.did.append(f"{shlex.join(argv)}: " + (f"fabric Completed/Success on {len(waited)} GPU(s) "
                                                                  f"after {polls} poll(s)" if waited
                                                                  else "no GPU on an NVSwitch fabric: nothing to wait for"))
                return True
            if failed or self.clock() >= deadline:
                self.result.did.append(f"{shlex.join(argv)}: fabric not ready after {polls} poll(s)")
                self.result.detail = (f"{self.node.name}: the fabric did not come back after the reset"
                                      + ("" if failed else f" within {self.fabric_wait_s:g} s") + ": "
                                      + "; ".join(failed + pending))
                return False
            self.sleep(FABRIC_POLL_S)
