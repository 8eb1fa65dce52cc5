"""Network collector: per-NIC byte rates (psutil) and IB/RoCE port counters from sysfs.

RDMA traffic bypasses the kernel network stack, so psutil (``/proc/net/dev``) cannot see it; the HCA's port
counters can: ``<sysfs>/class/infiniband/<dev>/ports/<port>/counters/port_xmit_data`` and ``port_rcv_data``
count 4-byte units (octets / 4, IBA spec PortXmitData/PortRcvData). The sysfs root is a parameter so tests
point it at a fake tree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from eas_agent.collectors.rates import WindowRate

RDMA_COUNTER_UNIT_BYTES = 4


@dataclass(frozen=True)
class NetReading:
    """Bytes/s (rx + tx) seen by the kernel netdevs and by the RDMA port counters, kept apart.

    IB port counters already include IPoIB traffic of the paired netdev, so adding the two would count it
    twice; :attr:`mb_per_s` takes the larger of the two views.
    """

    netdev_bytes_per_s: float | None
    rdma_bytes_per_s: float | None
    missing: tuple[str, ...] = ()  # devices that could not be read
    failure: str | None = None  # the node's NIC counters could not be read at all (or the collector failed)

    @property
    def error(self) -> str | None:
        if self.failure:
            return self.failure
        return f"cannot read {', '.join(self.missing)}" if self.missing else None

    @property
    def mb_per_s(self) -> float | None:
        known = [v for v in (self.netdev_bytes_per_s, self.rdma_bytes_per_s) if v is not None]
        if self.missing or not known:
            return None
        return max(known) / 1e6


def read_rdma_port(sysfs_root: str | Path, device: str, port: int) -> tuple[int, int] | None:
    """(rx bytes, tx bytes) of one RDMA port, or None when its counters are not there."""
    counters = Path(sysfs_root) / "class" / "infiniband" / device / "ports" / str(port) / "counters"
    try:
        rx = int((counters / "port_rcv_data").read_text().strip())
        tx = int((counters / "port_xmit_data").read_text().strip())
    except (OSError, ValueError):
        return None
    return rx * RDMA_COUNTER_UNIT_BYTES, tx * RDMA_COUNTER_UNIT_BYTES


class NodeNicCounters:
    """The node's per-NIC byte counters (``psutil.net_io_counters(pernic=True)``): read once per cycle by the
    agent (:meth:`refresh`), shared by every IU's :class:`NetworkCollector`."""

    def __init__(self, read: Callable[[], Mapping[str, object]]):
        self.read = read
        self.current: Mapping[str, object] = {}
        self.error: str | None = None

    def refresh(self) -> None:
        try:
            self.current, self.error = self.read(), None
        except OSError as exc:
            self.current, self.error = {}, f"reading the NIC counters failed: {exc}"


class NetworkCollector:
    """One IU's NICs: its netdevs in the node's counters, its RDMA ports in sysfs."""

    name = "network"

    def __init__(
        self,
        netdevs: tuple[str, ...],
        rdma_devices: tuple[str, ...],
        nics: NodeNicCounters,
        rdma_port: int = 1,
        sysfs_root: str | Path = "/sys",
        window_s: float = 5.0,
    ):
        self.netdevs, self.rdma_devices, self.rdma_port = netdevs, rdma_devices, rdma_port
        self.nics, self.sysfs_root = nics, sysfs_root
        self.netdev_rate = WindowRate(window_s)
        self.rdma_rate = WindowRate(window_s)

    def failed(self, now: float, error: str) -> NetReading:
        self.netdev_rate.update(now, None)
        self.rdma_rate.update(now, None)
        return NetReading(None, None, self.netdevs + self.rdma_devices, error)

    def collect(self, now: float) -> NetReading:
        pernic = self.nics.current
        missing: list[str] = []
        netdev_total = 0
        for name in self.netdevs:
            counters = pernic.get(name)
            if counters is None:
                missing.append(name)
            else:
                netdev_total += counters.bytes_recv + counters.bytes_sent
        rdma_total = 0
        for device in self.rdma_devices:
            port = read_rdma_port(self.sysfs_root, device, self.rdma_port)
            if port is None:
                missing.append(device)
            else:
                rdma_total += port[0] + port[1]
        netdev_ok = bool(self.netdevs) and not any(n in missing for n in self.netdevs)
        rdma_ok = bool(self.rdma_devices) and not any(d in missing for d in self.rdma_devices)
        return NetReading(
            netdev_bytes_per_s=self.netdev_rate.update(now, netdev_total if netdev_ok else None),
            rdma_bytes_per_s=self.rdma_rate.update(now, rdma_total if rdma_ok else None),
            missing=tuple(missing),
            failure=self.nics.error if self.netdevs else None,
        )
