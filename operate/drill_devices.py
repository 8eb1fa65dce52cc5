"""The host tools the fault kinds ``gpu_lost`` and ``ib_port_down`` (:mod:`operate.drill_faults`) run on the
target host, through the drill's transport like every other fault step.

``gpu_lost``: ``clusterctl-drill-device OPERATION [JSON ARGUMENT...]``

==================================  ==========================================================================
operation                           what the tool does on the host
==================================  ==========================================================================
``gpu-state GPU``                   prints the GPU's state as a JSON value that ``gpu-restore`` takes back
``gpu-lost GPU XID``                the GPU off the bus: NVML answers ``GPU is lost`` for it, the driver logs
                                    the XID (kernel log, NVML's XID events), ``nvidia-smi`` cannot get its handle
``gpu-restore GPU STATE``           the GPU as ``gpu-state`` printed it
==================================  ==========================================================================

The virtual cluster's machines carry it as one of their stub tools (sim/hosts/stubs/drill_device.py: it
changes what their NVML, ``nvidia-smi`` and kernel log stand-ins read). A host with real GPUs has no such tool:
the step fails there (``command not found``), nothing changed. Software cannot take a real GPU off the bus or
write an XID into its driver's event queue short of removing the PCI device; decision 0033 says what a real
host's tool would need.

``ib_port_down``: ``ibportstate -C CA -P PORT -D 0 PORT query|disable|on`` (infiniband-diags, rdma-core), on
real hosts and the virtual cluster's machines alike (their stand-in: sim/hosts/stubs/ibportstate.py). ibportstate(8):
"InfiniBand HCA port state may be changed locally without the knowledge of the Subnet Manager"; ``-D 0`` is the
direct route to the local port, so the subnet management packet that enables the port again never crosses the
link it disabled. Decision 0044 says why this is safe enough to run and what the drill refuses.
"""

from __future__ import annotations

import json

DEVICE_TOOL = "clusterctl-drill-device"
XID_FALLEN_OFF_THE_BUS = 79  # NVIDIA Xid catalog: ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS
PORT_TOOL = "ibportstate"
PORT_DISABLED = "Disabled"  # PortInfo PhysLinkState of a disabled port (IBA PortPhysicalState 3)


def device_command(op: str, *args) -> list[str]:
    """The host command for ``op``, each argument as JSON."""
    return [DEVICE_TOOL, op, *(json.dumps(a) for a in args)]


def port_command(device: str, port: int, op: str) -> list[str]:
    """``ibportstate`` on the local HCA ``device``'s ``port`` (direct route 0): ``query``, ``disable``, ``on``."""
    return [PORT_TOOL, "-C", device, "-P", str(port), "-D", "0", str(port), op]


def port_states(text: str) -> tuple[str, str] | None:
    """(LinkState, PhysLinkState) from ibportstate's PortInfo block (the first, for a set: the initial one)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, rest = line.partition(":")
        if sep and name in ("LinkState", "PhysLinkState") and name not in fields:
            fields[name] = rest.lstrip(".").strip()
    if "LinkState" not in fields or "PhysLinkState" not in fields:
        return None
    return fields["LinkState"], fields["PhysLinkState"]


def port_failure(result) -> str:
    """ibportstate's own reason on one line: the ``Can't open ... UMAD port (why) (CA:PORT)`` warning when there
    is one (its ``iberror`` line only says it failed), else its last line."""
    for line in f"{result.stderr}\n{result.stdout}".splitlines():
        if "Can't open" in line and "UMAD port" in line:
            return line.split(": ", 2)[-1].strip()
    return result.last_line() or result.ended()
