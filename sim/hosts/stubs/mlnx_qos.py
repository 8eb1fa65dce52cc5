"""``mlnx_qos -i <netdev>`` (MLNX_OFED mlnx-tools, python/mlnx_qos ``pretty_print``) for RoCE netdevs.

A provisioned RoCE port trusts DSCP, has PFC on priority 3 (the RoCE traffic class of NVIDIA's RoCE
configuration guide) and uses the mlx5 default priority -> TC map (prio 0 -> TC1, prio 1 -> TC0). The
tc lines come out in the order mlnx_qos builds its tc2up dict (first priority's TC first).
IPoIB netdevs have no DCB: mlnx_qos fails on them.
"""

from __future__ import annotations

from sim.hosts.hardware import Hardware
from sim.hosts.stubs.main import StubUsageError

PRIO_TO_TC = [1, 0, 2, 3, 4, 5, 6, 7]  # mlx5 default
ROCE_PRIORITY = 3


CHANGE_OPTIONS = {"-f": "--pfc", "--pfc": "--pfc", "--trust": "--trust", "--dscp2prio": "--dscp2prio", "-p": "-p",
                  "-s": "-s", "-t": "-t", "-r": "-r"}


def _changes(args: list[str]) -> list[tuple[str, str]]:
    """(long option, value) of every setting on the command line (``--pfc 0,0,0,1,0,0,0,0`` or ``--pfc=...``)."""
    out = []
    for i, arg in enumerate(args):
        option, _, value = arg.partition("=")
        if option in CHANGE_OPTIONS:
            if not value:
                if i + 1 >= len(args):
                    raise StubUsageError(f"{arg}: needs a value")
                value = args[i + 1]
            out.append((CHANGE_OPTIONS[option], value))
    return out


def main(hw: Hardware, args: list[str]) -> int:
    netdev = None
    for i, arg in enumerate(args):
        if arg in ("-i", "--interface") and i + 1 < len(args):
            netdev = args[i + 1]
        elif arg.startswith("--interface="):
            netdev = arg.split("=", 1)[1]
    if netdev is None:
        print("Interface name is required")
        print("Usage: mlnx_qos -i <interface> [options]")
        return 1
    changes = _changes(args)
    hca = next((h for h in hw.hcas if h.netdev == netdev), None)
    if hca is None:
        print(f"[Errno 19] No such device: {netdev}")
        return 1
    if hca.link_layer != "ethernet":
        print("[Errno 95] Operation not supported")
        return 1
    if changes:
        # The simulated port is in the provisioned state (above): setting that state again is what
        # roce-dcqcn's boot script does, and succeeds silently; any other setting cannot be kept here.
        wanted = {"--trust": "dscp", "--pfc": ",".join("1" if p == ROCE_PRIORITY else "0" for p in range(8))}
        for option, value in changes:
            if option == "--dscp2prio":
                action, dscp, prio = (value.split(",") + ["", "", ""])[:3]
                if action == "set" and dscp.isdigit() and prio == str(ROCE_PRIORITY) and int(dscp) >> 3 == ROCE_PRIORITY:
                    continue
            elif wanted.get(option) == value:
                continue
            raise StubUsageError(f"{option} {value}: only the provisioned QoS state (trust dscp, PFC and DSCP "
                                 f"{ROCE_PRIORITY * 8}-{ROCE_PRIORITY * 8 + 7} on priority {ROCE_PRIORITY}) is simulated")
        return 0
    out = ["DCBX mode: OS controlled", "Priority trust state: dscp", "dscp2prio mapping:"]
    for prio in range(8):
        dscps = ",".join(f"{d:02d}" for d in range(prio * 8 + 7, prio * 8 - 1, -1)) + ","
        out.append(f"\tprio:{prio} dscp:{dscps}")
    out += [
        "default priority:",
        "Receive buffer size (bytes): 130944,130944,0,0,0,0,0,0,total_size=1027968",
        "Cable len: 7",
        "PFC configuration:",
        "\tpriority    0   1   2   3   4   5   6   7",
        "\tenabled     " + "".join(f"{1 if p == ROCE_PRIORITY else 0:1d}   " for p in range(8))
        + "\n\tbuffer      " + "".join(f"{1 if p == ROCE_PRIORITY else 0:1d}   " for p in range(8)),
    ]
    tc2up: dict[int, list[int]] = {}
    for prio, tc in enumerate(PRIO_TO_TC):
        tc2up.setdefault(tc, []).append(prio)
    for tc, prios in tc2up.items():
        out.append(f"tc: {tc} ratelimit: unlimited, tsa: vendor")
        out += [f"\t priority:  {p}" for p in prios]
    print("\n".join(out))
    return 0
