"""``nvidia-smi`` of a simulated HGX board: the summary table, ``-L``, ``-q [-d ...] [-i N]``,
``--query-gpu=... --format=csv[,noheader][,nounits]``, ``topo -m`` / ``topo -mp``, and ``-r/--gpu-reset`` and
``-pm`` (sim/hosts/stubs/gpu_reset.py: their behaviour table and sources).

Formats are those of the R550-R565 drivers on HGX H100 (real captures: NVIDIA/nccl#1264, Supermicro
SYS-821GE-TNHR, driver 550.54.15, and thamada/nvidia-smi ``nvsim/H100SXMx8_smi.py``, driver 565.57.01):
``-q`` puts the colon at column 42; the summary table's three columns are 41, 24 and 22 characters wide;
``topo -m`` cells are tab separated with `` X `` on the diagonal and a ``NIC Legend``.

A GPU that fell off the bus (``lost``, the drill's ``gpu_lost``): NVML cannot get its handle, so every call
first prints ``Unable to determine the device handle for GPU0000:CB:00.0: Unknown Error`` for it (the line
nvidia-smi prints after an XID 79: leptonai/gpud's nvidia-smi error fixtures), answers for the other GPUs,
and exits 15, nvidia-smi(1)'s RETURN VALUE for "the GPU has fallen off the bus or has otherwise become
inaccessible". Naming only lost GPUs with ``-i`` prints the line alone.

``-q``'s ``Fabric`` section (State, Status) follows the GPU's fabric registration after a reset
(sim/hosts/stubs/gpu_reset.py, ``fabric``).
"""

from __future__ import annotations

import time

from sim.hosts.hardware import Gpu, Hardware, cpulist
from sim.hosts.stubs import gpu_depth, gpu_reset
from sim.hosts.stubs.main import SIM_RUN_DIR, StubUsageError

QUERY_COLUMN = 42  # "    Product Name                          : ..." (key padded to column 42)


# --------------------------------------------------------------------------------------------- -q


def _kv(indent: int, key: str, value: object | None = None) -> str:
    if value is None:
        return " " * indent + key
    return f"{' ' * indent}{key:<{QUERY_COLUMN - indent}}: {value}"


