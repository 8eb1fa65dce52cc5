"""``nvidia-smi -r/--gpu-reset [-i IDS]`` and ``-pm 0|1 [-i IDS]`` of a simulated HGX board.

=====================================  ================================================  ============================
case                                   what it prints, exit                              source
=====================================  ================================================  ============================
reset, every GPU free                  ``GPU 00000000:18:00.0 was successfully reset.``  NVIDIA/NVSentinel#1692,
                                       per GPU, exit 0; the GPU's volatile ECC count     NVIDIA/gpu-operator#118
                                       cleared, a pending row remap and pending page     (output); nvidia-smi(1) and
                                       retirement applied                                NVIDIA's A100 memory error
                                                                                         management (effects)
reset of a GPU in use: a live process  ``The following GPUs could not be reset:`` /      NVIDIA/NVSentinel#1690 (text
holds it (a CUDA process of its        ``  GPU <bus>: In use by another client`` /       and exit=255), NVIDIA/gpu-
``CUDA_VISIBLE_DEVICES``:              blank / ``N device(s) is currently being used by  operator#118 and #1690
:mod:`sim.hosts.gpu_clients`), or its  one or more other processes (e.g., Fabric         (persistence mode holds the
persistence mode is Enabled            Manager, ...). Please first kill all processes    GPU), ComputeCanada/puppet-
                                       using this device and all compute applications    magic_castle#387 (same text)
                                       running in the system.``, exit 255; nothing reset
reset of some GPUs of an NVSwitch      one line naming the NVLink peers left out, exit   nvidia-smi(1): "If the -i
board where individual reset is not    255; nothing reset                                option does not specify a
feasible (Fabric Manager not running,                                                    complete set of NVLink GPUs
or a GPU before Ampere)                                                                  to reset, this command will
                                                                                         issue an error identifying
                                                                                         the additional GPUs"; the
                                                                                         wording and the exit code are
                                                                                         this stand-in's (not captured
                                                                                         from a host)
reset of a GPU that cannot be reset    ``Unable to reset GPU <bus>: Not Supported``,     nvidia-smi(1) RETURN VALUE 3
(``reset_supported: false``)           exit 3                                            "not available on target
                                                                                         device"; the line follows
                                                                                         nvidia-smi's "Unable to ...:
                                                                                         <NVML error>" form
reset of a GPU off the bus             the device-handle line, exit 15 (as every call,   nvidia_smi.py
                                       sim/hosts/stubs/nvidia_smi.py)
``-pm 0`` / ``-pm 1``                  ``Disabled persistence mode for GPU <bus>.`` /    NVIDIA/NVSentinel#1690
                                       ``Enabled persistence mode for GPU <bus>.`` per   ("All done.")
                                       GPU, then ``All done.``, exit 0
``-q`` after a reset: the ``Fabric``   ``State`` / ``Status`` ``Not Started`` / ``N/A``  NVIDIA/NVSentinel#883 (Not
section of each reset GPU (an          for the first half of ``fabric_train_s``,         Started -> In Progress ->
NVSwitch board: NVLink present)        ``In Progress`` / ``N/A`` for the second, then    Completed); NVIDIA GPU
                                       ``Completed`` / ``Success``, or ``Completed`` /   Operator docs (In Progress /
                                       the board's ``fabric_failure`` when set           N/A, then Completed /
                                                                                         Success); Azure/azhpc-images
                                                                                         #506 (Completed / Insufficient
                                                                                         Resources); NVML
                                                                                         nvmlGpuFabricInfo_t: status
                                                                                         "must be checked only if
                                                                                         state returns complete"
``-q`` on a board without NVLink       ``State`` and ``Status`` ``N/A``                  A100-SXM4 / A10 ``-q``
                                                                                         captures (thamada/nvidia-smi,
                                                                                         leptonai/gpud fixtures)
=====================================  ================================================  ============================

Individual reset (nvidia-smi(1), "NVSwitch systems" table): an Ampere or newer GPU can be reset alone while
Fabric Manager runs; otherwise every NVLink peer (on an HGX board: every GPU) in the same command, and then no
compute process may run on any GPU. Fabric Manager "runs" when ``systemctl is-active
nvidia-fabricmanager.service`` says so on this machine. Not simulated: the root check (the machines run it
under sudo), ``-r bus``, Windows' driver restart, MIG, a fabric that never trains because Fabric Manager is
stopped (the stand-in's boards serve without it), the fabric's Health block.

State changes are written to ``host.json`` (the GPU's ``persistence_mode``, ECC and remap fields) by rename, so
the next call of any stub reads them.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from sim.hosts import gpu_clients
from sim.hosts.hardware import Gpu, Hardware

IN_USE_EXIT = 255  # NVIDIA/NVSentinel#1690: "exit=255"
NOT_SUPPORTED_EXIT = 3  # nvidia-smi(1): the requested operation is not available on target device
PEERS_EXIT = 255
INDIVIDUAL_RESET_ARCHITECTURES = ("Ampere", "Hopper", "Blackwell")
FABRIC_MANAGER_UNIT = "nvidia-fabricmanager.service"
IN_USE_TAIL = ("currently being used by one or more other processes (e.g., Fabric Manager, CUDA application, "
               "graphics application such as an X server, or a monitoring application such as another instance "
               "of nvidia-smi). Please first kill all processes using this device and all compute applications "
               "running in the system.")


FABRIC_READY = ("Completed", "Success")


def fabric(hw: Hardware, gpu: Gpu, now: float) -> tuple[str, str]:
    """(State, Status) of the GPU's fabric registration at ``now`` (unix s), as ``nvidia-smi -q`` shows them."""
    if not any(hw.nvlink.values()):
        return "N/A", "N/A"  # no NVLink, no NVSwitch fabric
    if gpu.fabric_reset_at is None:
        return FABRIC_READY  # registered at boot
    since = now - gpu.fabric_reset_at
    if since < hw.fabric_train_s / 2:
        return "Not Started", "N/A"
    if since < hw.fabric_train_s:
        return "In Progress", "N/A"
    return "Completed", hw.fabric_failure or "Success"


