#!/usr/bin/env python3
"""What one refresh of every IU instance costs a Consul reader (the edge's catalog watch, the operate tools):
requests and wall time at 4 / 32 / 128 nodes, reading every service each time vs reading what changed.

    .venv/bin/python bench/consul_refresh_cost.py               # 4, 32, 128 nodes; 15 refreshes per cell
    .venv/bin/python bench/consul_refresh_cost.py --nodes 32 --repeat 5   # quick

A dev Consul server (``clusterctl dev consul``, its own process, on 127.0.75.2) holds N nodes with 2 IUs
each, registered as the roles register them (each node's service ``vllm-iu-<node>``, one ``/health`` check
per IU). Two readers refresh it in turn, each with its own HTTP session and counting its requests:

- ``every service``: ``GET health/state/any`` + ``GET catalog/services`` + ``GET health/service/<name>`` for
  every IU service, on every refresh (a reader that keeps nothing between refreshes);
- ``what changed``: the shipped ``ConsulIO.health_service`` (``consul_io/iu_listing.py``).

Three cases per size: ``idle`` (nothing changed: a blocking query that ran out its wait), ``one check`` (one
IU's check flipped between passing and critical, what happens most: health changes, maintenance on and off)
and ``one registration`` (one IU re-registered at a new address). Printed per cell: requests per refresh
and the median wall time of a refresh (ms), both readers measured on the same server state.

Target: a refresh after at most one check change costs at most 3 requests at every size (2 + the one
service), and at 128 nodes its median wall time is at most 0.5x reading every service. ``met`` only when
both hold. A registration change still reads every service (catalog/services does not say which one
moved); that row is printed, not judged.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import requests  # noqa: E402
import results  # noqa: E402
from edge_procs import DevConsul  # noqa: E402
from verdict import shown  # noqa: E402

from consul_io import layout  # noqa: E402
from consul_io.client import ConsulIO  # noqa: E402

HOST = "127.0.75.2"
IUS_PER_NODE = 2
MAX_REQUESTS = 3  # a refresh after one check change: the two cluster-wide lists + that one service
MAX_WALL_RATIO = 0.5  # at the largest size, what changed / every service
CASES = ("idle", "one check", "one registration")


class Reader:
    """One reader's client, counting its HTTP requests."""

    def __init__(self, address: str):
        self.io = ConsulIO(address, timeout_s=10.0)
        self.count = 0
        self.io.client.http.session.hooks["response"].append(self._counted)

    def _counted(self, response, *args, **kwargs) -> None:
        self.count += 1

    def every_service(self) -> list:
        """The two cluster-wide lists and every IU service, nothing kept from the last refresh."""
        client = self.io.client
        client.health.state("any", filter_expr=None)
        _, names = client.catalog.services()
        return [e for name in sorted(n for n in names if layout.is_iu_service(n))
                for e in client.health.service(name)[1]]

    def what_changed(self) -> list:
        return self.io.health_service()[1]


def _register(session: requests.Session, base: str, node: str, k: int, address: str, status: str) -> None:
    iu = layout.iu_id(node, k)
    answer = session.put(f"{base}/v1/catalog/register", timeout=10, json={
        "Node": node, "Address": HOST,
        "Service": {"ID": iu, "Service": layout.iu_service(node), "Address": address, "Port": 8000 + k,
                    "Tags": [layout.node_tag(node)], "Meta": {"node": node}},
        "Checks": [{"CheckID": layout.health_check_id(iu), "Name": "vLLM health", "Status": status,
                    "ServiceID": iu}]})
    answer.raise_for_status()