def _gpu_sections(hw: Hardware, gpu: Gpu) -> list[tuple[str, list[str]]]:
    """(display section, lines) of one GPU's -q block, in the driver's order."""
    bus = int(gpu.bus_id.split(":")[1], 16)
    dram_ue = gpu.ecc_uncorrectable
    remap_ue = 1 if gpu.row_remap_pending else 0
    ecc_counters = [
        ("SRAM Correctable", 0), ("SRAM Uncorrectable Parity", 0), ("SRAM Uncorrectable SEC-DED", 0),
        ("DRAM Correctable", 0), ("DRAM Uncorrectable", dram_ue),
    ]
    memory_reserved = 454 if hw.gpu_memory_mib < 100000 else 587
    fabric_state, fabric_status = gpu_reset.fabric(hw, gpu, time.time())
    return [
        ("", [
            _kv(4, "Product Name", hw.gpu_name),
            _kv(4, "Product Brand", "NVIDIA"),
            _kv(4, "Product Architecture", hw.gpu_architecture),
            _kv(4, "Display Mode", "Enabled"),
            _kv(4, "Display Active", "Disabled"),
            _kv(4, "Persistence Mode", "Enabled" if gpu.persistence_mode else "Disabled"),
            _kv(4, "Addressing Mode", "None"),
            _kv(4, "MIG Mode"), _kv(8, "Current", "Disabled"), _kv(8, "Pending", "Disabled"),
            _kv(4, "Accounting Mode", "Disabled"),
            _kv(4, "Accounting Mode Buffer Size", 4000),
            _kv(4, "Serial Number", gpu.serial),
            _kv(4, "GPU UUID", gpu.uuid),
            _kv(4, "Minor Number", gpu.index),
            _kv(4, "VBIOS Version", "96.00.74.00.01"),
            _kv(4, "MultiGPU Board", "No"),
            _kv(4, "Board ID", f"0x{bus:x}00"),
            _kv(4, "GPU Reset Status"), _kv(8, "Reset Required", "No"),
            _kv(8, "Drain and Reset Recommended", "No"),
            _kv(4, "GSP Firmware Version", hw.versions["driver"]),
        ]),
        ("PCI", [
            _kv(4, "PCI"),
            _kv(8, "Bus", f"0x{bus:02X}"),
            _kv(8, "Device", "0x00"),
            _kv(8, "Domain", "0x0000"),
            _kv(8, "Device Id", f"0x{int(hw.gpu_pci_device_id, 16):04X}10DE"),
            _kv(8, "Bus Id", gpu.bus_id),
            _kv(8, "GPU Link Info"), _kv(12, "PCIe Generation"), _kv(16, "Max", 5),
            _kv(16, "Current", gpu.pcie_gen), _kv(16, "Device Current", gpu.pcie_gen), _kv(16, "Device Max", 5),
            _kv(16, "Host Max", 5),
            _kv(12, "Link Width"), _kv(16, "Max", "16x"), _kv(16, "Current", f"{gpu.pcie_width}x"),
            _kv(8, "Replays Since Reset", 0),
        ]),
        ("PERFORMANCE", gpu_depth.performance_lines(gpu, _kv)),
        ("MEMORY", [
            _kv(4, "FB Memory Usage"),
            _kv(8, "Total", f"{hw.gpu_memory_mib} MiB"),
            _kv(8, "Reserved", f"{memory_reserved} MiB"),
            _kv(8, "Used", "1 MiB"),
            _kv(8, "Free", f"{hw.gpu_memory_mib - memory_reserved - 1} MiB"),
        ]),
        ("COMPUTE", [_kv(4, "Compute Mode", "Default")]),
        ("UTILIZATION", [_kv(4, "Utilization"), _kv(8, "Gpu", "0 %"), _kv(8, "Memory", "0 %")]),
        ("ECC", [
            _kv(4, "ECC Mode"), _kv(8, "Current", "Enabled"), _kv(8, "Pending", "Enabled"),
            _kv(4, "ECC Errors"),
            _kv(8, "Volatile"), *(_kv(12, k, v) for k, v in ecc_counters),
            _kv(8, "Aggregate"), *(_kv(12, k, v) for k, v in ecc_counters),
            _kv(12, "SRAM Threshold Exceeded", "No"),
            _kv(8, "Aggregate Uncorrectable SRAM Sources"),
            *(_kv(12, f"SRAM {unit}", 0) for unit in ("L2", "SM", "Microcontroller", "PCIE", "Other")),
        ]),
        ("PAGE_RETIREMENT", [
            _kv(4, "Retired Pages"), _kv(8, "Single Bit ECC", "N/A"), _kv(8, "Double Bit ECC", "N/A"),
            _kv(8, "Pending Page Blacklist", "N/A"),
        ]),
        ("ROW_REMAPPER", [
            _kv(4, "Remapped Rows"),
            _kv(8, "Correctable Error", 0),
            _kv(8, "Uncorrectable Error", remap_ue),
            _kv(8, "Pending", "Yes" if gpu.row_remap_pending else "No"),
            _kv(8, "Remapping Failure Occurred", "No"),
            _kv(8, "Bank Remap Availability Histogram"),
            _kv(12, "Max", f"{2560 - remap_ue} bank(s)"), _kv(12, "High", f"{remap_ue} bank(s)"),
            _kv(12, "Partial", "0 bank(s)"), _kv(12, "Low", "0 bank(s)"), _kv(12, "None", "0 bank(s)"),
        ]),
        ("TEMPERATURE", [
            _kv(4, "Temperature"), _kv(8, "GPU Current Temp", f"{29 + gpu.index % 3} C"),
            _kv(8, "GPU T.Limit Temp", "57 C"), _kv(8, "Memory Current Temp", "36 C"),
        ]),
        ("POWER", [
            _kv(4, "GPU Power Readings"),
            _kv(8, "Power Draw", f"{71.5 + 3.1 * gpu.index:.2f} W"),
            _kv(8, "Current Power Limit", f"{hw.gpu_power_limit_w:.2f} W"),
            _kv(8, "Default Power Limit", f"{hw.gpu_power_limit_w:.2f} W"),
            _kv(8, "Max Power Limit", f"{hw.gpu_power_limit_w:.2f} W"),
        ]),
        ("CLOCK", [
            _kv(4, "Clocks"), _kv(8, "Graphics", "345 MHz"), _kv(8, "SM", "345 MHz"),
            _kv(8, "Memory", "2619 MHz"),
            _kv(4, "Max Clocks"), _kv(8, "Graphics", "1980 MHz"), _kv(8, "SM", "1980 MHz"),
            _kv(8, "Memory", "2619 MHz"),
        ]),
        ("FABRIC", [
            _kv(4, "Fabric"),
            _kv(8, "State", fabric_state),
            _kv(8, "Status", fabric_status),
            _kv(8, "CliqueId", "N/A" if fabric_state == "N/A" else 0),
            _kv(8, "ClusterUUID", "N/A" if fabric_state == "N/A" else "00000000-0000-0000-0000-000000000000"),
        ]),
        ("", [_kv(4, "Processes", "None")]),
    ]


