"""``ibstat`` and ``ibping`` (infiniband-diags in rdma-core).

``ibstat``: CA fields indented by one tab, port fields by two (infiniband-diags/ibstat.c); "Rate" is the
port's rate in Gb/s, RoCE ports show "Link layer: Ethernet" and "Base lid: 0".
``ibping``: the client prints one "Pong from <host>.(none) (Lid N): time X ms" line per reply, then the
statistics block of ``report()`` in infiniband-diags/ibping.c (time in ms; rdma-core's timestamps make the
printed RTT 10x too small, so a ~60 us MAD round trip prints as 0.006 ms). Unanswered pings are counted
as lost; with no reply at all the host name is empty, as in ibping.c.
"""

from __future__ import annotations

import os
import sys
import time

from sim.hosts.hardware import GENERATION_DEFAULTS, Hardware, Hca
from sim.hosts.stubs import peers
from sim.hosts.stubs.main import StubUsageError

DEFAULT_LINK_LATENCY_US = GENERATION_DEFAULTS["h100-sxm"]["ib_latency_us"]


def _ibstat_ca(hw: Hardware, hca: Hca) -> str:
    ib = hca.link_layer == "infiniband"
    guid = f"0x{hca.guid}"
    return (
        f"CA '{hca.device}'\n"
        f"\tCA type: {hw.hca_ca_type}\n"
        f"\tNumber of ports: 1\n"
        f"\tFirmware version: {hw.hca_fw_version}\n"
        f"\tHardware version: 0\n"
        f"\tNode GUID: {guid}\n"
        f"\tSystem image GUID: {guid}\n"
        f"\tPort {hca.port}:\n"
        f"\t\tState: {hca.state}\n"
        f"\t\tPhysical state: {hca.phys_state}\n"
        f"\t\tRate: {hca.rate_gbps if hca.state == 'Active' else 10}\n"
        f"\t\tBase lid: {hca.lid if ib else 0}\n"
        f"\t\tLMC: 0\n"
        f"\t\tSM lid: {1 if ib else 0}\n"
        f"\t\tCapability mask: {'0xa751e848' if ib else '0x00010000'}\n"
        f"\t\tPort GUID: {guid if ib else '0x' + hca.guid[:6] + 'fffe' + hca.guid[10:]}\n"
        f"\t\tLink layer: {'InfiniBand' if ib else 'Ethernet'}\n"
    )


def ibstat(hw: Hardware, args: list[str]) -> int:
    names = [a for a in args if not a.startswith("-")]
    if "-l" in args:  # list CA names
        print("".join(f"{h.device}\n" for h in hw.hcas), end="")
        return 0
    chosen = [h for h in hw.hcas if not names or h.device == names[0]]
    if names and not chosen:
        print(f"ibpanic: [{os.getpid()}] main: stat of IB device '{names[0]}' failed: No such file or directory",
              file=sys.stderr)
        return 255
    print("".join(_ibstat_ca(hw, h) for h in chosen), end="")
    return 0


# ibping options that take a value (infiniband-diags common options + ibping's own).
_IBPING_VALUE_OPTIONS = {"-c", "-C", "-P", "-t", "-o", "-s", "-y", "--Ca", "--Port", "--timeout", "--count"}
MAD_RTT_PRINTED_US = 6  # a ~60 us MAD round trip through one switch, printed 10x too small (ibping.c)


def _ibping_args(args: list[str]) -> tuple[dict[str, str], set[str], list[str]]:
    """(options with values, flags, positionals)."""
    values: dict[str, str] = {}
    flags: set[str] = set()
    positionals: list[str] = []
    rest = list(args)
    while rest:
        arg = rest.pop(0)
        if arg in _IBPING_VALUE_OPTIONS and rest:
            values[arg] = rest.pop(0)
        elif arg.startswith("-"):
            flags.add(arg)
        else:
            positionals.append(arg)
    return values, flags, positionals


def _ms(microseconds: int) -> str:
    """ibping.c prints microsecond counts as "%lu.%03lu" ms."""
    return f"{microseconds // 1000}.{microseconds % 1000:03d}"


def ibping(hw: Hardware, args: list[str]) -> int:
    values, flags, positionals = _ibping_args(args)
    if "-S" in flags:  # server: answers pings until killed, prints nothing
        while True:
            time.sleep(3600)
    count = int(values.get("-c", 10))
    local = peers.hca_named(hw, values.get("-C"))
    if local is None:
        raise StubUsageError(f"iberror: failed: can't open UMAD port ({values.get('-C')}:1)")
    if not positionals:
        raise StubUsageError("Usage: ibping [-C ca_name -P ca_port -c ping_count -S(erver)] <dest lid|guid>")
    use_guid = "-G" in flags
    found = peers.port_by_guid(positionals[-1]) if use_guid else peers.port_by_lid(int(positionals[-1], 0))
    remote = None
    remote_name = ""
    if found:
        peer = peers.peer_hardware(found[0])
        if peer is not None and not peer.unreachable:
            remote = peers.hca_named(peer, found[1])
            remote_name = f"{peer.host}.(none)"
    lid = remote.lid if remote else (0 if use_guid else int(positionals[-1], 0))
    replies = []
    up = local.state == "Active" and remote is not None and remote.state == "Active"
    for i in range(count):
        if not up:
            continue
        # Extra link latency (ib_high_latency) adds to the round trip, printed a tenth as well.
        extra_us = (remote.latency_us - DEFAULT_LINK_LATENCY_US) + (local.latency_us - DEFAULT_LINK_LATENCY_US)
        rtt_us = int(MAD_RTT_PRINTED_US - 0.5 + (i * 7) % 3 + extra_us / 10)
        replies.append(rtt_us)
        print(f"Pong from {remote_name} (Lid {lid}): time {_ms(rtt_us)} ms")
    lost = count - len(replies)
    shown = remote_name if replies else ""
    print(f"\n--- {shown} (Lid {lid}) ibping statistics ---")
    print(f"{count} packets transmitted, {len(replies)} received, {lost * 100 // count if lost else 0}% packet loss, "
          f"time {count * 1000} ms")
    low = min(replies) if replies else 0
    avg = sum(replies) // len(replies) if replies else 0
    print(f"rtt min/avg/max = {_ms(low)}/{_ms(avg)}/{_ms(max(replies, default=0))} ms")
    return 0