def measure(address: str, nodes: int, repeat: int) -> dict:
    """{(case, reader): (requests per refresh, median wall ms)} for one cluster size."""
    base, session = f"http://{address}", requests.Session()
    names = [f"s{nodes}n{n:03d}" for n in range(nodes)]
    for node in names:
        for k in range(IUS_PER_NODE):
            _register(session, base, node, k, HOST, "passing")
    readers = {"every service": Reader(address), "what changed": Reader(address)}
    for reader in readers.values():
        reader.what_changed() if reader is readers["what changed"] else reader.every_service()
    cells: dict = {}
    try:
        for case in CASES:
            samples: dict = {name: ([], []) for name in readers}
            for n in range(repeat):
                if case == "one check":
                    _register(session, base, names[n % nodes], 0, HOST, ("critical", "passing")[n // nodes % 2])
                elif case == "one registration":
                    _register(session, base, names[n % nodes], 1, f"127.0.75.{10 + n % 200}", "passing")
                for name, reader in readers.items():
                    before, started = reader.count, time.perf_counter()
                    reader.what_changed() if name == "what changed" else reader.every_service()
                    samples[name][1].append(1000 * (time.perf_counter() - started))
                    samples[name][0].append(reader.count - before)
            for name, (counts, walls) in samples.items():
                cells[(case, name)] = (max(counts), statistics.median(walls))
    finally:
        for node in names:
            session.put(f"{base}/v1/catalog/deregister", json={"Node": node}, timeout=10)
    return cells


def report(table: dict[int, dict], numbers: dict) -> list[str]:
    sizes = sorted(table)
    lines = [f"{'nodes':>5} {'case':<17} | {'every service':>22} | {'what changed':>22}",
             f"{'':>5} {'':<17} | {'requests':>9} {'wall ms':>12} | {'requests':>9} {'wall ms':>12}"]
    for size in sizes:
        for case in CASES:
            old, new = table[size][(case, "every service")], table[size][(case, "what changed")]
            lines.append(f"{size:>5} {case:<17} | {old[0]:>9} {old[1]:>12.2f} | {new[0]:>9} {new[1]:>12.2f}")
            numbers.setdefault(f"{size} nodes", {})[case] = {
                "every_service": {"requests": old[0], "wall_ms": round(old[1], 2)},
                "what_changed": {"requests": new[0], "wall_ms": round(new[1], 2)}}
    worst = max(table[s][(c, "what changed")][0] for s in sizes for c in ("idle", "one check"))
    largest = sizes[-1]
    ratio = table[largest][("one check", "what changed")][1] / table[largest][("one check", "every service")][1]
    numbers["most_requests_after_one_check"] = worst
    numbers[f"wall_ratio_one_check_{largest}_nodes"] = round(ratio, 3)
    met = worst <= MAX_REQUESTS and ratio <= MAX_WALL_RATIO
    lines.append(f"target: at most {MAX_REQUESTS} requests per refresh after one check change at every size "
                 f"({worst} at most), and at {largest} nodes wall time <= {MAX_WALL_RATIO}x every service's "
                 f"({shown(ratio, MAX_WALL_RATIO)}x): {'met' if met else 'NOT met'}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="4,32,128", help="cluster sizes, comma-separated")
    parser.add_argument("--repeat", type=int, default=15, help="refreshes per case and size")
    results.add_argument(parser, __file__)
    args = parser.parse_args()
    with DevConsul(HOST) as server:
        table = {size: measure(server.address, size, args.repeat) for size in (int(n) for n in args.nodes.split(","))}
    numbers: dict = {"ius_per_node": IUS_PER_NODE, "refreshes_per_cell": args.repeat}
    lines = report(table, numbers)
    print("\n".join(lines))
    largest = max(table)
    one = {s: table[s][("one check", "what changed")] for s in table}
    old = {s: table[s][("one check", "every service")] for s in table}
    summary = (f"after one check change: {', '.join(f'{s} nodes {old[s][0]} -> {one[s][0]} requests' for s in sorted(table))}; "
               f"wall at {largest} nodes {old[largest][1]:.1f} -> {one[largest][1]:.1f} ms; "
               f"idle {table[largest][('idle', 'every service')][0]} -> {table[largest][('idle', 'what changed')][0]} requests")
    results.record(args.results, script=__file__, numbers=numbers, verdict=results.verdict_of(lines[-1]),
                   target=f"<= {MAX_REQUESTS} requests per refresh after one check change at every size; "
                          f"wall <= {MAX_WALL_RATIO}x every service's at the largest size", summary=summary)


if __name__ == "__main__":
    main()
