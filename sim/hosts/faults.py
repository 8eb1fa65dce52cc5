"""Fault injection for simulated hosts: ``sim_faults``, a list of ``{kind: ..., <parameters>}``.

Each fault changes the hardware description (:mod:`sim.hosts.hardware`) that the simulated /sys,
/proc and the stub tools are generated from, so one fault shows up consistently in every place a real
broken node would show it (e.g. ``ib_port_down`` in sysfs ``state``, ``ibstat`` and a failing ``ibping``).

=====================  ==========================================  ===================================
kind                   parameters (defaults)                       what changes
=====================  ==========================================  ===================================
nvlink_down            gpus: [a, b] (0, 1); links: remaining (0)   ``topo -m`` shows a PCIe path;
                                                                   ``nvlink -s``: both GPUs' links from
                                                                   ``links`` on inactive, ``-e`` N/A
gpu_wrong_numa         gpu (0); numa_node (the other socket)       sysfs numa_node, ``topo -m`` affinity
ib_port_down           device (first HCA)                          state Down / phys Disabled
ib_port_rate           device (first HCA); rate_gbps (200)         sysfs rate, ``ibstat`` Rate
ib_high_latency        device (first HCA); latency_us (25.0)       ``ib_write_lat``
ib_low_bandwidth       device (first HCA); bw_gbps (95.0)          ``ib_write_bw``
nccl_low_bw            busbw_gbs (120.0)                           ``all_reduce_perf`` busbw
nccl_wrong             count (1)                                   ``all_reduce_perf`` #wrong
ecc_uncorrectable      gpu (0); count (1)                          ``nvidia-smi -q`` ECC, XID 48
row_remap_pending      gpu (0)                                     ``nvidia-smi -q`` Remapped Rows
cstates_enabled        -                                           cpuidle ``disable``, /proc/cmdline
dcqcn_off              device (every RoCE HCA)                     ecn roce_np/roce_rp enable = 0
clock_offset           offset_us (2500.0)                          ``chronyc tracking``
version_drift          component (driver); version (535.161.08)    reported version of that component
unreachable            -                                           sshd masked: SSH refused
hang                   command (every stub)                        stub sleeps until killed
pcie_downtrained       gpu (0); gen (4); width (16)                ``nvidia-smi -q -d PCI`` Current
gpu_low_bandwidth      gpu (0); h2d_gbps (21.0); d2h_gbps (h2d)    ``nvbandwidth`` H2D/D2H columns
nvlink_errors          gpu (0); link (0); counter (replay); rate   ``nvidia-smi nvlink -e`` grows
                       (50.0 per second)
gpu_throttle           gpu (0); reason (HW Thermal Slowdown)       ``-q -d PERFORMANCE`` flag + counter
dcgm_fail              gpu (0); test (memory)                      ``dcgmi diag -j`` Fail + DCGM_FR_*
ib_link_flaps          device (first HCA); count (3)               kernel log lost carrier / ready
=====================  ==========================================  ===================================

The last six (the deeper checks') each change one tool's output only, so each FAILs exactly its preflight check
(on real hardware a downtrained link would also lower nvbandwidth's numbers).

``nvlink_down`` shows where a real node with a GPU pair's NVLink down shows it: ``topo -m`` (NODE/SYS instead of
NV18), NCCL and nvbandwidth's device-to-device read of the pair over PCIe, and ``nvidia-smi nvlink -s`` with the
two GPUs' links ``<inactive>`` (``nvlink -e`` prints N/A counters for them). So it FAILs gpu_topology, nccl,
gpu_bandwidth and nvlink (``NVLINK_INACTIVE``); dcgm_diag WARNs ``DCGM_CROSS_CHECK``, the simulated DCGM passing
with links down as real DCGM level 2 does (NVIDIA/DCGM#198). Which links go inactive: see :func:`nvlink_down`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from sim.hosts.hardware import Hardware, Hca, pair_key


class FaultError(ValueError):
    """A ``sim_faults`` entry that cannot be applied (unknown kind, bad parameter)."""


def _hca(hw: Hardware, fault: Mapping[str, Any]) -> Hca:
    if not hw.hcas:
        raise FaultError(f"{fault['kind']}: host has no rdma_nics")
    device = fault.get("device")
    if device is None:
        return hw.hcas[0]
    for hca in hw.hcas:
        if device in (hca.device, hca.netdev):
            return hca
    raise FaultError(f"{fault['kind']}: no HCA {device!r} (have {', '.join(h.device for h in hw.hcas)})")


def _gpu_index(hw: Hardware, fault: Mapping[str, Any], key: str = "gpu") -> int:
    gpu = int(fault.get(key, 0))
    if not 0 <= gpu < len(hw.gpus):
        raise FaultError(f"{fault['kind']}: GPU {gpu} out of range 0..{len(hw.gpus) - 1}")
    return gpu


def nvlink_down(hw: Hardware, f: Mapping[str, Any]) -> None:
    from sim.hosts.stubs.gpu_depth import nvlink_count

    a, b = (int(g) for g in f.get("gpus", [0, 1]))
    for g in (a, b):
        _gpu_index(hw, {"kind": f["kind"], "gpu": g})
    if a == b:
        raise FaultError("nvlink_down: gpus must name two different GPUs")
    total, links = nvlink_count(hw), int(f.get("links", 0))
    if not 0 <= links <= total:
        raise FaultError(f"nvlink_down: links {links} out of range 0..{total}")
    hw.nvlink[pair_key(a, b)] = links
    # Which links go inactive (``nvidia-smi nvlink -s`` prints ``<inactive>``, ``-e`` N/A counters): on HGX
    # H100/H200 (and A100) boards every one of a GPU's 18 (12) NVLinks goes to an NVSwitch, none to a peer
    # GPU, so no link belongs to the pair; a real pair reading NODE/SYS in ``topo -m`` is a GPU whose own
    # links are down. Decision: the pair's fault is modelled as the named GPUs' links inactive, each of the
    # two GPUs with its links ``links``..total-1 down (Link 0..links-1 stay up, so ``links: 12`` leaves 12 of 18
    # active). Simplification kept: ``topo -m``, NCCL and nvbandwidth change for the named pair only (a real
    # GPU with dead links would lose NVLink to every peer), so gpu_topology still FAILs that pair's IU only.
    for g in (a, b):
        gpu = hw.gpus[g]
        gpu.nvlink_inactive = sorted(set(gpu.nvlink_inactive) | set(range(links, total)))


def gpu_wrong_numa(hw: Hardware, f: Mapping[str, Any]) -> None:
    gpu = hw.gpus[_gpu_index(hw, f)]
    nodes = [n.id for n in hw.numa if n.cpus]
    gpu.numa_node = int(f.get("numa_node", next((n for n in nodes if n != gpu.numa_node), gpu.numa_node)))


def ib_port_down(hw: Hardware, f: Mapping[str, Any]) -> None:
    hca = _hca(hw, f)
    hca.state, hca.phys_state = "Down", "Disabled"


def ib_port_rate(hw: Hardware, f: Mapping[str, Any]) -> None:
    _hca(hw, f).rate_gbps = int(f.get("rate_gbps", 200))


def ib_high_latency(hw: Hardware, f: Mapping[str, Any]) -> None:
    _hca(hw, f).latency_us = float(f.get("latency_us", 25.0))


def ib_low_bandwidth(hw: Hardware, f: Mapping[str, Any]) -> None:
    _hca(hw, f).bw_gbps = float(f.get("bw_gbps", 95.0))


def nccl_low_bw(hw: Hardware, f: Mapping[str, Any]) -> None:
    busbw = float(f.get("busbw_gbs", 120.0))
    hw.nccl_busbw_gbs = {n: min(v, busbw) if n > 1 else v for n, v in hw.nccl_busbw_gbs.items()}


def nccl_wrong(hw: Hardware, f: Mapping[str, Any]) -> None:
    hw.nccl_wrong = int(f.get("count", 1))


def ecc_uncorrectable(hw: Hardware, f: Mapping[str, Any]) -> None:
    gpu = hw.gpus[_gpu_index(hw, f)]
    gpu.ecc_uncorrectable = int(f.get("count", 1))
    gpu.xid_events.append(48)  # XID 48: double-bit ECC error


def row_remap_pending(hw: Hardware, f: Mapping[str, Any]) -> None:
    gpu = hw.gpus[_gpu_index(hw, f)]
    gpu.row_remap_pending = True
    gpu.xid_events.append(63)  # XID 63: row remapping event


def cstates_enabled(hw: Hardware, f: Mapping[str, Any]) -> None:
    hw.cstates_disabled = False
    hw.kernel_cmdline = " ".join(
        w for w in hw.kernel_cmdline.split() if not w.startswith(("intel_idle.max_cstate=", "processor.max_cstate="))
    )


def dcqcn_off(hw: Hardware, f: Mapping[str, Any]) -> None:
    targets = [_hca(hw, f)] if f.get("device") else [h for h in hw.hcas if h.link_layer == "ethernet"]
    if not targets:
        raise FaultError("dcqcn_off: host has no RoCE (link_layer: ethernet) HCA")
    for hca in targets:
        hca.dcqcn = False


def clock_offset(hw: Hardware, f: Mapping[str, Any]) -> None:
    hw.clock_offset_us = float(f.get("offset_us", 2500.0))


def version_drift(hw: Hardware, f: Mapping[str, Any]) -> None:
    component = str(f.get("component", "driver"))
    if component not in hw.versions:
        raise FaultError(f"version_drift: unknown component {component!r} (one of {', '.join(hw.versions)})")
    hw.versions[component] = str(f.get("version", "535.161.08"))


def unreachable(hw: Hardware, f: Mapping[str, Any]) -> None:
    hw.unreachable = True


def hang(hw: Hardware, f: Mapping[str, Any]) -> None:
    command = f.get("command")
    if command is None:
        hw.hang = []
    elif hw.hang != []:
        hw.hang = [*(hw.hang or []), str(command)]


def pcie_downtrained(hw: Hardware, f: Mapping[str, Any]) -> None:
    gpu = hw.gpus[_gpu_index(hw, f)]
    gpu.pcie_gen, gpu.pcie_width = int(f.get("gen", 4)), int(f.get("width", 16))


def gpu_low_bandwidth(hw: Hardware, f: Mapping[str, Any]) -> None:
    gpu = hw.gpus[_gpu_index(hw, f)]
    gpu.h2d_gbps = float(f.get("h2d_gbps", 21.0))
    gpu.d2h_gbps = float(f.get("d2h_gbps", gpu.h2d_gbps))


def nvlink_errors(hw: Hardware, f: Mapping[str, Any]) -> None:
    gpu = hw.gpus[_gpu_index(hw, f)]
    counter = str(f.get("counter", "replay"))
    if counter not in ("replay", "recovery", "crc"):
        raise FaultError(f"nvlink_errors: counter {counter!r} is not replay, recovery or crc")
    gpu.nvlink_error_rates.setdefault(str(int(f.get("link", 0))), {})[counter] = float(f.get("rate", 50.0))


def gpu_throttle(hw: Hardware, f: Mapping[str, Any]) -> None:
    from sim.hosts.stubs.gpu_depth import REASONS

    reason = str(f.get("reason", "HW Thermal Slowdown"))
    if reason not in REASONS:
        raise FaultError(f"gpu_throttle: reason {reason!r} is not one of {', '.join(REASONS)}")
    gpu = hw.gpus[_gpu_index(hw, f)]
    gpu.clock_events = [*gpu.clock_events, reason]
    if reason in ("HW Thermal Slowdown", "HW Power Brake Slowdown"):
        gpu.clock_events.append("HW Slowdown")  # the parent reason is active with either of its sub-reasons


def dcgm_fail(hw: Hardware, f: Mapping[str, Any]) -> None:
    hw.gpus[_gpu_index(hw, f)].dcgm_fail = str(f.get("test", "memory"))


def ib_link_flaps(hw: Hardware, f: Mapping[str, Any]) -> None:
    _hca(hw, f).flaps = int(f.get("count", 3))


FAULTS: dict[str, Callable[[Hardware, Mapping[str, Any]], None]] = {
    f.__name__: f
    for f in (
        nvlink_down, gpu_wrong_numa, ib_port_down, ib_port_rate, ib_high_latency, ib_low_bandwidth,
        nccl_low_bw, nccl_wrong, ecc_uncorrectable, row_remap_pending, cstates_enabled, dcqcn_off,
        clock_offset, version_drift, unreachable, hang, pcie_downtrained, gpu_low_bandwidth, nvlink_errors,
        gpu_throttle, dcgm_fail, ib_link_flaps,
    )
}
# Faults preflight must catch on a node that provisioning handles normally (the default inventory's mix).
HARDWARE_FAULTS = tuple(k for k in FAULTS if k not in ("unreachable", "hang"))


def apply(hw: Hardware, faults: list[Mapping[str, Any]] | None) -> Hardware:
    """A copy of ``hw`` with every fault applied, in order. Raises FaultError naming the bad entry."""
    broken = copy.deepcopy(hw)
    for i, fault in enumerate(faults or []):
        if not isinstance(fault, Mapping) or fault.get("kind") not in FAULTS:
            kind = fault.get("kind") if isinstance(fault, Mapping) else fault
            raise FaultError(f"{hw.host}: sim_faults[{i}]: unknown fault kind {kind!r} (one of {', '.join(FAULTS)})")
        try:
            FAULTS[fault["kind"]](broken, fault)
        except (TypeError, ValueError) as exc:
            raise FaultError(f"{hw.host}: sim_faults[{i}]: {exc}") from None
    return broken