def query(hw: Hardware, displays: set[str] | None, gpus: list[Gpu]) -> str:
    out = [
        "",
        "==============NVSMI LOG==============",
        "",
        _kv(0, "Timestamp", time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(time.time()))),
        _kv(0, "Driver Version", hw.versions["driver"]),
        _kv(0, "CUDA Version", hw.versions["cuda"]),
        "",
        _kv(0, "Attached GPUs", len(hw.gpus)),
    ]
    for gpu in gpus:
        out.append(f"GPU {gpu.bus_id}")
        for display, section in _gpu_sections(hw, gpu):
            if displays is None or display in displays:
                out += section
        out.append("")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------- summary


def summary(hw: Hardware) -> str:
    drv, cuda = hw.versions["driver"], hw.versions["cuda"]
    bar = "+" + "-" * 89 + "+"
    columns = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    out = [
        time.strftime("%a %b %d %H:%M:%S %Y", time.localtime(time.time())) + "       ",
        bar,
        f"| NVIDIA-SMI {drv:<23}Driver Version: {drv:<15}CUDA Version: {cuda:<9}|",
        "|-----------------------------------------+------------------------+----------------------+",
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|=========================================+========================+======================|",
    ]
    for gpu in hw.gpus:
        power = f"{round(71.5 + 3.1 * gpu.index)}W"
        out += [
            f"|{gpu.index:>4}  {hw.gpu_name:<29}{'On' if gpu.persistence_mode else 'Off':>4}  |{gpu.bus_id:>19} {'Off':>3} |{gpu.ecc_uncorrectable:>21} |",
            f"| {'N/A':>3}   {29 + gpu.index % 3:>2}C    P0{power:>16} / {str(hw.gpu_power_limit_w) + 'W':>5} "
            f"|{'1MiB':>11} / {str(hw.gpu_memory_mib) + 'MiB':>9} |{'0%':>8}{'Default':>13} |",
            f"|{'':41}|{'':24}|{'Disabled':>21} |",
            columns,
        ]
    out += [
        " " * 89,
        bar,
        "| Processes:                                                                              |",
        "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|=========================================================================================|",
        "|  No running processes found                                                             |",
        bar,
    ]
    return "\n".join(out) + "\n"


def list_gpus(hw: Hardware) -> str:
    return "".join(f"GPU {g.index}: {hw.gpu_name} (UUID: {g.uuid})\n" for g in hw.gpus)


# ----------------------------------------------------------------------------------- --query-gpu