def fabric_manager_active() -> bool:
    try:
        done = subprocess.run(["systemctl", "is-active", "--quiet", FABRIC_MANAGER_UNIT], timeout=10,
                              capture_output=True)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _save(run_dir: Path, gpus: list[Gpu], fields: tuple[str, ...]) -> None:
    """Write ``fields`` of ``gpus`` into host.json's hardware (by rename: a reader never sees half a file)."""
    path = run_dir / "host.json"
    host = json.loads(path.read_text())
    by_index = {g.index: g for g in gpus}
    for gpu in host["hardware"]["gpus"]:
        if gpu["index"] in by_index:
            for name in fields:
                gpu[name] = getattr(by_index[gpu["index"]], name)
    tmp = path.with_name(path.name + ".nvsmi-tmp")
    tmp.write_text(json.dumps(host, indent=1))
    os.replace(tmp, path)


def persistence(hw: Hardware, gpus: list[Gpu], value: str, run_dir: Path) -> int:
    enable = value.strip().upper() in ("1", "ENABLED")
    for gpu in gpus:
        gpu.persistence_mode = enable
        print(f"{'Enabled' if enable else 'Disabled'} persistence mode for GPU {gpu.bus_id}.")
    _save(run_dir, gpus, ("persistence_mode",))
    print("All done.")
    return 0


def reset(hw: Hardware, gpus: list[Gpu], run_dir: Path, fabric_manager: Callable[[], bool] | None = None) -> int:
    """``gpus``: the ones ``-i`` named (every GPU without it); ``fabric_manager`` (default: ask systemd) says
    whether Fabric Manager runs."""
    unsupported = [g for g in gpus if not g.reset_supported]
    if unsupported:
        for gpu in unsupported:
            print(f"Unable to reset GPU {gpu.bus_id}: Not Supported")
        return NOT_SUPPORTED_EXIT
    linked = any(hw.nvlink.values())  # the simulated boards are HGX: NVLink through NVSwitches
    architecture_ok = hw.gpu_architecture in INDIVIDUAL_RESET_ARCHITECTURES
    individual = architecture_ok and (not linked or (fabric_manager or fabric_manager_active)())
    named = {g.index for g in gpus}
    if not individual:
        missing = [g for g in hw.gpus if g.index not in named and any(hw.nvlinks(g.index, n) for n in named)]
        if missing:
            print(f"Unable to reset GPU {gpus[0].bus_id}: its NVLink peers must be reset in the same command: "
                  + ", ".join(f"GPU {g.bus_id}" for g in missing))
            return PEERS_EXIT
    held = gpu_clients.holders(run_dir)
    # no compute process may run on any GPU of the system when individual reset is not feasible
    watched = gpus if individual else hw.gpus
    busy = [g for g in watched if g.persistence_mode or held.get(g.index)]
    if busy:
        print("The following GPUs could not be reset:")
        for gpu in busy:
            print(f"  GPU {gpu.bus_id}: In use by another client")
        count = f"{len(busy)} device is" if len(busy) == 1 else f"{len(busy)} devices are"
        print(f"\n{count} {IN_USE_TAIL}")
        return IN_USE_EXIT
    at = time.time()
    for gpu in gpus:
        gpu.ecc_uncorrectable, gpu.row_remap_pending, gpu.retired_pending = 0, False, False
        gpu.fabric_reset_at = at
        print(f"GPU {gpu.bus_id} was successfully reset.")
    _save(run_dir, gpus, ("ecc_uncorrectable", "row_remap_pending", "retired_pending", "fabric_reset_at"))
    return 0
