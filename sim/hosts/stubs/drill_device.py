"""``clusterctl-drill-device``: the virtual cluster's implementation of the host tool the drills' ``gpu_lost``
runs (operate/drill_devices.py names the tool and its operations; ``ib_port_down`` runs ``ibportstate``,
sim/hosts/stubs/ibportstate.py). It changes the state
the machine's stand-ins read, so a fault shows up where a real one would:

==============================  ==============================================================================
file                            read by
==============================  ==============================================================================
nvml.json (the NVML stand-in's  nvidia-ml-py's calls on a GPU (``lost``: ``NVMLError_GpuIsLost``) and its XID
file: ``CLUSTERCTL_SIM_NVML_     events (``xid``): the agent (sim/nvml_standin/pynvml.py)
FILE``, else /run/clusterctl-
sim/nvml.json)
host.json ``hardware`` (the     ``nvidia-smi`` (a ``lost`` GPU: the device-handle error, exit 15), ``dmesg`` and
run dir)                        ``journalctl -k`` (``xid_events``: ``NVRM: Xid`` lines)
==============================  ==============================================================================

Operations (arguments JSON): ``gpu-state GPU`` prints ``[nvml xids, nvml lost, kernel xids, kernel lost]``;
``gpu-lost GPU XID`` marks the GPU lost in both and appends the XID to both; ``gpu-restore GPU STATE`` puts
back what ``gpu-state`` printed (the lists cut back to their counts). Every write renames a temporary file over the old one, so a
reader never sees half of it, and the NVML stand-in (which re-reads its file when inode, mtime or size change)
picks it up at its next call. A missing file or GPU exits 1 naming it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from sim.hosts import machine_paths
from sim.hosts.hardware import Hardware
from sim.hosts.stubs.main import SIM_RUN_DIR

# sim/nvml_standin/pynvml.py's FILE_ENV and DEFAULT_FILE (that package imports the agent, which a machine's own
# python3 does not have; tests/integration/operate/test_drill_devices.py reads the file through it)
NVML_FILE_ENV = "CLUSTERCTL_SIM_NVML_FILE"
NVML_DEFAULT = f"{machine_paths.SIM_RUN_DIR}/nvml.json"


class DeviceError(Exception):
    pass


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise DeviceError(f"{path}: {exc.strerror}") from None


def _save(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".drill-tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _gpu(gpus: list[dict], index: int, path: Path) -> dict:
    for gpu in gpus:
        if gpu["index"] == index:
            return gpu
    raise DeviceError(f"{path}: no GPU {index}")


def run(op: str, args: list, run_dir: Path, nvml_path: Path) -> str:
    """What the tool prints for ``op``; DeviceError for a missing file, GPU or operation."""
    host_path = run_dir / "host.json"
    host = _load(host_path)
    hw = host["hardware"]
    if op not in ("gpu-state", "gpu-lost", "gpu-restore"):
        raise DeviceError(f"unknown operation {op!r}")
    nvml = _load(nvml_path)
    n, k = _gpu(nvml["gpus"], args[0], nvml_path), _gpu(hw["gpus"], args[0], host_path)
    if op == "gpu-state":
        return json.dumps([len(n.get("xid", [])), bool(n.get("lost")), len(k["xid_events"]), bool(k.get("lost"))])
    if op == "gpu-lost":
        n["lost"], k["lost"] = True, True
        n["xid"], k["xid_events"] = [*n.get("xid", []), args[1]], [*k["xid_events"], args[1]]
    else:
        nvml_xids, nvml_lost, host_xids, host_lost = args[1]
        n["lost"], k["lost"] = nvml_lost, host_lost
        n["xid"], k["xid_events"] = n.get("xid", [])[:nvml_xids], k["xid_events"][:host_xids]
        if not n["xid"]:
            del n["xid"]  # absent is none, as the file is written
    _save(host_path, host)
    _save(nvml_path, nvml)
    return ""


def main(hw: Hardware, args: list[str]) -> int:
    if not args:
        print("clusterctl-drill-device: usage: OPERATION [JSON ARGUMENT...]", file=sys.stderr)
        return 2
    nvml_path = Path(os.environ.get(NVML_FILE_ENV) or NVML_DEFAULT)
    try:
        out = run(args[0], [json.loads(a) for a in args[1:]], SIM_RUN_DIR, nvml_path)
    except (DeviceError, ValueError, KeyError, IndexError) as exc:
        print(f"clusterctl-drill-device: {exc}", file=sys.stderr)
        return 1
    if out:
        print(out)
    return 0
