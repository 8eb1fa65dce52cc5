"""Stub hardware tools of a simulated host: one multi-call program installed under each tool's name.

Every stub reads the host's hardware description (``/run/clusterctl-sim/host.json`` inside the host),
appends its call to ``/run/clusterctl-sim/calls.log`` (one JSON object per line: argv, time, pid), sleeps
``sim_command_delay_s`` and prints what the real tool prints on an HGX H100/H200 server, generated from
the description. A ``hang`` fault makes the named tool (or every tool) sleep until killed.
"""

from __future__ import annotations

import os
from pathlib import Path

# tool name -> "module:function" under sim.hosts.stubs; imported only when that tool runs.
TOOLS: dict[str, str] = {
    "nvidia-smi": "nvidia_smi:main",
    "ibstat": "infiniband:ibstat",
    "ibping": "infiniband:ibping",
    "ibportstate": "ibportstate:main",
    "ib_write_lat": "perftest:ib_write_lat",
    "ib_write_bw": "perftest:ib_write_bw",
    "all_reduce_perf": "nccl:all_reduce_perf",
    "chronyc": "chrony:chronyc",
    "mlnx_qos": "mlnx_qos:main",
    "lscpu": "cpu:lscpu",
    "numactl": "cpu:numactl",
    "cpupower": "cpu:cpupower",
    "dmesg": "kernel_log:dmesg",
    "journalctl": "kernel_log:journalctl",
    "systemctl": "systemctl:main",
    "ofed_info": "versions:ofed_info",
    "nv-fabricmanager": "versions:nv_fabricmanager",
    "nvbandwidth": "gpu_depth:nvbandwidth",  # stands in for a build from NVIDIA's source (sim/aptrepo/README.md)
    "dcgmi": "gpu_depth:dcgmi",
    "update-grub": "boot:update_grub",
    "mokutil": "boot:mokutil",
    "sysctl": "sysctl:sysctl",
    "clusterctl-drill-device": "drill_device:main",
}
# Tools only a vendor package puts on a host: the machine has none of its own (a real host has no dcgmi until
# DCGM's package is installed), and the package's launcher (sim/aptrepo) runs this program under that name.
PACKAGE_TOOLS = frozenset({"dcgmi"})
# Tools Ansible itself calls while provisioning: no call delay, no hang (those model slow hardware probes).
# The drills' device tools are no probes either: a drill's undo must not hang on the `hang` fault.
UNDELAYED_TOOLS = frozenset({"systemctl", "update-grub", "sysctl", "mokutil", "clusterctl-drill-device", "ibportstate"})
PROGRAM = "clusterctl-sim-tool"
REAL_SYSTEMCTL = ("/usr/bin/systemctl", "/bin/systemctl")


def install(bin_dir: Path, python: str, lib_dir: str | None = None) -> None:
    """Write the multi-call program into ``bin_dir`` and link every tool name but :data:`PACKAGE_TOOLS` to it.
    ``python`` runs it;
    ``lib_dir`` (where the ``sim`` package is, when ``python`` cannot import it by itself: a machine's own
    /usr/bin/python3 with the package bound in read-only) goes first on its sys.path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    program = bin_dir / PROGRAM
    path_line = f"import sys\nsys.path.insert(0, {lib_dir!r})\n" if lib_dir else ""
    program.write_text(
        f"#!{python}\n# Stub hardware tools of a simulated host (clusterctl virtual).\n"
        + path_line + "from sim.hosts.stubs.main import main\n\nmain()\n"
    )
    program.chmod(0o755)
    for tool in TOOLS:
        if tool in PACKAGE_TOOLS:
            continue
        if tool == "systemctl":
            _write_systemctl_front(bin_dir / tool)
        else:
            os.symlink(PROGRAM, bin_dir / tool)


def _write_systemctl_front(path: Path) -> None:
    """systemctl: the stub answers show, cat and is-active from the unit files (offline systemctl answers
    nothing); every other command goes straight to the real systemctl from this shell front, as the stub
    itself would, without a Python start (~65 ms of CPU) for each of Ansible's is-enabled/enable calls."""
    real = next((p for p in REAL_SYSTEMCTL if os.path.exists(p)), None)
    hand_over = f'exec {real} "$@"' if real else f'CLUSTERCTL_SIM_TOOL=systemctl exec "$(dirname "$0")/{PROGRAM}" "$@"'
    path.write_text(
        "#!/bin/sh\n# systemctl of a simulated host (clusterctl virtual): see sim/hosts/stubs/systemctl.py.\n"
        "for arg in \"$@\"; do\n"
        "  case \"$arg\" in\n"
        "    -*) ;;\n"
        f'    show|cat|is-active) CLUSTERCTL_SIM_TOOL=systemctl exec "$(dirname "$0")/{PROGRAM}" "$@" ;;\n'
        "    *) break ;;\n"
        "  esac\n"
        "done\n"
        f"{hand_over}\n"
    )
    path.chmod(0o755)
