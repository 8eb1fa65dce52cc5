"""The simulated /sys, /proc and /etc identity files of one host, generated from its hardware description.

Functions here return ``{relative path: content}`` maps (content is text, or :class:`Link` for a symlink);
:func:`write_tree` puts one on disk. :mod:`sim.hosts.machines` then binds the trees over the
real paths inside the host's machine:

==============================  ===============================================================
``cpu``                         /sys/devices/system/cpu (online, present, cpuN/cpuidle/stateK, topology)
``node``                        /sys/devices/system/node (nodeN/cpulist, cpumap, meminfo, distance)
``class``                       merged over /sys/class: infiniband/<dev>/ports/<n>/..., net/<if>/ecn/...
``pci``                         merged over /sys/bus/pci/devices: GPUs (0x10de) and HCAs (0x15b3)
``virtual``                     merged over /sys/devices/virtual: dmi/id (vendor, product)
``proc``                        /proc/cpuinfo, /proc/meminfo, /proc/cmdline
``etc``                         /etc/os-release, lsb-release, debian_version, hostname (overlay upper)
==============================  ===============================================================

Formats follow the kernel's (Documentation/ABI/testing/sysfs-devices-system-cpu, sysfs-class-infiniband,
drivers/net/ethernet/mellanox/mlx5 ECN attributes, fs/proc/meminfo.c, arch/x86/kernel/cpu/proc.c).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from sim.hosts.hardware import Hardware, Hca, cpulist

Tree = dict[str, "str | Link"]


@dataclass(frozen=True)
class Link:
    target: str


# intel_idle states on Sapphire Rapids (drivers/idle/intel_idle.c, spr_cstates): name, desc, latency, residency.
_CSTATE_INFO = {
    "POLL": ("CPUIDLE CORE POLL IDLE", 0, 0),
    "C1": ("MWAIT 0x00", 1, 1),
    "C1E": ("MWAIT 0x01", 2, 4),
    "C6": ("MWAIT 0x20", 290, 800),
    "C2": ("ACPI IO 0x414", 400, 800),
}
# IB rate strings as the kernel prints them (drivers/infiniband/core/sysfs.c rate_show).
_IB_RATE = {
    400: "400 Gb/sec (4X NDR)",
    200: "200 Gb/sec (4X HDR)",
    100: "100 Gb/sec (4X EDR)",
    56: "56 Gb/sec (4X FDR)",
    50: "50 Gb/sec (1X NDR)",
    25: "25 Gb/sec (1X EDR)",
}
# ethtool-style RoCE rates are shown by the same ib sysfs file with these widths.
_ROCE_RATE = {400: "400 Gb/sec (4X NDR)", 200: "200 Gb/sec (4X HDR)", 100: "100 Gb/sec (4X EDR)"}
_IB_STATE = {"Active": "4: ACTIVE", "Down": "1: DOWN", "Initializing": "2: INIT", "Armed": "3: ARMED"}
_IB_PHYS = {"LinkUp": "5: LinkUp", "Disabled": "3: Disabled", "Polling": "2: Polling"}


def ib_rate_text(rate_gbps: int) -> str:
    return _IB_RATE.get(rate_gbps, f"{rate_gbps} Gb/sec (4X)")


def cpu_tree(hw: Hardware) -> Tree:
    n = hw.vcpus
    tree: Tree = {
        "online": f"0-{n - 1}\n",
        "possible": f"0-{n - 1}\n",
        "present": f"0-{n - 1}\n",
        "offline": "\n",
        "kernel_max": "8191\n",
        "smt/active": "1\n" if hw.threads_per_core > 1 else "0\n",
        "smt/control": "on\n",
        "cpuidle/current_driver": "intel_idle\n" if hw.cpu_vendor == "GenuineIntel" else "acpi_idle\n",
        "cpuidle/current_governor": "menu\n",
        "cpuidle/current_governor_ro": "menu\n",
    }
    physical = hw.sockets * hw.cores_per_socket
    for cpu in range(n):
        core = cpu % physical
        socket = core // hw.cores_per_socket
        siblings = [core + t * physical for t in range(hw.threads_per_core)]
        base = f"cpu{cpu}"
        tree[f"{base}/online"] = "1\n"
        tree[f"{base}/topology/physical_package_id"] = f"{socket}\n"
        tree[f"{base}/topology/die_id"] = "0\n"
        tree[f"{base}/topology/core_id"] = f"{core % hw.cores_per_socket}\n"
        tree[f"{base}/topology/thread_siblings_list"] = cpulist(siblings) + "\n"
        tree[f"{base}/topology/core_siblings_list"] = cpulist(hw.numa[socket].cpus) + "\n"
        if cpu > 0:
            # Every CPU has the same idle states; one directory (cpu0's) holds them and the others link to
            # it, so globbing cpu*/cpuidle/state*/ reads the same values for 1/6th of the files.
            tree[f"{base}/cpuidle"] = Link("../cpu0/cpuidle")
            continue
        for index, name in enumerate(hw.cstates):
            desc, latency, residency = _CSTATE_INFO.get(name, (name, 10, 10))
            # Provisioned hosts disable every state deeper than C1 (what intel_idle.max_cstate=0 +
            # processor.max_cstate=1 or `cpupower idle-set -D 2` leave behind).
            disabled = hw.cstates_disabled and name not in ("POLL", "C1")
            state = f"{base}/cpuidle/state{index}"
            tree[f"{state}/name"] = f"{name}\n"
            tree[f"{state}/desc"] = f"{desc}\n"
            tree[f"{state}/latency"] = f"{latency}\n"
            tree[f"{state}/residency"] = f"{residency}\n"
            tree[f"{state}/disable"] = "1\n" if disabled else "0\n"
            tree[f"{state}/default_status"] = "enabled\n"
            tree[f"{state}/usage"] = "0\n" if disabled else f"{1000 + 37 * index}\n"
            tree[f"{state}/time"] = "0\n" if disabled else f"{250000 + 911 * index}\n"
    return tree


def node_tree(hw: Hardware) -> Tree:
    nodes = [node for node in hw.numa]
    with_cpus = [node.id for node in nodes if node.cpus]
    tree: Tree = {
        "online": cpulist([node.id for node in nodes]) + "\n",
        "possible": cpulist([node.id for node in nodes]) + "\n",
        "has_cpu": cpulist(with_cpus) + "\n",
        "has_memory": cpulist([node.id for node in nodes if node.memory_gib]) + "\n",
        "has_normal_memory": cpulist([node.id for node in nodes if node.memory_gib]) + "\n",
    }
    for node in nodes:
        kb = node.memory_gib * 1024 * 1024
        used = kb // 50
        distances = " ".join("10" if other.id == node.id else "21" for other in nodes)
        tree[f"node{node.id}/cpulist"] = cpulist(node.cpus) + "\n"
        tree[f"node{node.id}/cpumap"] = cpumask(node.cpus, hw.vcpus) + "\n"
        tree[f"node{node.id}/distance"] = distances + "\n"
        tree[f"node{node.id}/meminfo"] = (
            f"Node {node.id} MemTotal:       {kb:>10} kB\n"
            f"Node {node.id} MemFree:        {kb - used:>10} kB\n"
            f"Node {node.id} MemUsed:        {used:>10} kB\n"
        )
        for cpu in node.cpus:
            tree[f"node{node.id}/cpu{cpu}"] = Link(f"../../cpu/cpu{cpu}")
    return tree


def cpumask(cpus: list[int], total: int) -> str:
    """Kernel cpumask format: comma-separated 32-bit hex words, most significant first."""
    mask = 0
    for cpu in cpus:
        mask |= 1 << cpu
    words = (total + 31) // 32
    return ",".join(f"{(mask >> (32 * w)) & 0xFFFFFFFF:08x}" for w in reversed(range(words)))


def _pci_device(hw: Hardware, vendor: str, device: str, pci_class: str, numa_node: int, speed: str) -> Tree:
    node = next((n for n in hw.numa if n.id == numa_node), None)
    cpus = node.cpus if node else []
    return {
        "vendor": f"{vendor}\n",
        "device": f"{device}\n",
        "class": f"{pci_class}\n",
        "numa_node": f"{numa_node}\n",
        "local_cpulist": cpulist(cpus) + "\n",
        "local_cpus": cpumask(cpus, hw.vcpus) + "\n",
        "current_link_speed": f"{speed}\n",
        "current_link_width": "16\n",
        "max_link_speed": f"{speed}\n",
        "max_link_width": "16\n",
    }


def pci_tree(hw: Hardware) -> Tree:
    tree: Tree = {}
    pcie5 = "32.0 GT/s PCIe"
    for gpu in hw.gpus:
        for name, value in _pci_device(hw, "0x10de", hw.gpu_pci_device_id, "0x030200", gpu.numa_node, pcie5).items():
            tree[f"{gpu.sysfs_address}/{name}"] = value
    for hca in hw.hcas:
        # ConnectX-7 (0x1021); class 0x020700 = InfiniBand controller, 0x020000 = Ethernet (RoCE).
        pci_class = "0x020700" if hca.link_layer == "infiniband" else "0x020000"
        for name, value in _pci_device(hw, "0x15b3", "0x1021", pci_class, hca.numa_node, pcie5).items():
            tree[f"{hca.bus_id}/{name}"] = value
        tree[f"{hca.bus_id}/infiniband/{hca.device}"] = Link(f"/sys/class/infiniband/{hca.device}")
        tree[f"{hca.bus_id}/net/{hca.netdev}"] = Link(f"/sys/class/net/{hca.netdev}")
    return tree


def _guid_text(guid: str) -> str:
    return ":".join(guid[i : i + 4] for i in range(0, 16, 4))


def _port_tree(hca: Hca) -> Tree:
    port = f"ports/{hca.port}"
    active = hca.state == "Active"
    if not active:
        rate = "10 Gb/sec (4X SDR)"  # a port without a link reports the lowest rate
    elif hca.link_layer == "infiniband":
        rate = ib_rate_text(hca.rate_gbps)
    else:
        rate = _ROCE_RATE.get(hca.rate_gbps, ib_rate_text(hca.rate_gbps))
    tree: Tree = {
        f"{port}/state": _IB_STATE.get(hca.state, "1: DOWN") + "\n",
        f"{port}/phys_state": _IB_PHYS.get(hca.phys_state, "3: Disabled") + "\n",
        f"{port}/rate": rate + "\n",
        f"{port}/link_layer": ("InfiniBand" if hca.link_layer == "infiniband" else "Ethernet") + "\n",
        f"{port}/lid": (f"0x{hca.lid:x}" if hca.link_layer == "infiniband" else "0x0") + "\n",
        f"{port}/sm_lid": ("0x1" if hca.link_layer == "infiniband" else "0x0") + "\n",
        f"{port}/lid_mask_count": "0\n",
        f"{port}/cap_mask": "0xa751e848\n",
        f"{port}/gids/0": "fe80:0000:0000:0000:" + _guid_text(hca.guid) + "\n",
    }
    # Counters (Documentation/ABI/stable/sysfs-class-infiniband): healthy links have no errors.
    counters = {
        "symbol_error": 0, "link_error_recovery": 0, "link_downed": 0 if active else 1,
        "port_rcv_errors": 0, "port_xmit_discards": 0, "local_link_integrity_errors": 0,
        "excessive_buffer_overrun_errors": 0, "port_rcv_data": 918273645, "port_xmit_data": 918270012,
        "port_rcv_packets": 3141592, "port_xmit_packets": 3141577,
    }
    for name, value in counters.items():
        tree[f"{port}/counters/{name}"] = f"{value}\n"
    return tree


def class_tree(hw: Hardware) -> Tree:
    tree: Tree = {}
    for hca in hw.hcas:
        ib = f"infiniband/{hca.device}"
        tree[f"{ib}/device"] = Link(f"/sys/bus/pci/devices/{hca.bus_id}")
        tree[f"{ib}/fw_ver"] = f"{hw.hca_fw_version}\n"
        tree[f"{ib}/hca_type"] = f"{hw.hca_ca_type}\n"
        tree[f"{ib}/board_id"] = f"{hw.hca_board_id}\n"
        tree[f"{ib}/node_guid"] = _guid_text(hca.guid) + "\n"
        tree[f"{ib}/sys_image_guid"] = _guid_text(hca.guid) + "\n"
        tree[f"{ib}/node_type"] = "1: CA\n"
        for name, value in _port_tree(hca).items():
            tree[f"{ib}/{name}"] = value
        net = f"net/{hca.netdev}"
        up = hca.state == "Active"
        tree[f"{net}/device"] = Link(f"/sys/bus/pci/devices/{hca.bus_id}")
        tree[f"{net}/operstate"] = ("up" if up else "down") + "\n"
        tree[f"{net}/carrier"] = ("1" if up else "0") + "\n"
        tree[f"{net}/mtu"] = ("4092" if hca.link_layer == "infiniband" else "9000") + "\n"
        tree[f"{net}/type"] = ("32" if hca.link_layer == "infiniband" else "1") + "\n"  # ARPHRD_INFINIBAND / ETHER
        tree[f"{net}/speed"] = (str(hca.rate_gbps * 1000) if up else "-1") + "\n"
        if hca.link_layer == "ethernet":
            # mlx5 ECN knobs (drivers/net/ethernet/mellanox/mlx5, "ecn" sysfs): DCQCN notification point
            # and reaction point, one enable file per priority.
            for role in ("roce_np", "roce_rp"):
                for prio in range(8):
                    tree[f"{net}/ecn/{role}/enable/{prio}"] = ("1" if hca.dcqcn else "0") + "\n"
    tree["dmi"] = Link("/sys/devices/virtual/dmi")
    return tree


def virtual_tree(hw: Hardware) -> Tree:
    return {
        "dmi/id/sys_vendor": f"{hw.sys_vendor}\n",
        "dmi/id/product_name": f"{hw.product_name}\n",
        "dmi/id/product_version": "Not Specified\n",
        "dmi/id/board_vendor": f"{hw.sys_vendor}\n",
        "dmi/id/chassis_vendor": f"{hw.sys_vendor}\n",
        "dmi/id/bios_vendor": f"{hw.sys_vendor}\n",
        "dmi/id/bios_version": "2.1\n",
        "dmi/id/bios_date": "03/12/2024\n",
        "dmi/id/chassis_type": "23\n",  # rack mount chassis
    }


def cpuinfo(hw: Hardware) -> str:
    """/proc/cpuinfo as arch/x86/kernel/cpu/proc.c prints it (one block per logical CPU)."""
    common = (
        "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
        "syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid aperfmperf pni "
        "pclmulqdq monitor ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand lahf_lm "
        "abm 3dnowprefetch"
    )
    if hw.cpu_vendor == "GenuineIntel":  # Sapphire Rapids additions (AVX-512, AMX)
        flags = common + (
            " dts acpi ss tm pbe art arch_perfmon pebs bts tsc_known_freq dtes64 ds_cpl vmx smx est tm2 sdbg "
            "xtpr pdcm pcid dca tsc_deadline_timer avx512f avx512dq rdseed adx smap avx512ifma clflushopt clwb "
            "avx512cd sha_ni avx512bw avx512vl avx512_bf16 amx_bf16 amx_tile amx_int8"
        )
    else:  # EPYC Rome additions
        flags = common + (
            " mmxext fxsr_opt extd_apicid cmp_legacy svm extapic cr8_legacy sse4a misalignsse osvw ibs skinit "
            "wdt tce topoext perfctr_core perfctr_nb bpext perfctr_llc mwaitx cpb cat_l3 cdp_l3 rdseed adx smap "
            "clflushopt clwb sha_ni xsaveopt xsavec xgetbv1 clzero irperf xsaveerptr rdpru wbnoinvd"
        )
    intel = hw.cpu_vendor == "GenuineIntel"
    address_sizes = "46 bits physical, 57 bits virtual" if intel else "43 bits physical, 48 bits virtual"
    microcode = "0x2b0004d0" if intel else "0x830107a"
    physical = hw.sockets * hw.cores_per_socket
    blocks = []
    for cpu in range(hw.vcpus):
        core = cpu % physical
        socket = core // hw.cores_per_socket
        core_id = core % hw.cores_per_socket
        blocks.append(
            f"processor\t: {cpu}\n"
            f"vendor_id\t: {hw.cpu_vendor}\n"
            f"cpu family\t: {hw.cpu_family}\n"
            f"model\t\t: {hw.cpu_model_number}\n"
            f"model name\t: {hw.cpu_model}\n"
            f"stepping\t: {hw.cpu_stepping}\n"
            f"microcode\t: {microcode}\n"
            f"cpu MHz\t\t: {hw.cpu_mhz:.3f}\n"
            f"cache size\t: {107520 if intel else 512} KB\n"
            f"physical id\t: {socket}\n"
            f"siblings\t: {hw.cores_per_socket * hw.threads_per_core}\n"
            f"core id\t\t: {core_id}\n"
            f"cpu cores\t: {hw.cores_per_socket}\n"
            f"apicid\t\t: {socket * 128 + core_id * 2 + cpu // physical}\n"
            f"initial apicid\t: {socket * 128 + core_id * 2 + cpu // physical}\n"
            f"fpu\t\t: yes\n"
            f"fpu_exception\t: yes\n"
            f"cpuid level\t: 32\n"
            f"wp\t\t: yes\n"
            f"flags\t\t: {flags}\n"
            f"bogomips\t: {hw.cpu_mhz * 2:.2f}\n"
            f"clflush size\t: 64\n"
            f"cache_alignment\t: 64\n"
            f"address sizes\t: {address_sizes}\n"
            f"power management:\n"
        )
    return "\n".join(blocks) + "\n"


def meminfo(hw: Hardware) -> str:
    """/proc/meminfo (fs/proc/meminfo.c layout: name padded to 16 columns, value right-aligned in 8)."""
    total = hw.memory_gib * 1024 * 1024 - 16 * 1024 * 1024  # firmware/kernel reserved
    rows = [
        ("MemTotal", total), ("MemFree", total * 96 // 100), ("MemAvailable", total * 97 // 100),
        ("Buffers", 412_344), ("Cached", 9_876_544), ("SwapCached", 0), ("Active", 5_433_120),
        ("Inactive", 6_012_332), ("SwapTotal", 0), ("SwapFree", 0), ("Dirty", 128), ("Writeback", 0),
        ("AnonPages", 1_203_880), ("Mapped", 612_004), ("Shmem", 40_112), ("Slab", 3_112_448),
        ("CommitLimit", total // 2), ("Committed_AS", 4_120_332), ("VmallocTotal", 13_743_895_347_199),
        ("HugePages_Total", 0), ("HugePages_Free", 0), ("Hugepagesize", 2048),
    ]
    lines = []
    for name, value in rows:
        unit = "" if name.startswith("HugePages_") else " kB"
        lines.append(f"{name + ':':<16}{value:>8}{unit}")
    return "\n".join(lines) + "\n"


def etc_files(hw: Hardware) -> Tree:
    os_ = hw.os
    return {
        "os-release": (
            f'PRETTY_NAME="{os_["pretty_name"]}"\nNAME="{os_["name"]}"\nVERSION_ID="{os_["version_id"]}"\n'
            f'VERSION="{os_["version"]}"\nVERSION_CODENAME={os_["version_codename"]}\nID={os_["id"]}\n'
            f"ID_LIKE=debian\nHOME_URL=\"https://www.ubuntu.com/\"\n"
            f"UBUNTU_CODENAME={os_['version_codename']}\n"
        ),
        "lsb-release": (
            f"DISTRIB_ID={os_['name']}\nDISTRIB_RELEASE={os_['version_id']}\n"
            f"DISTRIB_CODENAME={os_['version_codename']}\nDISTRIB_DESCRIPTION=\"{os_['pretty_name']}\"\n"
        ),
        "debian_version": "bookworm/sid\n",
        "hostname": f"{hw.host}\n",
    }


def proc_files(hw: Hardware) -> Tree:
    return {"cpuinfo": cpuinfo(hw), "meminfo": meminfo(hw), "cmdline": hw.kernel_cmdline + "\n"}


def write_tree(root: Path, tree: Tree) -> None:
    made: set[str] = set()
    base = str(root)
    for rel, content in tree.items():
        path = f"{base}/{rel}"
        parent = os.path.dirname(path)
        if parent not in made:
            os.makedirs(parent, exist_ok=True)
            made.add(parent)
        if isinstance(content, Link):
            os.symlink(content.target, path)
        else:
            with open(path, "w") as f:
                f.write(content)


def write_cached_tree(cache: Path, kind: str, tree: Tree) -> Path:
    """Write a tree once per distinct content (most hosts share the big cpu tree) and return its dir."""
    digest = hashlib.sha256(
        json.dumps({k: (v.target if isinstance(v, Link) else v) for k, v in tree.items()}, sort_keys=True).encode()
    ).hexdigest()[:16]
    final = cache / f"{kind}-{digest}"
    if not final.exists():
        partial = cache / f".{kind}-{digest}.{os.getpid()}"
        write_tree(partial, tree)
        os.replace(partial, final)
    return final
