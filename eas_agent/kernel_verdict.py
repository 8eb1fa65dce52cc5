"""What the kernel log (:mod:`eas_agent.collectors.kernel_log`) changes in an IU's verdict. Pure.

- **XIDs** go through the XID verdict (:mod:`eas_agent.xid_verdict`) with their own times: a GPU's latest XID
  is the newer of NVML's (received by the agent) and the kernel log's (the record's time), matched by the
  GPU's PCI bus id. An XID logged while the agent was down (NVML does not replay events from before its
  registration) so counts from the time it happened: ``xid_last_at`` stays truthful, the unit is critical for
  what is left of ``xid_hold_s`` after it, and ``clusterctl remediate`` ages it by ``--xid-max-age-s``. The
  count ``xid_events`` stays NVML's (the rollout gate's counter since the agent started).
- **A fatal SXID** (the NVSwitch driver's ``Fatal`` severity) takes every IU of the node out for
  ``xid_hold_s`` after it. NVIDIA's Fabric Manager guide (bare-metal mode, runtime NVSwitch errors): a fatal
  error on a switch port stops the NVLink traffic through it, the CUDA jobs of the GPUs behind it are aborted
  (they see XID 74 or 45), and the GPUs and switches must be reset (on HGX H100 baseboards, all of them
  together) or Fabric Manager restarted before the fabric is used again. The kernel log does not say which
  GPUs sit behind the port and every GPU of an HGX baseboard reaches every other through the switches, so the
  node's IUs are all affected; the reason names the switch, the SXID and the driver's text.
- **Non-fatal and correctable SXIDs** only count (Fabric Manager leaves running jobs alone for them): the body's
  display components ``sxid_fatal``, ``sxid_non_fatal``, ``sxid_correctable`` (since boot, as far as read), with
  ``kernel_log_lost``, the records the kernel overwrote before the agent read them.
"""

from __future__ import annotations

from dataclasses import replace

from eas_agent.collectors.gpu import GpuReading
from eas_agent.collectors.kernel_log import KernelLogReading
from eas_agent.kernel_log import CORRECTABLE, FATAL, NON_FATAL


def with_kernel_xids(gpus: tuple[GpuReading, ...], kernel: KernelLogReading | None) -> tuple[GpuReading, ...]:
    """The IU's GPU readings, each GPU's latest XID the newer of NVML's and the kernel log's."""
    if kernel is None or not kernel.xids:
        return gpus
    merged = []
    for gpu in gpus:
        logged = kernel.xids.get(gpu.pci) if gpu.pci is not None else None
        if logged is not None and (gpu.xid_last_at is None or logged.at > gpu.xid_last_at):
            gpu = replace(gpu, xid_last=logged.xid, xid_last_at=logged.at)
        merged.append(gpu)
    return type(gpus)(merged)


def sxid_verdict(kernel: KernelLogReading | None, now: float, hold_s: float) -> str | None:
    """The reason to mark the node's IUs critical for a fatal SXID received no longer than ``hold_s`` ago."""
    event = kernel.fatal_sxid if kernel is not None else None
    if event is None or now - event.at > hold_s:  # a clock stepped back: still new
        return None
    return (f"NVSwitch {event.switch} (PCI:{event.pci}): fatal SXID {event.sxid} {max(0.0, now - event.at):.0f} s "
            f"ago ({event.detail}); the node's GPUs share its fabric: reset the GPUs and NVSwitches or restart "
            "Fabric Manager")


def kernel_components(kernel: KernelLogReading | None) -> dict[str, float | None]:
    """The SXID counts shown with the IU's score (display only); none when the log was never read."""
    if kernel is None or (kernel.failure is not None and not kernel.sxids and not kernel.xids):
        return {}
    return {
        "sxid_fatal": kernel.sxids.get(FATAL, 0),
        "sxid_non_fatal": kernel.sxids.get(NON_FATAL, 0),
        "sxid_correctable": kernel.sxids.get(CORRECTABLE, 0),
        "kernel_log_lost": kernel.lost,  # records the kernel overwrote before the agent read them
    }
