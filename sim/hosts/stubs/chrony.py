"""``chronyc tracking`` (chrony 4.2, Ubuntu 22.04), laid out as client.c's process_cmd_tracking prints it.

``System time`` is the host's ``clock_offset_us`` (positive = fast of NTP time); a healthy host on a LAN
NTP server is tens of microseconds off (chrony FAQ).
"""

from __future__ import annotations

import time

from sim.hosts.hardware import Hardware
from sim.hosts.stubs.main import StubUsageError


def tracking(hw: Hardware) -> str:
    offset_s = hw.clock_offset_us / 1e6
    ref_id = "".join(f"{int(octet):02X}" for octet in hw.clock_source.split("."))
    ref_time = time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(time.time() - 37))
    return (
        f"Reference ID    : {ref_id} ({hw.clock_source})\n"
        "Stratum         : 3\n"
        f"Ref time (UTC)  : {ref_time}\n"
        f"System time     : {abs(offset_s):.9f} seconds {'fast' if offset_s >= 0 else 'slow'} of NTP time\n"
        f"Last offset     : {offset_s * 0.8:+.9f} seconds\n"
        f"RMS offset      : {abs(offset_s) * 1.3:.9f} seconds\n"
        "Frequency       : 12.417 ppm slow\n"
        "Residual freq   : +0.002 ppm\n"
        "Skew            : 0.031 ppm\n"
        "Root delay      : 0.000412733 seconds\n"
        "Root dispersion : 0.000208917 seconds\n"
        "Update interval : 64.3 seconds\n"
        "Leap status     : Normal\n"
    )


def chronyc(hw: Hardware, args: list[str]) -> int:
    commands = [a for a in args if not a.startswith("-")]
    if commands[:1] == ["tracking"]:
        print(tracking(hw), end="")
        return 0
    raise StubUsageError(f"only 'tracking' is simulated (got {' '.join(args)!r})")