def _query_fields(hw: Hardware, gpu: Gpu) -> dict[str, tuple[str, str]]:
    """field -> (value as printed with units, unit shown in the header)."""
    power = 71.5 + 3.1 * gpu.index
    used = 1
    return {
        "index": (str(gpu.index), ""),
        "name": (hw.gpu_name, ""),
        "uuid": (gpu.uuid, ""),
        "serial": (gpu.serial, ""),
        "pci.bus_id": (gpu.bus_id, ""),
        "driver_version": (hw.versions["driver"], ""),
        "vbios_version": ("96.00.74.00.01", ""),
        "persistence_mode": ("Enabled" if gpu.persistence_mode else "Disabled", ""),
        "pstate": ("P0", ""),
        "compute_cap": ("8.0" if hw.gpu_architecture == "Ampere" else "9.0", ""),
        "memory.total": (f"{hw.gpu_memory_mib} MiB", "MiB"),
        "memory.used": (f"{used} MiB", "MiB"),
        "memory.free": (f"{hw.gpu_memory_mib - used} MiB", "MiB"),
        "utilization.gpu": ("0 %", "%"),
        "utilization.memory": ("0 %", "%"),
        "temperature.gpu": (str(29 + gpu.index % 3), ""),
        "power.draw": (f"{power:.2f} W", "W"),
        "power.limit": (f"{hw.gpu_power_limit_w:.2f} W", "W"),
        "clocks.sm": ("345 MHz", "MHz"),
        "clocks.max.sm": ("1980 MHz", "MHz"),
        "ecc.mode.current": ("Enabled", ""),
        "ecc.errors.uncorrected.volatile.total": (str(gpu.ecc_uncorrectable), ""),
        "ecc.errors.uncorrected.aggregate.total": (str(gpu.ecc_uncorrectable), ""),
        "ecc.errors.uncorrected.volatile.dram": (str(gpu.ecc_uncorrectable), ""),
        "retired_pages.pending": ("[N/A]", ""),
        "remapped_rows.pending": ("Yes" if gpu.row_remap_pending else "No", ""),
        "remapped_rows.failure": ("No", ""),
        "remapped_rows.uncorrectable": (str(1 if gpu.row_remap_pending else 0), ""),
    }


def query_gpu(hw: Hardware, fields: list[str], fmt: set[str], gpus: list[Gpu]) -> str:
    if "csv" not in fmt:
        raise StubUsageError('"--format" must include csv')
    known = _query_fields(hw, hw.gpus[0])
    for name in fields:
        if name not in known:
            raise StubUsageError(f'Field "{name}" is not a valid field to query.')
    rows = []
    if "noheader" not in fmt:
        rows.append(", ".join(
            f"{f} [{known[f][1]}]" if known[f][1] and "nounits" not in fmt else f for f in fields
        ))
    for gpu in gpus:
        values = _query_fields(hw, gpu)
        cells = []
        for name in fields:
            value, unit = values[name]
            cells.append(value.removesuffix(f" {unit}") if unit and "nounits" in fmt else value)
        rows.append(", ".join(cells))
    return "\n".join(rows) + "\n"


# ---------------------------------------------------------------------------------------- topo


def _pcie_relation(numa_a: int, numa_b: int) -> str:
    return "NODE" if numa_a == numa_b else "SYS"


def topo(hw: Hardware, pcie_only: bool) -> str:
    gpus, nics = hw.gpus, hw.hcas
    labels = [f"GPU{g.index}" for g in gpus] + [f"NIC{i}" for i in range(len(nics))]
    out = ["\t" + "\t".join(labels) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"]
    for a in gpus:
        cells = []
        for b in gpus:
            links = hw.nvlinks(a.index, b.index)
            if a.index == b.index:
                cells.append(" X ")
            elif links and not pcie_only:
                cells.append(f"NV{links}")
            else:
                cells.append(_pcie_relation(a.numa_node, b.numa_node))
        for nic in nics:
            cells.append("PIX" if nic.gpu == a.index else _pcie_relation(a.numa_node, nic.numa_node))
        node = next((n for n in hw.numa if n.id == a.numa_node), None)
        affinity = cpulist(node.cpus) if node and node.cpus else "N/A"
        out.append(f"GPU{a.index}\t" + "\t".join(cells) + f"\t{affinity}\t{a.numa_node}\t\tN/A")
    for i, nic in enumerate(nics):
        cells = ["PIX" if nic.gpu == g.index else _pcie_relation(nic.numa_node, g.numa_node) for g in gpus]
        cells += [" X " if j == i else _pcie_relation(nic.numa_node, other.numa_node) for j, other in enumerate(nics)]
        out.append(f"NIC{i}\t" + "\t".join(cells) + "\t")
    out += [
        "",
        "Legend:",
        "",
        "  X    = Self",
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)",
        "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node",
        "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)",
        "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)",
        "  PIX  = Connection traversing at most a single PCIe bridge",
        "  NV#  = Connection traversing a bonded set of # NVLinks",
    ]
    if nics:
        out += ["", "NIC Legend:", ""] + [f"  NIC{i}: {nic.device}" for i, nic in enumerate(nics)]
    return "\n".join(out) + "\n\n"


