"""CPU tools: ``lscpu`` (util-linux 2.37, flat layout as printed to a pipe), ``numactl -H`` (numactl 2.0.14)
and ``cpupower idle-info`` (linux tools/power/cpupower), all generated from the host's CPUs and C-states.
"""

from __future__ import annotations

from sim.hosts.hardware import Hardware, cpulist
from sim.hosts.stubs.main import StubUsageError
from sim.hosts.sysfs import _CSTATE_INFO


def lscpu(hw: Hardware, args: list[str]) -> int:
    if args and args != ["-e"] and not all(a in ("--all",) for a in args):
        raise StubUsageError(f"only plain lscpu is simulated (got {' '.join(args)!r})")
    cores = hw.sockets * hw.cores_per_socket
    intel = hw.cpu_vendor == "GenuineIntel"
    rows = [
        ("Architecture", "x86_64"),
        ("CPU op-mode(s)", "32-bit, 64-bit"),
        ("Address sizes", "46 bits physical, 57 bits virtual" if intel else "43 bits physical, 48 bits virtual"),
        ("Byte Order", "Little Endian"),
        ("CPU(s)", str(hw.vcpus)),
        ("On-line CPU(s) list", f"0-{hw.vcpus - 1}"),
        ("Vendor ID", hw.cpu_vendor),
        ("Model name", hw.cpu_model),
        ("CPU family", str(hw.cpu_family)),
        ("Model", str(hw.cpu_model_number)),
        ("Thread(s) per core", str(hw.threads_per_core)),
        ("Core(s) per socket", str(hw.cores_per_socket)),
        ("Socket(s)", str(hw.sockets)),
        ("Stepping", str(hw.cpu_stepping)),
        ("CPU max MHz", "3800.0000" if intel else "3400.0000"),
        ("CPU min MHz", "800.0000" if intel else "1500.0000"),
        ("BogoMIPS", f"{hw.cpu_mhz * 2:.2f}"),
        ("Virtualization", "VT-x" if intel else "AMD-V"),
        ("L1d cache", f"{cores * 48 // 1024} MiB ({cores} instances)"),
        ("L1i cache", f"{cores * 32 // 1024} MiB ({cores} instances)"),
        ("L2 cache", f"{cores * 2} MiB ({cores} instances)"),
        ("L3 cache", f"{105 * hw.sockets} MiB ({hw.sockets} instances)"),
        ("NUMA node(s)", str(len([n for n in hw.numa if n.cpus]))),
    ]
    rows += [(f"NUMA node{n.id} CPU(s)", cpulist(n.cpus)) for n in hw.numa if n.cpus]
    rows += [
        ("Vulnerability Itlb multihit", "Not affected"),
        ("Vulnerability L1tf", "Not affected"),
        ("Vulnerability Mds", "Not affected"),
        ("Vulnerability Meltdown", "Not affected"),
        ("Vulnerability Spec store bypass", "Mitigation; Speculative Store Bypass disabled via prctl and seccomp"),
        ("Vulnerability Spectre v1", "Mitigation; usercopy/swapgs barriers and __user pointer sanitization"),
    ]
    width = max(len(key) for key, _ in rows) + 2
    print("".join(f"{key + ':':<{width}}{value}\n" for key, value in rows), end="")
    return 0


def numactl(hw: Hardware, args: list[str]) -> int:
    if not set(args) & {"-H", "--hardware"}:
        raise StubUsageError("only numactl -H (--hardware) is simulated")
    nodes = hw.numa
    out = [f"available: {len(nodes)} nodes (0-{len(nodes) - 1})"]
    for node in nodes:
        mb = node.memory_gib * 1024 - 3900 * (node.id + 1)  # the kernel keeps a little of every node
        out.append(f"node {node.id} cpus: {' '.join(str(c) for c in node.cpus)}".rstrip())
        out.append(f"node {node.id} size: {mb} MB")
        out.append(f"node {node.id} free: {mb * 97 // 100} MB")
    # numactl.c print_distances(): "node " then "% 3d " per node; rows "% 3d: " then "% 3d " per distance.
    out.append("node distances:")
    out.append("node " + "".join(f"{n.id:3d} " for n in nodes))
    for node in nodes:
        out.append(f"{node.id:3d}: " + "".join(f"{10 if o.id == node.id else 21:3d} " for o in nodes))
    print("\n".join(out))
    return 0


def cpupower(hw: Hardware, args: list[str]) -> int:
    if not args or args[0] not in ("idle-info", "-c") and "idle-info" not in args:
        raise StubUsageError("only cpupower idle-info is simulated")
    intel = hw.cpu_vendor == "GenuineIntel"
    out = [
        f"CPUidle driver: {'intel_idle' if intel else 'acpi_idle'}",
        "CPUidle governor: menu",
        "analyzing CPU 0:",
        "",
        f"Number of idle states: {len(hw.cstates)}",
        f"Available idle states: {' '.join(hw.cstates)}",
    ]
    for index, name in enumerate(hw.cstates):
        desc, latency, _ = _CSTATE_INFO.get(name, (name, 10, 10))
        disabled = hw.cstates_disabled and name not in ("POLL", "C1")
        out += [
            f"{name} (DISABLED) :" if disabled else f"{name}:",
            f"Flags/Description: {desc}",
            f"Latency: {latency}",
            f"Usage: {0 if disabled else 1000 + index}",
            f"Duration: {0 if disabled else 250000 + 911 * index}",
        ]
    print("\n".join(out))
    return 0
