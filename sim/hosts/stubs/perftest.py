"""perftest clients and servers: ``ib_write_lat`` and ``ib_write_bw``.

Layout from perftest's src/perftest_parameters.h (RESULT_LINE of 87 dashes, RESULT_FMT_LAT with the
``t_avg``/``t_stdev``/percentile columns of perftest 4.5+, REPORT_FMT_LAT with its embedded tabs,
RESULT_FMT_G / REPORT_FMT for ``--report_gbits``) and the settings block that ``ctx_print_test_info``
prints (see linux-rdma/perftest#132, #240 for captured outputs).

The client's result is that of the link between its HCA and the same-named HCA of the server host (the
positional argument, resolved through the inventory's addresses): latency is the worse of both ends,
bandwidth the lower, capped at 95.5% of the negotiated rate. A port that is down on the client fails the
way perftest fails in ``check_link``; one that is down on the server fails the first completions.
"""

from __future__ import annotations

from sim.hosts.hardware import Hardware, Hca
from sim.hosts.stubs import peers
from sim.hosts.stubs.main import StubUsageError

RESULT_LINE = "-" * 87
LAT_HEADER = (
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   "
    "99% percentile[usec]   99.9% percentile[usec] "
)
BW_HEADER = " #bytes     #iterations    BW peak[{unit}]    BW average[{unit}]   MsgRate[Mpps]"
LINK_EFFICIENCY = 0.955  # RDMA write payload share of the NDR/HDR line rate (IB headers, 64b/66b)


class _Options:
    def __init__(self, args: list[str]):
        self.device: str | None = None
        self.ib_port = 1
        self.size: int | None = None
        self.iters: int | None = None
        self.all_sizes = False
        self.gbits = False
        self.server: str | None = None
        flags_with_value = {"-d", "--ib-dev", "-i", "--ib-port", "-s", "--size", "-n", "--iters", "-x", "-q",
                            "-p", "--port", "-D", "--duration", "-m", "--mtu", "-c", "--connection", "-I"}
        rest = list(args)
        while rest:
            arg = rest.pop(0)
            key, _, inline = arg.partition("=")
            if key in flags_with_value:
                value = inline or (rest.pop(0) if rest else "")
                if key in ("-d", "--ib-dev"):
                    self.device = value
                elif key in ("-i", "--ib-port"):
                    self.ib_port = int(value)
                elif key in ("-s", "--size"):
                    self.size = int(value)
                elif key in ("-n", "--iters"):
                    self.iters = int(value)
            elif arg in ("-a", "--all"):
                self.all_sizes = True
            elif arg == "--report_gbits":
                self.gbits = True
            elif not arg.startswith("-"):
                self.server = arg


def _settings(hw: Hardware, hca: Hca, title: str, bandwidth: bool) -> list[str]:
    roce = hca.link_layer == "ethernet"
    lines = [
        RESULT_LINE,
        f"                    {title}",
        f" Dual-port       : OFF\t\tDevice         : {hca.device}",
        " Number of qps   : 1\t\tTransport type : IB",
        " Connection type : RC\t\tUsing SRQ      : OFF",
        " PCIe relax order: ON" if bandwidth else " PCIe relax order: OFF",
        " ibv_wr* API     : ON",
        " TX depth        : 128" if bandwidth else " TX depth        : 1",
    ]
    if bandwidth:
        lines.append(" CQ Moderation   : 100")
    lines += [
        " Mtu             : 4096[B]",
        f" Link type       : {'Ethernet' if roce else 'IB'}",
    ]
    if roce:
        lines.append(" GID index       : 3")
    lines += [
        f" Max inline data : {0 if bandwidth else 220}[B]",
        " rdma_cm QPs\t : OFF",
        " Data ex. method : Ethernet",
        RESULT_LINE,
    ]
    return lines


def _roce_gid(address: str) -> str:
    """RoCEv2 GID of an IPv4 address, as perftest's GID_FMT prints it (decimal bytes, IPv4-mapped)."""
    octets = address.split(".")
    if len(octets) != 4 or not all(o.isdigit() for o in octets):
        octets = ["0", "0", "0", "0"]  # a host known only by name has no IPv4 GID
    return "00:00:00:00:00:00:00:00:00:00:255:255:" + ":".join(f"{int(o):02d}" for o in octets)


def _address_lines(local: Hca, remote: Hca | None, local_addr: str, remote_addr: str) -> list[str]:
    def one(side: str, hca: Hca, address: str, qpn: int) -> list[str]:
        lid = "0000" if hca.link_layer == "ethernet" else f"{hca.lid:#06x}"
        line = (f" {side} address: LID {lid} QPN {qpn:#06x} PSN {int(hca.guid[-6:], 16):#08x} "
                f"RKey 0x1fff{qpn & 0xff:02x} VAddr 0x{0x7f0000000000 + int(hca.guid[:9], 16):014x}")
        out = [line]
        if hca.link_layer == "ethernet":
            out.append(f" GID: {_roce_gid(address)}")
        return out

    lines = one("local", local, local_addr, 0x0123)
    if remote is not None:
        lines += one("remote", remote, remote_addr, 0x0124)
    return lines + [RESULT_LINE]