# ------------------------------------------------------------------------------------------ main


def _selected_gpus(hw: Hardware, ids: str | None) -> list[Gpu]:
    if ids is None:
        return hw.gpus
    chosen = []
    for token in ids.split(","):
        # an index, UUID, serial or PCI bus id (nvidia-smi(1), -i); only a bus id has a colon, so "0" is GPU 0,
        # not every GPU whose bus id ends in 0
        match = [g for g in hw.gpus if token in (str(g.index), g.uuid, g.serial)
                 or (":" in token and g.bus_id.endswith(token.upper()))]
        if not match:
            raise StubUsageError(f"No devices were found matching {token!r}")
        chosen += match
    return chosen


GPU_IS_LOST_EXIT = 15  # nvidia-smi(1), RETURN VALUE


def main(hw: Hardware, args: list[str]) -> int:
    lost = [g for g in hw.gpus if g.lost]
    if not lost:
        return answer(hw, args)
    for gpu in lost:
        print(f"Unable to determine the device handle for GPU{gpu.bus_id[4:]}: Unknown Error")
    hw.gpus = [g for g in hw.gpus if not g.lost]
    try:
        code = answer(hw, args) if hw.gpus else 0
    except StubUsageError:  # -i naming only lost GPUs: nothing else to say
        code = 0
    return code or GPU_IS_LOST_EXIT


def answer(hw: Hardware, args: list[str]) -> int:
    if args[:1] == ["topo"]:
        flags = set(args[1:])
        if flags & {"-m", "--matrix"}:
            print(topo(hw, pcie_only=False), end="")
            return 0
        if flags & {"-mp", "--matrix_pci"}:
            print(topo(hw, pcie_only=True), end="")
            return 0
        raise StubUsageError("topo: only -m and -mp are simulated")
    if args[:1] == ["nvlink"]:
        ids = args[args.index("-i") + 1] if "-i" in args[:-1] else None
        print(gpu_depth.nvlink(hw, args[1:], _selected_gpus(hw, ids)), end="")
        return 0
    options: dict[str, str | None] = {}
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg.startswith("--") and "=" in arg:
            key, value = arg.split("=", 1)
            options[key] = value
        elif arg in ("-i", "--id", "-d", "--display", "-pm", "--persistence-mode") and rest:
            options[{"--id": "-i", "--display": "-d", "--persistence-mode": "-pm"}.get(arg, arg)] = rest.pop(0)
        elif arg.startswith("-i") and len(arg) > 2:
            options["-i"] = arg[2:]
        else:
            options[arg] = None
    gpus = _selected_gpus(hw, options.get("-i") or options.get("--id"))
    if "-r" in options or "--gpu-reset" in options:
        return gpu_reset.reset(hw, gpus, SIM_RUN_DIR)
    if "-pm" in options:
        return gpu_reset.persistence(hw, gpus, options["-pm"] or "", SIM_RUN_DIR)
    if "--query-gpu" in options:
        fields = [f.strip() for f in (options["--query-gpu"] or "").split(",") if f.strip()]
        fmt = {f.strip() for f in (options.get("--format") or "").split(",")}
        print(query_gpu(hw, fields, fmt, gpus), end="")
        return 0
    if "-q" in options or "--query" in options:
        display = options.get("-d")
        displays = {d.strip().upper() for d in display.split(",")} if display else None
        print(query(hw, displays, gpus), end="")
        return 0
    if "-L" in options or "--list-gpus" in options:
        print(list_gpus(hw), end="")
        return 0
    if not options or set(options) <= {"-i"}:
        print(summary(hw), end="")
        return 0
    raise StubUsageError(f"options not simulated: {' '.join(args)}")
