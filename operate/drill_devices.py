"""What the fault kinds ``gpu_lost`` and ``ib_port_down`` (:mod:`operate.drill_faults`) change on the target
host: the state its GPU and HCA report, read and written by one stdlib program run there with ``python3``
(:data:`HOST_PROGRAM`), through the drill's transport like every other fault step.

The state lives where the node's readers of it look, the same paths on every host this project provisions:

==================  ============================================================  =========================
what                read by                                                       file
==================  ============================================================  =========================
NVML (the agent's   nvidia-ml-py's ``nvmlDeviceGetHandleByIndex``/``...Memory...``  ``$CLUSTERCTL_SIM_NVML_FILE``,
GPU readings, XID   (``lost``: ``NVMLError_GpuIsLost``) and its XID events          else /run/clusterctl-sim/
events)             (``xid``)                                                       nvml.json
the driver's view   ``nvidia-smi`` (a lost GPU: "Unable to determine the device    ``$CLUSTERCTL_SIM_RUN_DIR``/
of the GPUs, the    handle", exit 15), ``dmesg``/``journalctl -k`` (``NVRM: Xid``  host.json (default dir
kernel log, the     lines), ``ibstat`` (port State/Physical state) and the          /run/clusterctl-sim),
HCAs' ports         fabric's ``ibping`` from the other hosts                        ``hardware``
==================  ============================================================  =========================

These are the virtual cluster's stand-ins for the driver and the HCA (sim/nvml_standin/pynvml.py,
sim/hosts/stubs); a host with real GPUs has neither file, and the step fails there naming the file, with
nothing changed: software cannot take a real GPU off the bus, or write an XID into its driver's event queue,
short of removing the PCI device (decision 0033 says what a real host's drill would need).

Every write replaces the file (a temporary file renamed over it), so a reader never sees half of one and the
NVML stand-in, which re-reads its file when its inode, mtime or size changes, picks it up on its next call.
"""

from __future__ import annotations

import json

NVML_FILE_ENV, NVML_FILE = "CLUSTERCTL_SIM_NVML_FILE", "/run/clusterctl-sim/nvml.json"  # sim/nvml_standin/pynvml.py
RUN_DIR_ENV, RUN_DIR = "CLUSTERCTL_SIM_RUN_DIR", "/run/clusterctl-sim"  # sim/hosts/stubs/main.py
XID_FALLEN_OFF_THE_BUS = 79  # NVIDIA Xid catalog: ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS
PORT_DOWN = ("Down", "Disabled")  # ibstat's State and Physical state of a port whose link is disabled

HOST_PROGRAM = f"""
import json, os, sys
NVML = os.environ.get({NVML_FILE_ENV!r}) or {NVML_FILE!r}
HOST = os.path.join(os.environ.get({RUN_DIR_ENV!r}) or {RUN_DIR!r}, "host.json")

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as exc:
        sys.exit(f"{{path}}: {{exc.strerror}}: this host has no such state (a real GPU or HCA is not faulted by a file)")

def save(path, data):
    tmp = path + ".drill-tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)

def gpu(data, index, path):
    found = [g for g in data["gpus"] if g["index"] == index]
    if not found:
        sys.exit(f"{{path}}: no GPU {{index}}")
    return found[0]

op, args = sys.argv[1], [json.loads(a) for a in sys.argv[2:]]
nvml = load(NVML) if op.startswith("gpu") else None
host = load(HOST)
hw = host["hardware"]
if op == "gpu-state":
    n, k = gpu(nvml, args[0], NVML), gpu(hw, args[0], HOST)
    print(json.dumps([len(n.get("xid", [])), bool(n.get("lost")), len(k["xid_events"]), bool(k.get("lost"))]))
elif op == "gpu-lost":
    n, k = gpu(nvml, args[0], NVML), gpu(hw, args[0], HOST)
    n["lost"], k["lost"] = True, True
    n["xid"] = n.get("xid", []) + [args[1]]
    k["xid_events"] = k["xid_events"] + [args[1]]
    save(HOST, host)
    save(NVML, nvml)
elif op == "gpu-restore":
    index, (nvml_xids, nvml_lost, host_xids, host_lost) = args[0], args[1]
    n, k = gpu(nvml, index, NVML), gpu(hw, index, HOST)
    n["lost"], k["lost"] = nvml_lost, host_lost
    n["xid"], k["xid_events"] = n.get("xid", [])[:nvml_xids], k["xid_events"][:host_xids]
    if not n["xid"]:
        del n["xid"]  # absent is none, as the file was written
    save(NVML, nvml)
    save(HOST, host)
elif op == "hca-state":
    print(json.dumps({{h["device"]: [h["state"], h["phys_state"]] for h in hw["hcas"]}}))
elif op == "hca-set":
    states = args[0]
    for h in hw["hcas"]:
        if h["device"] in states:
            h["state"], h["phys_state"] = states[h["device"]]
    save(HOST, host)
else:
    sys.exit(f"unknown operation {{op}}")
"""


def device_command(op: str, *args) -> list[str]:
    """The host command for ``op`` (gpu-state, gpu-lost, gpu-restore, hca-state, hca-set), each argument JSON."""
    return ["python3", "-c", HOST_PROGRAM, op, *(json.dumps(a) for a in args)]
