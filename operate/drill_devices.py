"""The host tool the fault kinds ``gpu_lost`` and ``ib_port_down`` (:mod:`operate.drill_faults`) run on the
target host, through the drill's transport like every other fault step: ``clusterctl-drill-device OPERATION
[JSON ARGUMENT...]``.

==================================  ==========================================================================
operation                           what the tool does on the host
==================================  ==========================================================================
``gpu-state GPU``                   prints the GPU's state as a JSON value that ``gpu-restore`` takes back
``gpu-lost GPU XID``                the GPU off the bus: NVML answers ``GPU is lost`` for it, the driver logs
                                    the XID (kernel log, NVML's XID events), ``nvidia-smi`` cannot get its handle
``gpu-restore GPU STATE``           the GPU as ``gpu-state`` printed it
``hca-state``                       prints ``{device: [State, Physical state]}`` of the node's HCA ports
``hca-set {device: [S, P], ...}``   sets them (``["Down", "Disabled"]``: the link disabled)
==================================  ==========================================================================

The virtual cluster's machines carry it as one of their stub tools (sim/hosts/stubs/drill_device.py: it
changes what their NVML, ``nvidia-smi``, kernel log and ``ibstat`` stand-ins read). A host with real GPUs has
no such tool: the step fails there (``command not found``), nothing changed. Software cannot take a real GPU
off the bus or write an XID into its driver's event queue short of removing the PCI device, and disabling a real
port cuts the host off its subnet manager; decision 0033 says what a real host's tool would need.
"""

from __future__ import annotations

import json

DEVICE_TOOL = "clusterctl-drill-device"
XID_FALLEN_OFF_THE_BUS = 79  # NVIDIA Xid catalog: ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS
PORT_DOWN = ("Down", "Disabled")  # ibstat's State and Physical state of a port whose link is disabled


def device_command(op: str, *args) -> list[str]:
    """The host command for ``op``, each argument as JSON."""
    return [DEVICE_TOOL, op, *(json.dumps(a) for a in args)]
