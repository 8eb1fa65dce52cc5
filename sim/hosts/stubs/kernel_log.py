"""Kernel log readers: ``dmesg`` and ``journalctl -k`` (other journalctl calls go to the real one), with the NVIDIA driver's XID lines for GPU faults.

XID lines are what the NVIDIA driver (NVRM) logs, e.g. ``NVRM: Xid (PCI:0000:18:00): 48, pid=..., name=...,
An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer ...`` and XID 63
``Row Remapper: New row ... marked for remapping, reset gpu to activate.`` and XID 79 ``GPU has fallen off the
bus.`` (NVIDIA "XID Errors" document, r555). dmesg prints ``[seconds.micros] text``; journalctl -k prints ``Mon DD HH:MM:SS host kernel: text``;
``--grep``/``-g PATTERN`` keeps the messages the pattern matches (case-sensitive unless all lower case, as
journalctl's) and exits 1 when none does; nothing shown prints ``-- No entries --`` unless ``-q``.
"""

from __future__ import annotations

import re
import time

from sim.hosts.hardware import Hardware
from sim.hosts.stubs.main import hand_to_real

_XID_TEXT = {
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, "
        "subpartition 0.",
    63: "Row Remapper: New row (0x00000000003ffa0c) marked for remapping, reset gpu to activate.",
    79: "GPU has fallen off the bus.",
}


def kernel_messages(hw: Hardware) -> list[tuple[float, str]]:
    """(seconds since boot, message) of the host's kernel log, boot messages first."""
    drv = hw.versions["driver"]
    messages = [
        (0.0, f"Linux version {hw.kernel} (buildd@lcy02-amd64-050) (gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0, "
              "GNU ld (GNU Binutils for Ubuntu) 2.38) #123-Ubuntu SMP Mon Jun 10 08:16:17 UTC 2024"),
        (0.0, f"Command line: {hw.kernel_cmdline}"),
        (9.41, "nvidia-nvlink: Nvlink Core is being initialized, major device number 509"),
        (9.52, f"NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {drv}  Wed Jun  5 21:14:07 UTC 2024"),
    ]
    for i, hca in enumerate(hw.hcas):
        messages.append((7.1 + i * 0.01, f"mlx5_core {hca.bus_id}: firmware version: {hw.hca_fw_version}"))
        # pcie_print_link_status(): 32 GT/s x16 with 128b/130b encoding.
        messages.append((7.2 + i * 0.01, f"mlx5_core {hca.bus_id}: 504.123 Gb/s available PCIe bandwidth "
                                         "(32.0 GT/s PCIe x16 link)"))
    when = 3600.0
    for gpu in hw.gpus:
        pci = gpu.bus_id[4:14].lower()  # 0000:18:00
        for xid in gpu.xid_events:
            messages.append((when, f"NVRM: Xid (PCI:{pci}): {xid}, pid='<unknown>', name=<unknown>, "
                                   f"{_XID_TEXT.get(xid, 'Graphics Exception')}"))
            when += 0.5
    for hca in hw.hcas:  # ib_link_flaps: the link drops and retrains, once every ten minutes
        for flap in range(hca.flaps):
            at = 5400.0 + 600.0 * flap
            messages.append((at, f"{hca.netdev}: lost carrier"))
            messages.append((at + 4.0, f"IPv6: ADDRCONF(NETDEV_CHANGE): {hca.netdev}: link becomes ready"))
    return sorted(messages, key=lambda m: m[0])


def dmesg(hw: Hardware, args: list[str]) -> int:
    print("".join(f"[{t:12.6f}] {text}\n" for t, text in kernel_messages(hw)), end="")
    return 0


REAL_JOURNALCTL = ("/usr/bin/journalctl", "/bin/journalctl")


def journalctl(hw: Hardware, args: list[str]) -> int:
    """The kernel's messages are simulated (a machine shares the CI machine's kernel); everything else is the
    machine's own journal: a unit's or a script's lines (roles read a failed unit's reason there)."""
    if not set(args) & {"-k", "--dmesg"}:
        hand_to_real(REAL_JOURNALCTL, args)
    boot = time.time() - 7200
    out = []
    iso = "short-iso" in args  # -o short-iso: RFC 3339 stamps, 2024-06-10T08:16:17+0000
    pattern = _grep_pattern(args)
    for t, text in kernel_messages(hw):
        if pattern is not None and not pattern.search(text):
            continue
        when = time.localtime(boot + t)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z" if iso else "%b %d %H:%M:%S", when)
        out.append(f"{stamp} {hw.host} kernel: {text}")
    if not out and not set(args) & {"-q", "--quiet"}:
        print("-- No entries --")  # journalctl's line for an empty window, unless -q
    if pattern is not None and not out:
        return 1  # journalctl --grep with no match: exit 1, as grep(1)
    if out:
        print("\n".join(out))
    return 0


def _grep_pattern(args: list[str]) -> re.Pattern | None:
    """The ``-g``/``--grep`` pattern of a journalctl call (``-g P``, ``-gP``, ``--grep P``, ``--grep=P``)."""
    for i, arg in enumerate(args):
        if arg in ("-g", "--grep") and i + 1 < len(args):
            text = args[i + 1]
        elif arg.startswith("--grep="):
            text = arg.split("=", 1)[1]
        elif arg.startswith("-g") and len(arg) > 2:
            text = arg[2:]
        else:
            continue
        return re.compile(text, 0 if any(c.isupper() for c in text) else re.IGNORECASE)
    return None