def _peer(hw: Hardware, opts: _Options) -> tuple[Hca, Hca | None, str, str]:
    local = peers.hca_named(hw, opts.device)
    if local is None:
        raise StubUsageError(f" IB device {opts.device} not found\n Unable to find the Infiniband/RoCE device")
    if opts.server is None:
        return local, None, "", ""
    peer_name = peers.host_by_address(opts.server)
    peer = peers.peer_hardware(peer_name) if peer_name else None
    if peer is None or peer.unreachable:
        raise StubUsageError(f"Couldn't connect to {opts.server}:18515\n"
                             " Unable to open file descriptor for socket connection Unable to init the socket "
                             "connection")
    remote = peers.hca_named(peer, local.device)
    if remote is None:
        raise StubUsageError(f"Couldn't connect to {opts.server}:18515")
    return local, remote, peers.address_of(hw.host), peers.address_of(peer_name)


def _check_ports(local: Hca, remote: Hca | None) -> str | None:
    if local.state != "Active":
        return f" Port number 1 state is {local.state}\n Couldn't set the link layer\n Couldn't get context for the device"
    if remote is not None and remote.link_layer != local.link_layer:
        # An InfiniBand port and a RoCE port are on different fabrics: the QPs never connect.
        return " Failed to modify QP 0x0123 to RTR\n Unable to Connect the HCA's through the link"
    if remote is not None and remote.state != "Active":
        return (" Completion with error at client\n Failed status 12: wr_id 0 syndrom 0x81\n"
                "scnt=1, ccnt=0")
    return None


def _prologue(hw: Hardware, args: list[str], title: str, bandwidth: bool):
    """What every perftest prints before its table: (opts, local, remote, lines), or None after a port failure."""
    opts = _Options(args)
    local, remote, local_addr, remote_addr = _peer(hw, opts)
    if opts.server is None:
        print("\n************************************\n* Waiting for client to connect... *\n"
              "************************************")
        remote = local  # the server prints the same table once the client has run
    out = _settings(hw, local, title, bandwidth=bandwidth)
    failure = _check_ports(local, remote)
    if failure:
        print("\n".join(out))
        print(failure)
        return None
    out += _address_lines(local, remote if opts.server else None, local_addr, remote_addr)
    return opts, local, remote, out


def ib_write_lat(hw: Hardware, args: list[str]) -> int:
    started = _prologue(hw, args, "RDMA_Write Latency Test", bandwidth=False)
    if started is None:
        return 1
    opts, local, remote, out = started
    out.append(LAT_HEADER)
    typical = max(local.latency_us, remote.latency_us if remote else 0.0)
    sizes = [2 ** k for k in range(1, 24)] if opts.all_sizes else [opts.size or 2]
    iters = opts.iters or 1000
    for size in sizes:
        # Serialisation adds size / line rate; small messages are dominated by the fixed latency.
        t = typical + size * 8 / (min(local.rate_gbps, remote.rate_gbps if remote else local.rate_gbps) * 1000)
        row = (t * 0.96, t * 3.4, t, t * 1.01, 0.05 * t, t * 1.18, t * 3.4)
        out.append(
            f" {size:<7d} {iters}          {row[0]:<7.2f}        {row[1]:<7.2f}      {row[2]:<7.2f}  \t       "
            f"{row[3]:<7.2f}     \t{row[4]:<7.2f}\t\t{row[5]:<7.2f} \t\t{row[6]:<7.2f}"
        )
    out.append(RESULT_LINE)
    print("\n".join(out))
    return 0


def ib_write_bw(hw: Hardware, args: list[str]) -> int:
    started = _prologue(hw, args, "RDMA_Write BW Test", bandwidth=True)
    if started is None:
        return 1
    opts, local, remote, out = started
    unit = "Gb/sec" if opts.gbits else "MB/sec"
    out.append(BW_HEADER.format(unit=unit))
    rate = min(local.rate_gbps, remote.rate_gbps if remote else local.rate_gbps)
    peak_gbps = min(local.bw_gbps, remote.bw_gbps if remote else local.bw_gbps, rate * LINK_EFFICIENCY)
    sizes = [2 ** k for k in range(1, 24)] if opts.all_sizes else [opts.size or 65536]
    iters = opts.iters or 5000
    for size in sizes:
        # Small writes are message-rate bound (~200 Mpps on ConnectX-7), large ones reach the link peak.
        avg_gbps = min(peak_gbps, size * 8 * 200e6 / 1e9) * size / (size + 512)
        peak = avg_gbps * 1.0015
        factor = 1.0 if opts.gbits else 1e9 / 8 / 1048576  # perftest's MB is 2^20 bytes
        mpps = avg_gbps * 1e9 / 8 / size / 1e6
        out.append(f" {size:<7d}    {iters:<10d}       {peak * factor:<7.2f}            {avg_gbps * factor:<7.2f}"
                   f"\t\t   {mpps:<7.6f}")
    out.append(RESULT_LINE)
    print("\n".join(out))
    return 0
