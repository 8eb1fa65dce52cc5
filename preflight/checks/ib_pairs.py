"""ib_pairs: host-to-host fabric tests between the nodes of each rack, rail by rail.

Edges: a ring by default (node i -> i+1, the last back to the first), every ordered pair with
``--ib-matrix full``. Edges are scheduled in rounds in which each node sends to one peer and receives
from one peer, so bandwidth tests never share a port. Per round and rail (same HCA index on both ends):

1. ``ibping -G <port GUID>`` (InfiniBand only; the GUID from the server's ``ibstat``): reachability and
   0 % loss. Its RTT is not used: rdma-core's ibping has
   printed RTTs 10x too small since 2019, latency comes from perftest.
2. ``ib_write_lat``: typical latency <= ``ib.write_lat_max_us`` (2.5 us, ngc_multinode_perf).
3. ``ib_write_bw --report_gbits``: average >= ``ib.write_bw_min_fraction`` x port rate; a link below
   ``ib.rack_outlier_fraction`` x the rack's median is WARN even above the floor.

Servers are started through the transport, given a life limit on the host, and always stopped in a
``finally`` (also when the client fails or the run is interrupted).

Measuring and judging are apart: ``gather`` (per node, with the node checks) reads ``ibstat`` for the
peers' GUIDs/LIDs; ``gather_rack`` runs the pair tests and returns :class:`RackFacts` (one :class:`Link`
per rail and direction: readings, and the tests that gave none); the pure ``evaluate(facts, profile,
node)`` judges every link against its client's profile, flags the rack outliers and gives the node its
result. ``run_rack`` is ``gather_rack`` then ``evaluate`` for each node tested.

A bad measurement implicates both ends. A node FAILs when bad measurements involve it with two or more
peers; a node whose only bad link leads to such a peer PASSes (the fault is the peer's). A single bad
link between two otherwise good nodes (and any bad link in a two-node rack) FAILs both ends, saying
so: from the hosts alone one cannot tell which cable or port it is.

Fault codes: IB_UNREACHABLE, IB_PING_LOSS, IB_LATENCY, IB_BANDWIDTH, IB_OUTLIER, IB_TEST_FAILED,
IB_NO_PEERS, IB_PAIRS_OK.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from cluster.model import Nic, Node
from common.text import plural
from preflight.checks.base import Check, GatherError, NodeContext, RackContext, command_line, parse_output
from preflight.checks.ib_ports import IBSTAT, find_port
from preflight.result import CheckResult, Verdict

PERFTEST_PORT_BASE = 18515  # perftest's default TCP port for the out-of-band exchange
SERVER_SETTLE_S = 0.2  # let a server bind before its client connects (a refused client retries once)
CLIENT_RETRY_S = 1.0  # one retry when the client raced its server's listen()
SEVERITY = {
    "IB_UNREACHABLE": 3,
    "IB_TEST_FAILED": 3,
    "IB_PING_LOSS": 2,
    "IB_LATENCY": 2,
    "IB_BANDWIDTH": 2,
    "IB_OUTLIER": 1,
}


@dataclass
class Link:
    """What ``gather_rack`` measured on one rail from a client to a server, without a verdict: the readings,
    and each test that gave none (``failures``: test, code, text, in the order they ran)."""

    client: str
    server: str
    device: str  # the client's HCA; the server uses the HCA with the same index (rail)
    peer_device: str
    rates_gbps: tuple[float | None, float | None] = (None, None)  # the client's and the server's port rate
    ping_loss_pct: float | None = None
    ping_received: int | None = None
    latency_us: float | None = None
    bw_gbps: float | None = None
    measured: list[str] = field(default_factory=list)  # the tests ("ping", "lat", "bw") that gave a reading
    failures: list[tuple[str, str, str]] = field(default_factory=list)

    @property
    def unreachable(self) -> bool:
        """No GUID/LID to ping, or no ibping reply: the perftests are not run."""
        return self.ping_received == 0 or any(code == "IB_UNREACHABLE" for _, code, _ in self.failures)


@dataclass
class RackFacts:
    """A rack's ib_pairs facts: the nodes tested (RDMA NICs, ibstat read; inventory order), each one's
    profile (a link is judged by its client's limits) and every link measured between them."""

    rack: str
    nodes: list[Node]
    profiles: dict[str, dict[str, Any]]
    links: list[Link] = field(default_factory=list)


@dataclass
class Measurement:
    """A link as judged by ``evaluate``: its readings and the problems found (code, text)."""

    client: str
    server: str
    device: str
    peer_device: str
    ping_loss_pct: float | None = None
    latency_us: float | None = None
    bw_gbps: float | None = None
    rate_gbps: float | None = None
    problems: list[tuple[str, str]] = field(default_factory=list)  # (code, text)

    def to_json(self) -> dict[str, Any]:
        return {
            "client": self.client,
            "server": self.server,
            "device": self.device,
            "peer_device": self.peer_device,
            "ping_loss_pct": self.ping_loss_pct,
            "latency_us": self.latency_us,
            "bw_gbps": self.bw_gbps,
            "problems": [text for _, text in self.problems],
        }


def rounds(count: int, matrix: str) -> list[list[tuple[int, int]]]:
    """Directed edges (client, server) by round; in each round every node sends once and receives once."""
    if count < 2:
        return []
    # A ring needs one direction only: node i sends to i+1 and receives from i-1, so every node's send and
    # receive side is measured once; either end's fault shows on the client as on a real fabric.
    shifts = range(1, count) if matrix == "full" else [1]
    return [[(i, (i + shift) % count) for i in range(count)] for shift in shifts]


def gbps(row) -> float:
    # perftest "MB/sec" is 2^20 bytes/s (perftest_parameters.h: #define MEGA 1048576 when not --report_gbits)
    return row.bw_avg if row.bw_unit.lower().startswith("gb") else row.bw_avg * 8 * 1048576 / 1e9


class IbPairs(Check):
    name = "ib_pairs"
    scope = "rack"
    codes = {
        "IB_UNREACHABLE": "ibping got no answer",
        "IB_PING_LOSS": "ibping lost packets",
        "IB_LATENCY": "ib_write_lat typical latency above the profile's limit",
        "IB_BANDWIDTH": "ib_write_bw below the profile's fraction of the port rate",
        "IB_OUTLIER": "ib_write_bw far below the rack's median (WARN)",
        "IB_TEST_FAILED": "a perftest client failed or printed no result",
        "IB_NO_PEERS": "no other reachable node in the rack",
    }

    def gather(self, ctx: NodeContext) -> Any:  # the peers' port GUIDs/LIDs for ibping
        return (
            ctx.parsed("ibstat", IBSTAT) if any(n.link_layer == "infiniband" for n in ctx.node.nics) else None
        )

    def run_rack(self, ctx: RackContext) -> list[CheckResult]:
        """gather_rack (the pair tests), then the pure evaluate for each node tested."""
        # A node whose ibstat could not be read is an ERROR here; the others still test among themselves.
        results = [self.error(c.node, ctx.facts[c.node.name]) for c in ctx.nodes
                   if isinstance(ctx.facts.get(c.node.name), GatherError)]
        facts = self.gather_rack(ctx)
        return results + [r for n in facts.nodes for r in self.evaluate(facts, facts.profiles[n.name], n)]

    # ---------------------------------------------------------------- gather: the pair tests, by round
    def gather_rack(self, ctx: RackContext) -> RackFacts:
        """Run the pair tests between the rack's nodes that have RDMA NICs and whose ibstat was read (the
        only part of ib_pairs that runs commands besides ``gather``); readings only, nothing judged."""
        nodes = [c for c in ctx.nodes if c.node.nics and not isinstance(ctx.facts.get(c.node.name), GatherError)]
        facts = RackFacts(ctx.rack, [c.node for c in nodes], {c.node.name: c.profile for c in nodes})
        if len(nodes) < 2:
            return facts
        for edges in rounds(len(nodes), ctx.options.ib_matrix):
            facts.links += self._round(ctx, [(nodes[a], nodes[b]) for a, b in edges])
        return facts

    def _round(self, ctx: RackContext, edges: list[tuple[NodeContext, NodeContext]]) -> list[Link]:
        jobs = []
        for client, server in edges:
            for rail, (cnic, snic) in enumerate(zip(client.node.nics, server.node.nics, strict=False)):
                link = Link(client.node.name, server.node.name, cnic.device, snic.device,
                            rates_gbps=(cnic.rate_gbps, snic.rate_gbps))
                jobs.append((client, server, rail, cnic, snic, link))
        self._stage(ctx, jobs, "ping", self._ping)
        self._stage(ctx, jobs, "lat", self._latency)
        self._stage(ctx, jobs, "bw", self._bandwidth)
        return [job[-1] for job in jobs]

    def _stage(self, ctx: RackContext, jobs, test_name: str, test) -> None:
        def guarded(job) -> None:
            try:
                test(ctx, *job)
            except Exception as exc:  # one broken test must not stop the rest of the rack
                job[-1].failures.append((test_name, "IB_TEST_FAILED", f"{type(exc).__name__}: {exc}"))

        ctx.map(guarded, jobs)

    def _ping(self, ctx, client: NodeContext, server: NodeContext, rail: int, cnic: Nic, snic: Nic, link: Link):
        if cnic.link_layer != "infiniband" or snic.link_layer != "infiniband":
            return  # ibping speaks IB management datagrams; RoCE has no LIDs
        port = find_port(ctx.facts.get(server.node.name), snic.device, snic.port)
        # The port GUID is fixed in the HCA; a LID is whatever the subnet manager handed out last.
        if port is not None and port.port_guid:
            destination = ["-G", port.port_guid]
        elif port is not None and port.base_lid:
            destination = ["-L", str(port.base_lid)]
        else:
            link.failures.append(
                ("ping", "IB_UNREACHABLE", f"{server.node.name} {snic.device} has no GUID/LID (port down?)")
            )
            return
        count = client.profile["ib"]["ping_count"]
        server_argv = ["ibping", "-S", "-C", snic.device, "-P", str(snic.port)]
        client_argv = ["ibping", "-C", cnic.device, "-P", str(cnic.port), "-c", str(count), *destination]
        out = self._with_server(ctx, client, server, server_argv, client_argv, link, "ping")
        if out is None:
            return
        try:
            ping = parse_output("ibping", out, command_line(client_argv))
        except GatherError as exc:
            link.failures.append(("ping", "IB_TEST_FAILED", exc.reason))
            return
        link.ping_loss_pct, link.ping_received = ping.loss_pct, ping.received
        link.measured.append("ping")

    def _perftest_argv(
        self, program: str, node: NodeContext, nic: Nic, rail: int, extra: list[str]
    ) -> list[str]:
        argv = [
            program,
            "-d",
            nic.device,
            "-i",
            str(nic.port),
            "-p",
            str(PERFTEST_PORT_BASE + rail),
            "-F",
            *extra,
        ]
        if nic.link_layer == "ethernet":  # RoCEv2 GID (index 3 on a default mlx5 port with IPv4)
            argv += ["-x", str(node.node.settings.preflight.roce_gid_index)]
        return argv

    def _latency(self, ctx, client, server, rail, cnic, snic, link: Link):
        if link.unreachable:
            return
        server_argv = self._perftest_argv("ib_write_lat", server, snic, rail, [])
        client_argv = self._perftest_argv("ib_write_lat", client, cnic, rail, [server.node.address])
        out = self._with_server(ctx, client, server, server_argv, client_argv, link, "lat")
        row = self._last_row(out, client_argv, link, "lat")
        if row is None:
            return
        link.latency_us = row.t_typical_us
        link.measured.append("lat")

    def _bandwidth(self, ctx, client, server, rail, cnic, snic, link: Link):
        if link.unreachable:
            return
        server_argv = self._perftest_argv("ib_write_bw", server, snic, rail, ["--report_gbits"])
        client_argv = self._perftest_argv(
            "ib_write_bw", client, cnic, rail, ["--report_gbits", server.node.address]
        )
        out = self._with_server(ctx, client, server, server_argv, client_argv, link, "bw")
        row = self._last_row(out, client_argv, link, "bw")
        if row is None:
            return
        link.bw_gbps = round(gbps(row), 2)
        link.measured.append("bw")

    def _last_row(self, out: str | None, argv: list[str], link: Link, test_name: str):
        if out is None:
            return None
        try:
            rows = parse_output("perftest", out, command_line(argv)).rows
        except GatherError as exc:
            link.failures.append((test_name, "IB_TEST_FAILED", exc.reason))
            return None
        return rows[-1]

    def _with_server(
        self,
        ctx: RackContext,
        client: NodeContext,
        server: NodeContext,
        server_argv,
        client_argv,
        link: Link,
        test_name: str,
    ) -> str | None:
        """Run a client against a server started just for it; the server is stopped whatever happens."""
        limit = ctx.options.timeout * 2 + 30
        background = server.transport.start(server.node, server_argv, limit)
        try:
            time.sleep(SERVER_SETTLE_S)
            result = client.transport.run(client.node, client_argv, ctx.options.timeout)
            if not result.ok and not result.timed_out and not result.unreachable:
                time.sleep(CLIENT_RETRY_S)  # the server may not have been listening yet
                result = client.transport.run(client.node, client_argv, ctx.options.timeout)
        finally:
            background.stop()
        if not result.ok:
            why = "timed out" if result.timed_out else f"{result.ended()}: {result.last_line()}"
            link.failures.append(
                (test_name, "IB_TEST_FAILED", f"`{command_line(client_argv)}` on {client.node.name} {why}")
            )
            return None
        return result.stdout

    # ---------------------------------------------------------------- evaluate: limits, rack median, attribution
    def evaluate(self, facts: RackFacts, profile: dict[str, Any], node: Node) -> list[CheckResult]:
        """This node's result from the rack's links (pure): each link judged by its client's limits, the
        rack median, then which end a bad link is blamed on."""
        if len(facts.nodes) < 2:
            return [self.result(node, Verdict.SKIP, "IB_NO_PEERS", "no peer in the rack to test against")]
        measurements = [judge_link(link, facts.profiles[link.client]["ib"]) for link in facts.links]
        flag_outliers(measurements, facts.profiles[facts.nodes[0].name]["ib"]["rack_outlier_fraction"])
        return [self._attribute(node, profile, [n.name for n in facts.nodes], measurements)]

    def _attribute(
        self, node: Node, profile: dict[str, Any], names: list[str], measurements: list[Measurement]
    ) -> CheckResult:
        peers: dict[str, set[str]] = {name: set() for name in names}
        bad_peers: dict[str, set[str]] = {name: set() for name in names}
        for m in measurements:
            peers[m.client].add(m.server)
            peers[m.server].add(m.client)
            if m.problems:
                bad_peers[m.client].add(m.server)
                bad_peers[m.server].add(m.client)

        def culprit(name: str) -> bool:  # bad with two or more peers: the common end is the fault
            return len(bad_peers[name]) >= 2

        name = node.name
        mine = [m for m in measurements if name in (m.client, m.server)]
        evidence = {"expected": expected(profile), "found": [m.to_json() for m in mine]}
        own = [
            m
            for m in mine
            if m.problems and (culprit(name) or not culprit(m.server if m.client == name else m.client))
        ]
        if not own:
            elsewhere = sorted(bad_peers[name])
            good = sum(1 for m in mine if not m.problems)
            reason = f"{good} of {plural(len(mine), 'test')} with {plural(len(peers[name]), 'peer')} OK"
            if elsewhere:
                reason += f"; the bad links to {', '.join(elsewhere)} are theirs"
            return self.result(node, Verdict.PASS, "IB_PAIRS_OK", reason, **evidence)
        code, text = max(
            ((c, t) for m in own for c, t in m.problems), key=lambda p: SEVERITY.get(p[0], 0)
        )
        verdict = (
            Verdict.WARN if all(c == "IB_OUTLIER" for m in own for c, _ in m.problems) else Verdict.FAIL
        )
        count = sum(len(m.problems) for m in own)
        if not culprit(name):
            text += " (cannot tell which end of this link is at fault)"
        return self.result(
            node,
            verdict,
            code,
            text + (f" (+{count - 1} more)" if count > 1 else ""),
            **evidence,
        )


def judge_link(link: Link, ib: dict[str, Any]) -> Measurement:
    """One link against its client's ``ib`` limits; the problems in the order the tests ran, a test that
    gave no reading as its failure."""
    rate = min(r for r in (*link.rates_gbps, ib["port_rate_gbps"]) if r)
    m = Measurement(link.client, link.server, link.device, link.peer_device, link.ping_loss_pct,
                    link.latency_us, link.bw_gbps, rate)
    for test in ("ping", "lat", "bw"):
        m.problems += [(code, text) for name, code, text in link.failures if name == test]
        if test not in link.measured:
            continue
        if test == "ping" and link.ping_received == 0:
            m.problems.append(
                ("IB_UNREACHABLE", f"ibping {link.client} {link.device} -> {link.server} {link.peer_device}: no reply")
            )
        elif test == "ping" and link.ping_loss_pct > ib["ping_max_loss_pct"]:
            m.problems.append(
                ("IB_PING_LOSS", f"ibping {link.client} {link.device} -> {link.server}: {link.ping_loss_pct:g}% loss")
            )
        elif test == "lat" and (link.latency_us is None or link.latency_us > ib["write_lat_max_us"]):
            m.problems.append(
                (
                    "IB_LATENCY",
                    f"ib_write_lat {link.client} {link.device} -> {link.server}: "
                    f"{link.latency_us} us > {ib['write_lat_max_us']:g} us",
                )
            )
        elif test == "bw" and link.bw_gbps < ib["write_bw_min_fraction"] * rate:
            floor = ib["write_bw_min_fraction"] * rate
            m.problems.append(
                (
                    "IB_BANDWIDTH",
                    f"ib_write_bw {link.client} {link.device} -> {link.server}: {link.bw_gbps:g} Gb/s "
                    f"< {floor:g} ({ib['write_bw_min_fraction']:.0%} of {rate:g})",
                )
            )
    return m


def flag_outliers(measurements: list[Measurement], fraction: float) -> None:
    """IB_OUTLIER on a link with no other problem far below the rack's median bandwidth."""
    values = [m.bw_gbps for m in measurements if m.bw_gbps is not None]
    if len(values) < 3:
        return  # a median of two says nothing about which one is the outlier
    median = statistics.median(values)
    for m in measurements:
        if m.bw_gbps is not None and not m.problems and m.bw_gbps < fraction * median:
            m.problems.append(
                (
                    "IB_OUTLIER",
                    f"ib_write_bw {m.device} {m.client} -> {m.server}: {m.bw_gbps:g} Gb/s "
                    f"< {fraction:.0%} of rack median {median:g}",
                )
            )


def expected(profile: dict[str, Any]) -> dict[str, Any]:
    ib = profile["ib"]
    return {
        "ping_max_loss_pct": ib["ping_max_loss_pct"],
        "write_lat_max_us": ib["write_lat_max_us"],
        "write_bw_min_fraction": ib["write_bw_min_fraction"],
        "rack_outlier_fraction": ib["rack_outlier_fraction"],
    }


CHECK = IbPairs()
