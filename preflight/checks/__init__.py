"""The checks, explicitly registered in the order they run and are reported.

Each module holds one check (``CHECK``), named by its area; its docstring lists what it gathers, how it
judges and its stable fault codes.
"""

from __future__ import annotations

from preflight.checks import (
    consul,
    cstates,
    dcgm_diag,
    dcqcn,
    gpu_bandwidth,
    gpu_health,
    gpu_throttle,
    gpu_topology,
    ib_link_health,
    ib_pairs,
    ib_ports,
    nccl,
    numa_pinning,
    nvlink,
    os_support,
    pcie_link,
    secure_boot,
    time_sync,
    versions,
)
from preflight.checks.base import Check

# The bracket checks (nvlink, gpu_throttle, ib_link_health) take their "before" reading where they stand,
# so they come before the checks that load GPUs and links (gpu_bandwidth, dcgm_diag, nccl, ib_pairs).
CHECKS: tuple[Check, ...] = (
    gpu_topology.CHECK,
    gpu_health.CHECK,
    pcie_link.CHECK,
    nvlink.CHECK,
    gpu_throttle.CHECK,
    ib_link_health.CHECK,
    ib_ports.CHECK,
    ib_pairs.CHECK,
    gpu_bandwidth.CHECK,
    dcgm_diag.CHECK,
    nccl.CHECK,
    cstates.CHECK,
    dcqcn.CHECK,
    numa_pinning.CHECK,
    time_sync.CHECK,
    os_support.CHECK,
    secure_boot.CHECK,
    versions.CHECK,
    consul.CHECK,
)
BY_NAME: dict[str, Check] = {c.name: c for c in CHECKS}


def select(checks: list[str] | None, skip: list[str] | None) -> list[Check]:
    """The checks to run; unknown names raise ValueError listing the known ones."""
    unknown = [n for n in (checks or []) + (skip or []) if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)} (known: {', '.join(BY_NAME)})")
    chosen = [c for c in CHECKS if not checks or c.name in checks]
    return [c for c in chosen if c.name not in (skip or [])]
