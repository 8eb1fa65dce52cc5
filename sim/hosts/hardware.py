"""The hardware a simulated host pretends to have, resolved from inventory variables.

A simulated host is described by ``sim_hardware`` (host or group variable). Inventories state only what
differs from the per-GPU-generation defaults below; the cluster model's own variables (``gpu_count``,
``gpu_numa_nodes``, ``rdma_nics``) are reused so the simulated board always matches what the inventory
says the node is. Faults (:mod:`sim.hosts.faults`) are applied on top of the resolved description.

``sim_hardware`` keys (all optional)::

    gpu_name, gpu_memory_mib, gpu_power_limit_w, gpu_bus_ids: [..]       GPU board
    nvlink_links: 18                                                      NV# between every GPU pair
    cpu_model, sockets, cores_per_socket, threads_per_core, cpu_mhz       CPUs (vCPUs = product)
    memory_gib, os: {id, version_id, version_codename, pretty_name}, kernel
    kernel_cmdline                                                        /proc/cmdline
    hca: {rate_gbps, lid_base, fw_version, board_id}                      defaults for every HCA
    ib_latency_us, ib_bw_gbps                                             ib_write_lat / ib_write_bw
    nccl_busbw_gbs: {8: 480, 4: 365}                                      all_reduce_perf bus bandwidth
    clock_offset_us                                                       chronyc tracking
    secure_boot                                                           mokutil --sb-state; DKMS module refused at boot
    versions: {driver, cuda, nccl, ofed, fabric_manager}                  what the tools report
    product_name, sys_vendor                                              DMI

Values and sources (the defaults are the HGX/DGX H100 reference board):

* DGX H100: 2x Intel Xeon Platinum 8480C (56 cores); HGX partner boards commonly ship the Platinum 8468
  (48 cores, 2.1 GHz base). 2 TiB DDR5. NVIDIA DGX H100 User Guide, "Hardware Overview".
* GPU PCI bus IDs 18/2A/3A/5D/9A/AB/BA/DB: `nvidia-smi` on a Supermicro SYS-821GE-TNHR HGX H100 board
  (NVIDIA/nccl#1264, driver 550.54.15; the same IDs in thamada/nvidia-smi's H100 SXM x8 capture). HCA
  PCI addresses come from their predictable netdev names (ibp<bus>s<slot>, bus in decimal).
* NVLink4: 18 links per H100 SXM through NVSwitch, `topo -m` prints NV18 for every pair (H100 datasheet:
  900 GB/s = 18 x 50 GB/s). A100 SXM4: 12 NVLink3 links, NV12.
* ConnectX-7 NDR 400 Gb/s (IB rate "400 (4X NDR)"). ib_write_bw ~382 Gb/s: Azure's health checks
  require >= 375 Gb/s per NDR port on ND H100 v5 (Azure/azurehpc-health-checks conf/nd96isr_h100_v5.conf,
  ``check_ib_bw_gdr 375``) and >= 185 Gb/s per HDR port on ND A100 v4 (conf/nd96amsr_a100_v4.conf).
  ib_write_lat ~1.07 us for 2-byte writes; NVIDIA's ngc_multinode_perf fails a write latency test only
  above 2.5 us (Mellanox/ngc_multinode_perf#97), so 25 us is a clear ``ib_high_latency``.
* nccl-tests all_reduce_perf bus bandwidth: ~480 GB/s for 8x H100 SXM at large sizes (Azure requires
  >= 460 GB/s at 16 GB, ``check_nccl_allreduce 460.0``); ~236 GB/s for 8x A100 SXM (Azure: >= 228).
  The 4-GPU value (~365 GB/s, fewer NVLink peers per ring) is the project's reference figure, not a
  published measurement.
* chrony on a LAN with a local NTP server: offsets of tens of microseconds (chrony FAQ, "How accurate
  is chrony").
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The kernel cpulist format (0-47,96-143) has one implementation, production's: sim may import production.
from preflight.parsers.cpulist import format_cpus as cpulist  # noqa: F401 -- re-exported to the stubs

# Per GPU generation: what an 8-GPU HGX board of that generation reports. Inventories override any key.
GENERATION_DEFAULTS: dict[str, dict[str, Any]] = {
    "h100-sxm": {
        "gpu_name": "NVIDIA H100 80GB HBM3",
        "gpu_product_brand": "NVIDIA",
        "gpu_architecture": "Hopper",
        "gpu_memory_mib": 81559,
        "gpu_power_limit_w": 700,
        "gpu_bus_ids": ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"],
        "gpu_pci_device_id": "0x2330",
        "nvlink_links": 18,
        "cpu_model": "Intel(R) Xeon(R) Platinum 8468",
        "cpu_vendor": "GenuineIntel",
        "cpu_family": 6,
        "cpu_model_number": 143,  # Sapphire Rapids
        "cpu_stepping": 8,
        "cpu_mhz": 2100.0,
        "sockets": 2,
        "cores_per_socket": 48,
        "threads_per_core": 2,
        "cstates": ["POLL", "C1", "C1E", "C6"],  # intel_idle states on Sapphire Rapids
        "memory_gib": 2048,
        "hca": {"rate_gbps": 400, "fw_version": "28.39.1002", "board_id": "MT_0000000838", "ca_type": "MT4129"},
        "ib_latency_us": 1.07,
        "ib_bw_gbps": 382.0,
        "nccl_busbw_gbs": {8: 480.0, 4: 365.0, 2: 300.0, 1: 0.0},
        "versions": {
            "driver": "550.90.07",
            "cuda": "12.4",
            "nccl": "2.21.5",
            "ofed": "MLNX_OFED_LINUX-23.10-1.1.9.0",
            "fabric_manager": "550.90.07",
        },
        "product_name": "SYS-821GE-TNHR",
        "sys_vendor": "Supermicro",
    },
    "h200-sxm": {
        "gpu_name": "NVIDIA H200",
        "gpu_memory_mib": 143771,
        "gpu_pci_device_id": "0x2335",
        "versions": {
            "driver": "550.127.05",
            "cuda": "12.4",
            "nccl": "2.21.5",
            "ofed": "MLNX_OFED_LINUX-24.04-0.7.0.0",
            "fabric_manager": "550.127.05",
        },
    },
    "a100-sxm": {
        "gpu_name": "NVIDIA A100-SXM4-80GB",
        "gpu_architecture": "Ampere",
        "gpu_memory_mib": 81920,
        "gpu_power_limit_w": 400,
        "gpu_bus_ids": ["07", "0F", "47", "4E", "87", "90", "B7", "BD"],
        "gpu_pci_device_id": "0x20b2",
        "nvlink_links": 12,
        "cpu_model": "AMD EPYC 7742 64-Core Processor",
        "cpu_vendor": "AuthenticAMD",
        "cpu_family": 23,
        "cpu_model_number": 49,
        "cpu_stepping": 0,
        "cpu_mhz": 2250.0,
        "cores_per_socket": 64,
        "cstates": ["POLL", "C1", "C2"],  # acpi_idle on EPYC Rome
        "hca": {"rate_gbps": 200, "fw_version": "20.39.1002", "board_id": "MT_0000000223", "ca_type": "MT4123"},
        "ib_latency_us": 1.12,
        "ib_bw_gbps": 191.0,
        "nccl_busbw_gbs": {8: 236.0, 4: 180.0, 2: 150.0, 1: 0.0},
        "versions": {
            "driver": "535.183.01",
            "cuda": "12.2",
            "nccl": "2.19.3",
            "ofed": "MLNX_OFED_LINUX-23.10-1.1.9.0",
            "fabric_manager": "535.183.01",
        },
        "product_name": "DGXA100",
        "sys_vendor": "NVIDIA",
    },
}
COMMON_DEFAULTS: dict[str, Any] = {
    "os": {
        "id": "ubuntu",
        "name": "Ubuntu",
        "version_id": "22.04",
        "version": "22.04.4 LTS (Jammy Jellyfish)",
        "version_codename": "jammy",
        "pretty_name": "Ubuntu 22.04.4 LTS",
    },
    "kernel": "5.15.0-113-generic",
    # The provisioned state: C-states limited on the kernel command line, IOMMU passthrough for GPUDirect.
    "kernel_cmdline": (
        "BOOT_IMAGE=/vmlinuz-5.15.0-113-generic root=/dev/mapper/vg0-root ro "
        "intel_idle.max_cstate=0 processor.max_cstate=1 intel_iommu=on iommu=pt pci=realloc=off"
    ),
    "clock_offset_us": 18.0,
    "clock_source": "127.0.9.123",  # a loopback NTP server name: nothing here talks to private ranges
    "sim_command_delay_s": 0.0,
    "secure_boot": False,  # firmware Secure Boot; the machines' DKMS key is never enrolled (no console)
}

_IB_NETDEV = re.compile(r"^ib[ps](\d+)s(\d+)")  # predictable names: ibp<bus>s<slot>, decimal
_EN_NETDEV = re.compile(r"^en[ps](\d+)s(\d+)")


@dataclass
class Gpu:
    index: int
    bus_id: str  # nvidia-smi form: 00000000:1B:00.0
    numa_node: int
    uuid: str
    serial: str
    ecc_uncorrectable: int = 0  # volatile double-bit errors
    retired_pending: bool = False
    row_remap_pending: bool = False
    xid_events: list[int] = field(default_factory=list)
    lost: bool = False  # fallen off the bus (XID 79): nvidia-smi cannot get its handle
    # nvidia-persistenced runs on an HGX node (roles/nvidia_stack): Enabled, and a client of the GPU for a reset
    persistence_mode: bool = True
    reset_supported: bool = True  # False: nvidia-smi --gpu-reset answers Not Supported for it
    fabric_reset_at: float | None = None  # unix s of its last nvidia-smi -r: its fabric registration restarts
    # Preflight depth (stubs/gpu_depth.py): PCIe link as trained, NVLink state/error growth, clock events,
    # nvbandwidth values (None: the architecture's reference value), a failing DCGM test.
    pcie_gen: int = 5
    pcie_width: int = 16
    nvlink_inactive: list[int] = field(default_factory=list)
    nvlink_error_rates: dict[str, dict[str, float]] = field(default_factory=dict)  # link -> counter -> per s
    clock_events: list[str] = field(default_factory=list)  # active reasons as nvidia-smi names them
    h2d_gbps: float | None = None
    d2h_gbps: float | None = None
    d2d_gbps: float | None = None
    dcgm_fail: str | None = None

    @property
    def sysfs_address(self) -> str:  # 0000:1b:00.0
        return self.bus_id[4:].lower()


@dataclass
class Hca:
    device: str
    netdev: str
    port: int
    link_layer: str  # infiniband | ethernet
    rate_gbps: int
    numa_node: int
    gpu: int | None
    bus_id: str  # 0000:18:00.0
    lid: int
    guid: str
    state: str = "Active"  # ibstat wording: Active | Down | Initializing
    phys_state: str = "LinkUp"  # LinkUp | Disabled | Polling
    latency_us: float = 1.07
    bw_gbps: float = 382.0
    dcqcn: bool = True  # ECN roce_np / roce_rp enabled (RoCE only)
    flaps: int = 0  # link-down/up pairs in the kernel log of the last hours (ib_link_flaps)


@dataclass
class NumaNode:
    id: int
    cpus: list[int]
    memory_gib: int


@dataclass
class Hardware:
    host: str
    gpu_model: str
    gpu_name: str
    gpu_architecture: str
    gpu_memory_mib: int
    gpu_power_limit_w: int
    gpu_pci_device_id: str
    gpus: list[Gpu]
    nvlink: dict[str, int]  # "a-b" (a < b) -> NVLink count; 0 = no NVLink, traffic over PCIe
    cpu_model: str
    cpu_vendor: str
    cpu_family: int
    cpu_model_number: int
    cpu_stepping: int
    cpu_mhz: float
    sockets: int
    cores_per_socket: int
    threads_per_core: int
    cstates: list[str]
    cstates_disabled: bool
    numa: list[NumaNode]
    memory_gib: int
    hcas: list[Hca]
    nccl_busbw_gbs: dict[int, float]
    nccl_wrong: int
    clock_offset_us: float
    clock_source: str
    versions: dict[str, str]
    os: dict[str, str]
    kernel: str
    kernel_cmdline: str
    product_name: str
    sys_vendor: str
    hca_fw_version: str
    hca_board_id: str
    hca_ca_type: str
    command_delay_s: float = 0.0
    hang: list[str] | None = None  # tools that never return; [] = every stub
    unreachable: bool = False
    secure_boot: bool = False
    # after a reset an NVSwitch board's GPU reads fabric Not Started, In Progress (each half of this), Completed;
    # with its Status this error instead of Success when set (sim/hosts/stubs/gpu_reset.py)
    fabric_train_s: float = 0.5
    fabric_failure: str | None = None

    @property
    def vcpus(self) -> int:
        return self.sockets * self.cores_per_socket * self.threads_per_core

    def nvlinks(self, a: int, b: int) -> int:
        return self.nvlink.get(pair_key(a, b), 0)

    def numa_of_cpu(self, cpu: int) -> int:
        for node in self.numa:
            if cpu in node.cpus:
                return node.id
        raise KeyError(cpu)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Hardware:
        values = dict(data)
        values["gpus"] = [Gpu(**g) for g in data["gpus"]]
        values["hcas"] = [Hca(**h) for h in data["hcas"]]
        values["numa"] = [NumaNode(**n) for n in data["numa"]]
        values["nccl_busbw_gbs"] = {int(k): float(v) for k, v in data["nccl_busbw_gbs"].items()}
        return cls(**values)


def pair_key(a: int, b: int) -> str:
    return f"{min(a, b)}-{max(a, b)}"


def _merged_settings(gpu_model: str, sim_hardware: Mapping[str, Any] | None) -> dict[str, Any]:
    settings: dict[str, Any] = dict(COMMON_DEFAULTS)
    settings.update(GENERATION_DEFAULTS["h100-sxm"])
    for key, value in GENERATION_DEFAULTS.get(gpu_model, {}).items():
        settings[key] = value
    for key, value in (sim_hardware or {}).items():
        if isinstance(value, Mapping) and isinstance(settings.get(key), Mapping):
            settings[key] = {**settings[key], **value}
        else:
            settings[key] = value
    return settings


def numa_cpus(node: int, sockets: int, cores_per_socket: int, threads_per_core: int) -> list[int]:
    """Linux numbering on Intel/AMD servers: first threads of all cores, then their hyperthread siblings."""
    physical = sockets * cores_per_socket
    cpus = []
    for thread in range(threads_per_core):
        start = thread * physical + node * cores_per_socket
        cpus += range(start, start + cores_per_socket)
    return cpus


def _stable_hex(text: str, digits: int) -> str:
    """Deterministic per-host identifiers (UUIDs, GUIDs, serials): the same host always gets the same."""
    return hashlib.sha256(text.encode()).hexdigest()[:digits]


def _gpu_uuid(h: str) -> str:
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _hca_bus_id(netdev: str, fallback_bus: int) -> str:
    match = _IB_NETDEV.match(netdev) or _EN_NETDEV.match(netdev)
    bus = int(match.group(1)) if match else fallback_bus
    slot = int(match.group(2)) if match else 0
    return f"0000:{bus:02x}:{slot:02x}.0"


def resolve(host: str, hostvars: Mapping[str, Any]) -> Hardware:
    """The healthy hardware of ``host`` from its resolved inventory variables (faults not applied)."""
    from cluster import model, spec

    gpu_model = str(hostvars.get("gpu_model", "h100-sxm"))
    s = _merged_settings(gpu_model, hostvars.get("sim_hardware"))
    gpu_count = int(spec.value(hostvars, "gpu_count"))
    gpu_numa = model.numa_map(hostvars)
    sockets = int(s["sockets"])
    numa_count = max([sockets, *(n + 1 for n in gpu_numa)])
    bus_ids = list(s["gpu_bus_ids"])
    while len(bus_ids) < gpu_count:
        bus_ids.append(f"{0x10 + 8 * len(bus_ids):02X}")
    gpus = [
        Gpu(
            index=i,
            bus_id=f"00000000:{bus_ids[i].upper()}:00.0",
            numa_node=gpu_numa[i],
            uuid=_gpu_uuid(_stable_hex(f"{host}/gpu{i}", 32)),
            serial=str(int(_stable_hex(f"{host}/serial{i}", 12), 16) % 10**13).rjust(13, "1"),
        )
        for i in range(gpu_count)
    ]
    links = int(s["nvlink_links"])
    nvlink = {pair_key(a, b): links for a in range(gpu_count) for b in range(a + 1, gpu_count)}
    numa = [
        NumaNode(
            id=n,
            cpus=numa_cpus(n, sockets, int(s["cores_per_socket"]), int(s["threads_per_core"])) if n < sockets else [],
            memory_gib=int(s["memory_gib"]) // sockets if n < sockets else 0,
        )
        for n in range(numa_count)
    ]
    hca_defaults = s["hca"]
    hcas = []
    for i, nic in enumerate(model.nics_of(hostvars)):
        netdev = nic.netdev or f"ibp{0x20 + i}s0"
        hcas.append(
            Hca(
                device=nic.device,
                netdev=netdev,
                port=nic.port,
                link_layer=nic.link_layer,
                rate_gbps=nic.rate_gbps or int(hca_defaults["rate_gbps"]),
                numa_node=nic.numa_node if nic.numa_node is not None else 0,
                gpu=nic.gpu,
                bus_id=_hca_bus_id(netdev, 0x20 + i),
                lid=int(hca_defaults.get("lid_base", 0)) + i if hca_defaults.get("lid_base") else _host_lid(host, i),
                guid=_stable_hex(f"{host}/{nic.device}", 16),
                latency_us=float(s["ib_latency_us"]),
                bw_gbps=float(s["ib_bw_gbps"]),
            )
        )
    gpu_addresses = {g.sysfs_address: g.index for g in gpus}
    for hca in hcas:
        if hca.bus_id in gpu_addresses:
            raise ValueError(
                f"rdma_nics {hca.device} (netdev {hca.netdev}) sits at PCI {hca.bus_id}, which is GPU"
                f"{gpu_addresses[hca.bus_id]}'s address (sim_hardware.gpu_bus_ids); rename the netdev"
            )
    return Hardware(
        host=host,
        gpu_model=gpu_model,
        gpu_name=s["gpu_name"],
        gpu_architecture=s["gpu_architecture"],
        gpu_memory_mib=int(s["gpu_memory_mib"]),
        gpu_power_limit_w=int(s["gpu_power_limit_w"]),
        gpu_pci_device_id=str(s["gpu_pci_device_id"]),
        gpus=gpus,
        nvlink=nvlink,
        cpu_model=s["cpu_model"],
        cpu_vendor=s["cpu_vendor"],
        cpu_family=int(s["cpu_family"]),
        cpu_model_number=int(s["cpu_model_number"]),
        cpu_stepping=int(s["cpu_stepping"]),
        cpu_mhz=float(s["cpu_mhz"]),
        sockets=sockets,
        cores_per_socket=int(s["cores_per_socket"]),
        threads_per_core=int(s["threads_per_core"]),
        cstates=list(s["cstates"]),
        cstates_disabled=True,
        numa=numa,
        memory_gib=int(s["memory_gib"]),
        hcas=hcas,
        nccl_busbw_gbs={int(k): float(v) for k, v in s["nccl_busbw_gbs"].items()},
        nccl_wrong=0,
        clock_offset_us=float(s["clock_offset_us"]),
        clock_source=str(s["clock_source"]),
        versions={k: str(v) for k, v in s["versions"].items()},
        os={k: str(v) for k, v in s["os"].items()},
        kernel=str(s["kernel"]),
        kernel_cmdline=str(s["kernel_cmdline"]),
        product_name=str(s["product_name"]),
        sys_vendor=str(s["sys_vendor"]),
        hca_fw_version=str(hca_defaults["fw_version"]),
        hca_board_id=str(hca_defaults["board_id"]),
        hca_ca_type=str(hca_defaults["ca_type"]),
        command_delay_s=float(hostvars.get("sim_command_delay_s", s["sim_command_delay_s"])),
        secure_boot=bool(s["secure_boot"]),
    )


def _host_lid(host: str, index: int) -> int:
    # A LID for a host described on its own; `virtual up` renumbers the whole fabric so none collide.
    return 1 + (int(_stable_hex(host, 6), 16) % 3000) * 8 + index
