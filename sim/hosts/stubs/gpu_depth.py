"""The preflight-depth tools of a simulated HGX board: ``nvidia-smi nvlink -s|-e``, the clock event reasons
of ``nvidia-smi -q -d PERFORMANCE``, ``nvbandwidth`` and ``dcgmi diag -r N -j``.

Formats: ``nvlink -s``/``-e`` as R535-R565 print them (Azure/azhpc-diagnostics#73, NVIDIA/srt-slurm#307):
``GPU N: <name> (UUID: ...)`` then ``\\t Link L: 26.562 GB/s`` or ``<inactive>``, and per link ``Replay
Errors``, ``Recovery Errors``, ``CRC Errors``. Clock event reasons and counters as R550 prints them.
nvbandwidth v0.6 layout (NVIDIA/nvbandwidth#15, #50). dcgmi diag -j in DCGM 3.3's "DCGM GPU Diagnostic"
layout (NVIDIA/DCGM#139) with level 1/2/3 test lists of the dcgmi-diag reference.

Counters that faults make grow (NVLink errors, throttle time) are a rate times the seconds since the host
"booted" (``virtual up`` wrote its host.json): strictly increasing from one call to the next, as on a real
link that keeps erroring, and starting from 0 like the driver's counters.

Reference values (not measurements of ours): H100/H200 SXM copy-engine bandwidth ~55 GB/s host<->device
(PCIe Gen5 x16) and ~390 GB/s device-to-device read over NVLink4 (azurehpc gates at 48 and 335);
A100 SXM4 ~26 GB/s (PCIe Gen4, azurehpc gates at 24) and ~270 GB/s.
"""

from __future__ import annotations

import json
import os
import time

from sim.hosts import machine_paths
from sim.hosts.hardware import Gpu, Hardware
from sim.hosts.stubs.main import StubUsageError

NVLINK_SPEED = {"Hopper": 26.562, "Ampere": 25.0}
BANDWIDTH = {"Hopper": (55.3, 55.1, 391.2), "Ampere": (26.1, 26.3, 272.5)}  # H2D, D2H, D2D read GB/s
REASONS = ("Idle", "Applications Clocks Setting", "SW Power Cap", "HW Slowdown", "HW Thermal Slowdown",
           "HW Power Brake Slowdown", "Sync Boost", "SW Thermal Slowdown", "Display Clock Setting")
# reason -> the counter that accumulates its time (nvidia-smi "Clocks Event Reasons Counters").
REASON_COUNTER = {"SW Power Cap": "SW Power Capping", "Sync Boost": "Sync Boost",
                  "SW Thermal Slowdown": "SW Thermal Slowdown", "HW Thermal Slowdown": "HW Thermal Slowdown",
                  "HW Power Brake Slowdown": "HW Power Braking"}
COUNTERS = ("SW Power Capping", "Sync Boost", "SW Thermal Slowdown", "HW Thermal Slowdown", "HW Power Braking")


def _booted() -> float:
    from sim.hosts.stubs import main

    try:
        return (main.SIM_RUN_DIR / "host.json").stat().st_mtime
    except OSError:
        return time.time() - 7200.0  # no state dir (called in-process): the kernel log's boot time


def _grown(rate_per_s: float) -> int:
    return int(rate_per_s * max(0.0, time.time() - _booted())) if rate_per_s else 0


def nvlink_count(hw: Hardware) -> int:
    """NVLinks per GPU: the most any pair has (a pair down reads fewer), or past the highest inactive link."""
    inactive = [max(gpu.nvlink_inactive) + 1 for gpu in hw.gpus if gpu.nvlink_inactive]
    return max([*hw.nvlink.values(), *inactive], default=0)


# --------------------------------------------------------------------------------- nvidia-smi nvlink


def nvlink(hw: Hardware, args: list[str], gpus: list[Gpu]) -> str:
    flags = set(args)
    speed = NVLINK_SPEED.get(hw.gpu_architecture, 26.562)
    out = []
    for gpu in gpus:
        out.append(f"GPU {gpu.index}: {hw.gpu_name} (UUID: {gpu.uuid})")
        for link in range(nvlink_count(hw)):
            if flags & {"-s", "--status"}:
                out.append(f"\t Link {link}: " + ("<inactive>" if link in gpu.nvlink_inactive else f"{speed:.3f} GB/s"))
            elif flags & {"-e", "--errorcounters"}:
                rates = gpu.nvlink_error_rates.get(str(link), {})
                for name in ("Replay", "Recovery", "CRC"):
                    value = "N/A" if link in gpu.nvlink_inactive else _grown(rates.get(name.lower(), 0.0))
                    out.append(f"\t Link {link}: {name} Errors: {value}")
            else:
                raise StubUsageError("nvlink: only -s and -e are simulated")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------- -q -d PERFORMANCE lines


def performance_lines(gpu: Gpu, kv) -> list[str]:
    """The PERFORMANCE display of one GPU; ``kv`` is nvidia_smi's key/value formatter."""
    active = set(gpu.clock_events) or {"Idle"}
    lines = [kv(4, "Performance State", "P0"), kv(4, "Clocks Event Reasons")]
    for reason in REASONS:
        indent = 12 if reason in ("HW Thermal Slowdown", "HW Power Brake Slowdown") else 8
        lines.append(kv(indent, reason, "Active" if reason in active else "Not Active"))
    lines.append(kv(4, "Clocks Event Reasons Counters"))
    for counter in COUNTERS:
        # Healthy boards carry some power-capping history from earlier jobs; it does not grow here.
        base = 1187 if counter == "SW Power Capping" else 0
        rate = 200_000.0 if any(REASON_COUNTER.get(r) == counter for r in gpu.clock_events) else 0.0
        lines.append(kv(8, counter, f"{base + _grown(rate)} us"))
    return lines


