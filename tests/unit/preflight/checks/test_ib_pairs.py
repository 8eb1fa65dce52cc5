"""preflight/checks/ib_pairs.py with a scripted fabric: which node is blamed for a bad link, WARN for rack
outliers, servers always cleaned up."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from preflight.checks import ib_pairs
from preflight.checks.base import GatherError, RackContext, RunOptions
from preflight.profiles import profile_of
from preflight.result import Verdict
from preflight.transport import CommandResult
from tests.helpers.preflight import ScriptedTransport, context, fixture_text, node, only

pytestmark = pytest.mark.unit

LAT = fixture_text("perftest", "h100-ndr-ib_write_lat-perftest23.txt")
BW = fixture_text("perftest", "h100-ndr-ib_write_bw-report-gbits.txt")
PING = fixture_text("ibping", "h100-ndr-rdma-core50-count10-ok.txt")
PING_LOST = fixture_text("ibping", "unreachable-all-lost.txt")
IBSTAT = fixture_text("ibstat", "h100-hgx-cx7-ndr400-ib-plus-roce-storage.txt")
NICS = [
    {"device": f"mlx5_{i}", "netdev": f"ibp{i}s0", "rate_gbps": 400, "numa_node": i // 2, "gpu": 2 * i}
    for i in range(4)
]


class Fabric(ScriptedTransport):
    """Every node answers ibstat with its own port GUIDs; a perftest/ibping client's result is
    bad when ``bad(client, server, device, test)`` says so."""

    def __init__(self, names, bad=lambda client, server, device, test: None, fail_client=None):
        super().__init__()
        self.names = names
        self.bad = bad
        self.fail_client = fail_client
        self.address = {n: f"10.1.0.{k + 1}" for k, n in enumerate(names)}
        self.by_guid = {f"0x{k + 1:04x}{i:012x}": n for k, n in enumerate(names) for i in range(50)}

    def run(self, host, argv, timeout):
        argv = tuple(argv)
        with self._lock:
            self.calls.append((host.name, argv))
        k = self.names.index(host.name)
        if argv == ("ibstat",):  # node k's ports get GUIDs 0x<k>000000000000, 0x<k>000000000001, ...
            guid = iter(range(50))
            text = re.sub(
                r"Port GUID: 0x[0-9a-f]+", lambda _: f"Port GUID: 0x{k + 1:04x}{next(guid):012x}", IBSTAT
            )
            return CommandResult(0, text, "", 0.0)
        device = argv[argv.index("-C" if argv[0] == "ibping" else "-d") + 1]
        if argv[0] == "ibping":
            server, test = self.by_guid[argv[-1]], "ping"
        else:
            server = next(n for n, a in self.address.items() if a == argv[-1])
            test = "lat" if argv[0] == "ib_write_lat" else "bw"
        if self.fail_client and self.fail_client(host.name, test):
            return CommandResult(1, "", " Couldn't connect to 127.0.9.9:18515", 0.0)
        value = self.bad(host.name, server, device, test)
        if test == "ping":
            return CommandResult(0, PING_LOST if value else PING, "", 0.0)
        if test == "lat":
            return CommandResult(0, LAT.replace(" 1.02 ", f" {value or 1.02:.2f} "), "", 0.0)
        return CommandResult(0, BW.replace("392.41", f"{value or 392.41:.2f}"), "", 0.0)


def rack_run(names, transport, matrix="ring", overrides=None, facts=None):
    options = RunOptions(timeout=5, ib_matrix=matrix)
    contexts = [
        context(
            transport,
            node(n, rdma_nics=NICS, ansible_host=transport.address[n], preflight_overrides=overrides),
            ib_matrix=matrix,
        )
        for n in names
    ]
    gathered = facts or {c.node.name: ib_pairs.CHECK.gather(c) for c in contexts}
    with ThreadPoolExecutor(8) as pool:
        return ib_pairs.CHECK.run_rack(RackContext("r01", contexts, gathered, pool, options))


@pytest.fixture(autouse=True)
def no_settle(monkeypatch):
    monkeypatch.setattr(ib_pairs, "SERVER_SETTLE_S", 0.0)
    monkeypatch.setattr(ib_pairs, "CLIENT_RETRY_S", 0.0)


def test_rounds_ring_and_full_matrix():
    assert ib_pairs.rounds(1, "ring") == []
    assert ib_pairs.rounds(2, "ring") == [[(0, 1), (1, 0)]]
    assert ib_pairs.rounds(4, "ring") == [[(0, 1), (1, 2), (2, 3), (3, 0)]]
    full = ib_pairs.rounds(4, "full")
    assert len(full) == 3 and sorted(e for r in full for e in r) == [
        (a, b) for a in range(4) for b in range(4) if a != b
    ]
    for edges in full:  # each node sends once and receives once per round
        assert sorted(a for a, _ in edges) == sorted(b for _, b in edges) == [0, 1, 2, 3]


def test_healthy_rack_passes_and_every_server_is_stopped():
    names = ["a", "b", "c"]
    t = Fabric(names)
    results = rack_run(names, t)
    assert [(r.node, r.verdict) for r in results] == [(n, Verdict.PASS) for n in names]
    assert len(t.started) == 3 * 4 * 3  # 3 edges x 4 rails x (ibping, lat, bw)
    assert sorted(t.started) == sorted(t.stopped)
    lat = [a for h, a in t.calls if h == "a" and a[0] == "ib_write_lat"]
    assert lat[0][-1] == t.address["b"] and "-F" in lat[0]


def test_slow_hca_is_blamed_on_its_node_not_its_ring_neighbours():
    names = ["a", "b", "c", "d"]

    def bad(client, server, device, test):  # b's mlx5_2 is slow, whichever end of the test it is
        return 25.0 if test == "lat" and device == "mlx5_2" and "b" in (client, server) else None

    results = rack_run(names, Fabric(names, bad))
    blamed = only(results, node="b")
    assert (blamed.verdict, blamed.code) == (Verdict.FAIL, "IB_LATENCY")
    assert "25.0 us > 2.5 us" in blamed.reason
    for name in ("a", "c", "d"):
        assert only(results, node=name).verdict is Verdict.PASS
    assert only(results, node="a").reason == "7 of 8 tests with 2 peers OK; the bad links to b are theirs"


def test_low_bandwidth_and_lost_pings_fail():
    names = ["a", "b", "c"]
    low = rack_run(names, Fabric(names, lambda c, s, d, t: 95.0 if t == "bw" and "c" in (c, s) else None))
    assert only(low, node="c").code == "IB_BANDWIDTH"
    assert [r.verdict for r in low if r.node != "c"] == [Verdict.PASS, Verdict.PASS]
    lost = rack_run(names, Fabric(names, lambda c, s, d, t: t == "ping" and "a" in (c, s) and d == "mlx5_0"))
    assert only(lost, node="a").code == "IB_UNREACHABLE"


def test_link_far_below_the_rack_median_warns_even_above_the_floor():
    names = ["a", "b", "c", "d"]
    t = Fabric(names, lambda c, s, d, test: 365.0 if test == "bw" and (c, s) == ("b", "c") else None)
    results = rack_run(names, t, overrides={"ib": {"rack_outlier_fraction": 0.95}})
    # 365 >= 360 (90% of 400) but < 95% of the median 392.4: the link b->c is an outlier, both ends WARN.
    assert {r.node: r.verdict for r in results} == {
        "a": Verdict.PASS,
        "b": Verdict.WARN,
        "c": Verdict.WARN,
        "d": Verdict.PASS,
    }
    assert only(results, node="b").code == "IB_OUTLIER"


def test_two_node_rack_cannot_tell_which_end_and_fails_both():
    names = ["a", "b"]
    results = rack_run(names, Fabric(names, lambda c, s, d, t: 25.0 if t == "lat" else None))
    assert {r.verdict for r in results} == {Verdict.FAIL}
    assert all("cannot tell which end" in r.reason for r in results)


def test_servers_are_stopped_when_the_client_fails():
    names = ["a", "b", "c"]
    t = Fabric(names, fail_client=lambda host, test: host == "a" and test == "bw")
    results = rack_run(names, t)
    assert only(results, node="a").code == "IB_TEST_FAILED"
    assert len(t.started) == len(t.stopped) == 36
    assert [c for h, c in t.calls if h == "a" and c[0] == "ib_write_bw"].__len__() == 8  # one retry per rail


def test_full_matrix_tests_every_ordered_pair():
    names = ["a", "b", "c"]
    t = Fabric(names)
    results = rack_run(names, t, matrix="full")
    assert {r.verdict for r in results} == {Verdict.PASS}
    clients = {(h, a[-1]) for h, a in t.calls if a[0] == "ib_write_bw"}
    assert len(clients) == 6


def test_node_without_ibstat_is_an_error_and_the_rest_still_test():
    names = ["a", "b", "c"]
    t = Fabric(names)
    contexts = [context(t, node(n, rdma_nics=NICS, ansible_host=t.address[n])) for n in names]
    facts = {c.node.name: ib_pairs.CHECK.gather(c) for c in contexts}
    facts["c"] = GatherError("`ibstat` exited 127: ibstat: command not found")
    results = rack_run(names, t, facts=facts)
    assert only(results, node="c").verdict is Verdict.ERROR
    assert {r.verdict for r in results if r.node != "c"} == {Verdict.PASS}


def test_a_pair_rack_says_one_peer():
    # not "8 of 8 tests with 1 peers OK" on a two-node rack
    names = ["a", "b"]
    results = rack_run(names, Fabric(names))
    assert [r.verdict for r in results] == [Verdict.PASS, Verdict.PASS]
    assert re.fullmatch(r"\d+ of \d+ tests with 1 peer OK", only(results, node="a").reason)


# ----------------------------------------------------------------------------- evaluate, fed facts directly
def link(client, server, rail=0, **readings):
    """A healthy rail from client to server (the readings of the perftest fixtures), changed by ``readings``."""
    values = {"ping_loss_pct": 0.0, "ping_received": 10, "latency_us": 1.02, "bw_gbps": 392.41,
              "measured": ["ping", "lat", "bw"], **readings}
    return ib_pairs.Link(client, server, f"mlx5_{rail}", f"mlx5_{rail}", (400, 400), **values)


def rack_facts(names, links, overrides=None):
    nodes = [node(n, rdma_nics=NICS, preflight_overrides=overrides) for n in names]
    return ib_pairs.RackFacts("r01", nodes, {n.name: profile_of(n) for n in nodes}, links)


def evaluate_all(facts):
    return [r for n in facts.nodes for r in ib_pairs.CHECK.evaluate(facts, facts.profiles[n.name], n)]


def ring(names, bad=lambda client, server: {}):
    return [link(a, b, **bad(a, b)) for a, b in zip(names, names[1:] + names[:1], strict=True)]


def test_evaluate_blames_the_node_two_slow_links_share():
    names = ["a", "b", "c", "d"]
    results = evaluate_all(rack_facts(names, ring(names, lambda c, s: {"latency_us": 25.0} if "b" in (c, s) else {})))
    blamed = only(results, node="b")
    assert (blamed.verdict, blamed.code, blamed.reason) == (
        Verdict.FAIL, "IB_LATENCY", "ib_write_lat a mlx5_0 -> b: 25.0 us > 2.5 us (+1 more)")
    assert only(results, node="a").reason == "1 of 2 tests with 2 peers OK; the bad links to b are theirs"
    assert [r.verdict for r in results if r.node != "b"] == [Verdict.PASS] * 3
    assert only(results, node="a").evidence["found"][0] == {
        "client": "a", "server": "b", "device": "mlx5_0", "peer_device": "mlx5_0", "ping_loss_pct": 0.0,
        "latency_us": 25.0, "bw_gbps": 392.41, "problems": ["ib_write_lat a mlx5_0 -> b: 25.0 us > 2.5 us"]}


@pytest.mark.parametrize(("readings", "code", "reason"), [
    ({"ping_loss_pct": 20.0}, "IB_PING_LOSS", "ibping a mlx5_0 -> b: 20% loss"),
    ({"ping_received": 0, "ping_loss_pct": 100.0, "measured": ["ping"]}, "IB_UNREACHABLE",
     "ibping a mlx5_0 -> b mlx5_0: no reply"),
    ({"latency_us": None}, "IB_LATENCY", "ib_write_lat a mlx5_0 -> b: None us > 2.5 us"),
    ({"bw_gbps": 95.0}, "IB_BANDWIDTH", "ib_write_bw a mlx5_0 -> b: 95 Gb/s < 360 (90% of 400)"),
    ({"bw_gbps": None, "measured": ["ping", "lat"], "failures": [("bw", "IB_TEST_FAILED", "`ib_write_bw` exited 1")]},
     "IB_TEST_FAILED", "`ib_write_bw` exited 1"),
])
def test_evaluate_judges_each_reading_against_the_clients_limits(readings, code, reason):
    """A two-node rack: one bad link fails both ends, saying that it cannot tell which."""
    results = evaluate_all(rack_facts(["a", "b"], [link("a", "b", **readings), link("b", "a")]))
    assert [(r.node, r.verdict, r.code, r.reason) for r in results] == [
        (n, Verdict.FAIL, code, reason + " (cannot tell which end of this link is at fault)") for n in ("a", "b")]


def test_evaluate_warns_on_a_link_far_below_the_rack_median():
    names = ["a", "b", "c", "d"]
    facts = rack_facts(names, ring(names, lambda c, s: {"bw_gbps": 365.0} if (c, s) == ("b", "c") else {}),
                       overrides={"ib": {"rack_outlier_fraction": 0.95}})
    results = evaluate_all(facts)
    assert {r.node: (r.verdict, r.code) for r in results if r.verdict is not Verdict.PASS} == {
        "b": (Verdict.WARN, "IB_OUTLIER"), "c": (Verdict.WARN, "IB_OUTLIER")}
    assert facts.links[1].failures == []  # judging adds nothing to the facts


def test_evaluate_skips_a_node_without_peers():
    facts = rack_facts(["a"], [])
    assert [(r.verdict, r.code) for r in evaluate_all(facts)] == [(Verdict.SKIP, "IB_NO_PEERS")]


# ----------------------------------------------------------------------------- gather_rack, scripted fabric
def test_gather_rack_measures_every_rail_and_judges_nothing():
    names = ["a", "b", "c"]
    t = Fabric(names, lambda client, server, device, test: 25.0 if test == "lat" and client == "b" else None)
    contexts = [context(t, node(n, rdma_nics=NICS, ansible_host=t.address[n])) for n in names]
    facts = {c.node.name: ib_pairs.CHECK.gather(c) for c in contexts}
    with ThreadPoolExecutor(8) as pool:
        gathered = ib_pairs.CHECK.gather_rack(RackContext("r01", contexts, facts, pool, RunOptions(timeout=5)))
    assert [n.name for n in gathered.nodes] == names and sorted(gathered.profiles) == names
    assert [(x.client, x.server, x.device) for x in gathered.links] == [
        (a, b, f"mlx5_{i}") for a, b in (("a", "b"), ("b", "c"), ("c", "a")) for i in range(4)]
    for x in gathered.links:
        assert (x.measured, x.failures, x.ping_received, x.bw_gbps) == (["ping", "lat", "bw"], [], 10, 392.41)
        assert x.latency_us == (25.0 if x.client == "b" else 1.02)  # a reading, not yet a problem
    assert len(t.started) == len(t.stopped) == 3 * 4 * 3