# ---------------------------------------------------------------------------------------- nvbandwidth


def nvbandwidth(hw: Hardware, args: list[str]) -> int:
    tests = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg in ("-t", "--testcase"):
            while rest and not rest[0].startswith("-"):
                tests.append(rest.pop(0))
        elif arg in ("-i", "--testSamples", "-b", "--bufferSize"):
            rest.pop(0) if rest else None
        else:
            raise StubUsageError(f"unrecognised option {arg!r}")
    h2d, d2h, d2d = BANDWIDTH.get(hw.gpu_architecture, BANDWIDTH["Hopper"])
    gpus = hw.gpus
    print(f"nvbandwidth Version: v0.6\nBuilt from Git version: v0.6\n\nCUDA Runtime Version: 12040\n"
          f"CUDA Driver Version: 12040\nDriver Version: {hw.versions['driver']}\n")
    for gpu in gpus:
        print(f"Device {gpu.index}: {hw.gpu_name} ({gpu.bus_id[4:13]})")
    print()
    header = "     " + "".join(f"{g.index:>10}" for g in gpus)
    for test in tests or ["host_to_device_memcpy_ce"]:
        print(f"Running {test}.")
        if test in ("host_to_device_memcpy_ce", "device_to_host_memcpy_ce"):
            to_gpu = test.startswith("host")
            print(f"memcpy CE CPU(row) {'->' if to_gpu else '<-'} GPU(column) bandwidth (GB/s)")
            values = [(g.h2d_gbps or h2d) if to_gpu else (g.d2h_gbps or d2h) for g in gpus]
            print(header)
            print(f"{0:>2}   " + "".join(f"{v:>10.2f}" for v in values))
        elif test == "device_to_device_memcpy_read_ce":
            print("memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s)")
            print(header)
            values = []
            for row in gpus:
                cells = []
                for col in gpus:
                    if row.index == col.index:
                        cells.append(f"{'N/A':>10}")
                        continue
                    value = min(row.d2d_gbps or d2d, col.d2d_gbps or d2d) if hw.nvlinks(row.index, col.index) else 40.0
                    values.append(value)
                    cells.append(f"{value:>10.2f}")
                print(f"{row.index:>2}   " + "".join(cells))
        else:
            print("Waived: \n")
            continue
        print(f"\nSUM {test} {sum(values):.2f}\n")
    print("NOTE: The reported results may not reflect the full capabilities of the platform.")
    return 0


# ------------------------------------------------------------------------------------- dcgmi diag

LEVEL_TESTS = {
    1: [("Deployment", "software")],
    2: [("Deployment", "software"), ("Integration", "pcie"), ("Hardware", "memory")],
    3: [("Deployment", "software"), ("Integration", "pcie"), ("Hardware", "memory"),
        ("Hardware", "diagnostic"), ("Stress", "targeted_stress"), ("Stress", "targeted_power"),
        ("Stress", "memory_bandwidth")],
}
# DCGM_FR_* ids (dcgmlib/dcgm_errors.h) a simulated failing test reports.
FAILURE = {"memory": (52, "Faulty memory detected on GPU {gpu}."),
           "pcie": (30, "GPU {gpu}: PCIe bandwidth is unacceptably low."),
           "diagnostic": (58, "Memory error detected on GPU {gpu}."),
           "targeted_stress": (50, "Stress level is too low on GPU {gpu}."),
           "software": (25, "Graphics processes are active on GPU {gpu}.")}


# dcgmi without a host engine (DCGM's dcgmi/Command.cpp: Connect() prints the first line, Execute() returns
# DCGM_ST_CONNECTION_NOT_VALID, -21, whose error string is the second; NVIDIA/DCGM#43, #57).
NO_HOSTENGINE = ("Error: unable to establish a connection to the specified host: localhost\n"
                 "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.")
CONNECTION_NOT_VALID_EXIT = 256 - 21
HOSTENGINE_PID_FILE = machine_paths.DCGM_HOSTENGINE_PID


def hostengine_running(pid_file: str | None = None) -> bool:
    """Whether the stand-in nv-hostengine that wrote ``pid_file`` still runs (see machine_paths)."""
    try:
        with open(pid_file or HOSTENGINE_PID_FILE) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return False
    return os.path.exists(f"/proc/{pid}")


def dcgmi(hw: Hardware, args: list[str]) -> int:
    if args[:1] != ["diag"]:
        raise StubUsageError("only `dcgmi diag -r N -j` is simulated")
    if not hostengine_running():
        print(NO_HOSTENGINE)
        return CONNECTION_NOT_VALID_EXIT
    level = int(args[args.index("-r") + 1]) if "-r" in args and args.index("-r") + 1 < len(args) else 1
    categories: dict[str, list] = {}
    failed = False
    for category, name in LEVEL_TESTS.get(min(level, 3), LEVEL_TESTS[1]):
        results = []
        for gpu in hw.gpus:
            bad = gpu.dcgm_fail == name
            failed |= bad
            result: dict = {"gpu_id": str(gpu.index), "status": "Fail" if bad else "Pass"}
            if bad:
                error_id, message = FAILURE.get(name, (1, "Unknown error on GPU {gpu}."))
                result["warnings"] = [{"error_category": 10, "error_id": error_id, "error_severity": 2,
                                       "warning": message.format(gpu=gpu.index)}]
            results.append(result)
        categories.setdefault(category, []).append({"name": name, "results": results})
    document = {"DCGM GPU Diagnostic": {"test_categories": [{"category": c, "tests": t} for c, t in categories.items()]},
                "version": "3.3.5"}
    print(json.dumps(document, indent=4))
    return 1 if failed else 0  # non-zero when a test failed; the JSON is printed either way
