"""What clients see through the provisioned edges when an IU's engine is killed or stalled, or an edge restarts,
on the virtual cluster: the edge's fault targets, each printed met / NOT met, and the failure-mode table.

The cluster is provisioned as the machine tests do it (tests/helpers/provision.py ``VirtualCluster``):
``virtual create`` (``--nodes`` in ``--racks``, 2 IUs a node, no hardware faults) on a loopback net of its own
(127.49.R.N, beside the machine tests and the demo), ``virtual up``, ``clusterctl provision --batches 100%
--allow-reboot`` (every role: ``vllm-iu@N`` units running the stand-in vLLM under systemd, the agents at their
default cycle, two ``eas-edge.service`` edges behind HAProxy), then every node released as a passed preflight
would. The one inventory value added: ``eas_edge_debug_headers`` (answers name the IU that served them, so a
stream is known to be on the faulted IU). ``--keep`` leaves the machines up; ``--reuse DIR`` runs on them.

Streamed completions go to HAProxy at ``--load`` (edge_faults.drive: mean streams in flight per IU = load x 8,
the rate calibrated from a first stream). Per trial, after a quiet baseline: one IU's engine killed
(operate/drill_faults.py ``engine_crash``: SIGKILL to the unit's MainPID over the cluster's SSH transport;
systemd restarts it) or stalled (``engine_stall``: SIGSTOP for ``--stall-s``, longer than the client's read
timeout ``--client-idle-s``, then its undo, SIGCONT), or one edge restarted (``edge_restart``: systemd's SIGTERM,
the edge drains and starts again). A fault ends when the IU (or the edge) answers ``/health`` again; p99 TTFT
during a fault is of the requests sent until then (a killed unit's restart included: every machine's CPU is
this host's, as the local bench's is) against the quiet windows before each fault.

What the edges sent where is read from their own ``/metrics``, polled every ``POLL_S`` (edge_faults_read.py):
a request sent to an IU is a rise of ``eas_edge_inflight{iu}`` or of a before-the-first-byte failure there
(a connection refused by a dead unit is counted at once). So a send is seen at most ``POLL_S`` late, and one
whose rise is masked by another stream ending on that IU in the same interval is missed.

    flock /tmp/clusterctl-virtual.lock .venv/bin/python bench/edge_faults_virtual.py --results
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import edge_faults
import edge_faults_read as read
import results
from edge_faults import EDGE_RESTART, Fault

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cluster import edges  # noqa: E402
from cluster.ansible.inventory import cluster_of, load_inventory  # noqa: E402
from operate.drill import becomes  # noqa: E402
from operate.drill_faults import FaultStep, Target  # noqa: E402
from preflight.transport import RoutingTransport  # noqa: E402
from sim.hosts import create, lifecycle  # noqa: E402
from tests.helpers.provision import VirtualCluster  # noqa: E402

NET = 49  # the machines on 127.49.R.N
FAULT_STEPS = {"kill": "engine_crash", "stall": "engine_stall", EDGE_RESTART: "edge_restart"}
POLL_S = 0.2
ANSWER_WAIT_S = 90.0  # a killed unit: systemd's RestartSec (10 s) and the stand-in's start


class Site:
    """The provisioned cluster: where clients send, the edges' /metrics, the IUs and how to fault them."""

    def __init__(self, inventory: Path):
        self.inventory = inventory
        loaded = load_inventory(inventory)
        self.cluster = cluster_of(loaded)
        self.become = {name: becomes(hv) for name, hv in loaded.selected.items()}
        found = edges.client_endpoint(loaded.everyone)
        if found is None:
            raise SystemExit(f"{inventory / 'hosts.yml'}: no 'balancers' or 'edges' group to send to")
        self.url = edges.url_of(found[1])
        self.edges = {e.host: (edges.url_of(e), edges.admin_url(e.host, loaded.everyone[e.host]))
                      for e in edges.edges_of(loaded.everyone)}
        self.nodes = {n.name: n for n in self.cluster.nodes()}
        self.ius = [(node, iu) for node in self.nodes.values() for iu in node.ius]
        self.transport = RoutingTransport()

    def step(self, kind: str, node, iu=None) -> FaultStep:
        return FaultStep(FAULT_STEPS[kind], Target(node, iu, self.become.get(node.name, False)), self.transport)


def provision(workdir: Path, nodes: int, racks: int) -> Path:
    """A new cluster, up, provisioned and released; its inventory dir."""
    inventory = workdir / "inventory"
    create.write(inventory, nodes, racks, fabric="mixed", faults="none", net=NET)
    with (inventory / "group_vars" / "all.yml").open("a") as f:
        f.write("# The bench's clients learn which IU served them (X-Eas-IU): internal ids, never on a production "
                "edge.\neas_edge_debug_headers: true\n")
    cluster = VirtualCluster(inventory, tuple(lifecycle.simulated_hosts(inventory)), dict(os.environ))
    up = lifecycle.up(str(inventory))
    print(f"{len(up.hosts)} machines up in {up.seconds:.1f} s", flush=True)
    started = time.monotonic()
    run = cluster.provision("site", "--batches", "100%", "--allow-reboot")
    if run.returncode != 0:
        raise SystemExit(f"provisioning exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}")
    print(f"provisioned in {time.monotonic() - started:.0f} s", flush=True)
    return inventory


def release(inventory: Path) -> None:
    cluster = VirtualCluster(inventory, tuple(lifecycle.simulated_hosts(inventory)), dict(os.environ))
    deadline = time.monotonic() + 60
    while not cluster.release_every_node():
        if time.monotonic() > deadline:
            raise SystemExit("a node's Consul agent did not rejoin within 60 s: not every node released")
        time.sleep(1)


async def _get(session: aiohttp.ClientSession, url: str, timeout: float = 1.0) -> tuple[int, bytes]:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as answer:
            return answer.status, await answer.read()
    except (OSError, TimeoutError, aiohttp.ClientError):
        return 0, b""


async def _ok(session, url: str) -> bool:
    return (await _get(session, url, 5.0))[0] == 200


async def _until(check, limit_s: float, every_s: float = 0.1) -> float | None:
    """The time ``check()`` (a coroutine function) first answers true; None after ``limit_s``."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if await check():
            return time.monotonic()
        await asyncio.sleep(every_s)
    return None


async def pool_ready(session, site: Site, limit_s: float) -> bool:
    """Every edge answers /healthz ok with every IU routable and scored (the whole pool in rotation)."""

    async def ready() -> bool:
        for url, _admin in site.edges.values():
            status, body = await _get(session, f"{url}/healthz")
            if status != 200:
                return False
            health = json.loads(body)
            if health["routable_ius"] < len(site.ius) or health["fresh_scores"] < len(site.ius):
                return False
        return True

    return await _until(ready, limit_s, 0.2) is not None


async def poll_metrics(session, site: Site, samples: list, stop: asyncio.Event) -> None:
    """Every edge's /metrics every POLL_S, its lines of interest kept (parsed after the run)."""
    while not stop.is_set():
        at = time.monotonic()
        answers = await asyncio.gather(*(_get(session, f"{admin}/metrics") for _url, admin in site.edges.values()))
        for edge, (status, body) in zip(site.edges, answers, strict=True):
            if status == 200:
                samples.append((at, edge, read.kept_lines(body.decode())))
        await asyncio.sleep(max(0.0, POLL_S - (time.monotonic() - at)))


def run(site: Site, load: float, repeats: int, edge_restarts: int, baseline_s: float, stall_s: float,
        settle_s: float, client_idle_s: float, seed: int) -> dict:
    rng = random.Random(seed)
    samples: list = []
    injected: list[float] = []

    async def main():
        async with aiohttp.ClientSession() as session:
            if not await pool_ready(session, site, 120):
                raise SystemExit(f"the edges do not route to all {len(site.ius)} IUs: {site.edges}")
            # HAProxy routes to an edge once its health checks rose (rise x inter after the edge is ready)
            if await _until(lambda: _ok(session, f"{site.url}/v1/models"), 60, 0.5) is None:
                raise SystemExit(f"HAProxy at {site.url} does not answer /v1/models: "
                                 f"{(await _get(session, f'{site.url}/v1/models'))[0]}")
            body = (await _get(session, f"{site.url}/v1/models", 10))[1]
            model = json.loads(body)["data"][0]["id"]
            stop = asyncio.Event()
            poller = asyncio.create_task(poll_metrics(session, site, samples, stop))

            async def trials(_rate) -> list[Fault]:
                schedule = [k for k in ("kill", "stall") for _ in range(repeats)] + [EDGE_RESTART] * edge_restarts
                faults = []
                for n, kind in enumerate(schedule):
                    await asyncio.sleep(baseline_s)
                    faults.append(await one_fault(session, site, kind, n, rng, stall_s, injected))
                    await asyncio.sleep(settle_s)
                    await pool_ready(session, site, 30)
                return faults

            try:
                return await edge_faults.drive(f"{site.url}/v1/completions", len(site.ius), load, client_idle_s,
                                               rng, trials, model=model)
            finally:
                stop.set()
                await poller

    outcomes, faults, rate, duration = asyncio.run(main())
    parsed = read.parse_samples(samples)
    edge_faults.attribute_sends(faults, read.send_events(parsed))
    numbers = edge_faults.summarise(outcomes, faults, baseline_s, rate, duration)
    numbers["ius"], numbers["inject_s_max"] = len(site.ius), round(max(injected), 2)
    numbers["failure_modes"] = read.failure_modes(outcomes, faults, parsed, settle_s)
    numbers["trials"] = [{"kind": f.kind, "target": f.iu_id, "answered_again_s": round(f.until - f.at, 2),
                          "sends_while_down": len(f.sends),
                          "back_s": None if f.back is None else round(f.back - f.until, 2)} for f in faults]
    return numbers


async def one_fault(session, site: Site, kind: str, n: int, rng: random.Random, stall_s: float,
                    injected: list[float]) -> Fault:
    """One trial's fault, injected by its drill step; over when the IU (or the edge) answers /health again."""
    if kind == EDGE_RESTART:
        host = sorted(site.edges)[n % len(site.edges)]
        step, label, health = site.step(kind, site.nodes[host]), host, f"{site.edges[host][0]}/healthz"
    else:
        node, iu = rng.choice(site.ius)
        step, label, health = site.step(kind, node, iu), iu.id, f"http://{node.address}:{iu.port}/health"

    async def answering(want: bool = True) -> bool:
        return ((await _get(session, health))[0] == 200) == want

    at = time.monotonic()
    await asyncio.to_thread(step.inject)
    injected.append(time.monotonic() - at)
    if kind == "stall":
        await asyncio.sleep(stall_s)
        await asyncio.to_thread(step.undo)
    else:  # down first (a dying process's socket, an edge's drain), then up again
        await _until(lambda: answering(False), 60)
    until = await _until(answering, ANSWER_WAIT_S) or time.monotonic()
    if kind != "stall":
        await asyncio.to_thread(step.undo)  # a no-op start once systemd restarted it
    print(f"  {kind} {label}: answering again {until - at:.1f} s after", flush=True)
    return Fault(kind, label, at, until, until)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4, help="2 IUs each")
    parser.add_argument("--racks", type=int, default=2)
    parser.add_argument("--load", type=float, default=0.55, help="mean streams in flight per IU / 8")
    parser.add_argument("--repeats", type=int, default=4, help="trials per engine fault kind (kill, stall)")
    parser.add_argument("--edge-restarts", type=int, default=2)
    parser.add_argument("--baseline-s", type=float, default=5.0)
    parser.add_argument("--stall-s", type=float, default=8.0)
    parser.add_argument("--settle-s", type=float, default=4.0)
    parser.add_argument("--client-idle-s", type=float, default=6.0, help="the client's read timeout")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--reuse", type=Path, metavar="INVENTORY", help="a cluster left up by --keep")
    parser.add_argument("--keep", action="store_true", help="leave the machines up (for --reuse)")
    parser.add_argument("--workdir", type=Path, help="where the new cluster's inventory goes (default: a new "
                        "temporary dir, removed at the end unless --keep)")
    results.add_argument(parser, __file__)
    args = parser.parse_args(argv)
    started = time.monotonic()
    workdir = None
    if args.reuse:
        inventory = args.reuse
    else:
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="edge-faults-virtual-"))
        inventory = workdir / "inventory"
    try:
        if not args.reuse:
            provision(workdir, args.nodes, args.racks)
        release(inventory)
        setup_s = time.monotonic() - started
        site = Site(inventory)
        try:
            numbers = run(site, args.load, args.repeats, args.edge_restarts, args.baseline_s, args.stall_s,
                          args.settle_s, args.client_idle_s, args.seed)
        finally:
            site.transport.close()
    finally:
        if args.keep:
            print(f"kept the machines up: --reuse {inventory} (down: clusterctl virtual down -i {inventory})")
        else:
            if (inventory / "hosts.yml").exists():
                lifecycle.down(str(inventory))
            if workdir is not None and args.workdir is None:
                shutil.rmtree(workdir, ignore_errors=True)
    numbers["setup_s"], numbers["run_s"] = round(setup_s), round(time.monotonic() - started)
    if inventory.parent.is_dir():  # kept beside the inventory (--workdir, --reuse): the run's numbers as measured
        (inventory.parent / f"numbers-{time.strftime('%H%M%S')}.json").write_text(json.dumps(numbers, indent=1))
    return report(numbers, args, argv)


def report(numbers: dict, args, argv) -> int:
    print(f"{numbers['requests']} streams at {numbers['rate_per_s']} req/s through HAProxy "
          f"({args.load * edge_faults.SLOTS:g} in flight per IU x {numbers['ius']} IUs; a stream takes "
          f"{numbers['stream_s']} s); setup {numbers['setup_s']} s, whole run {numbers['run_s']} s; a fault step "
          f"took up to {numbers['inject_s_max']} s over SSH")
    for line in read.failure_table(numbers["failure_modes"]):
        print(line)
    lines, met = edge_faults.verdict_lines(numbers, restarted_back=True)
    for line in lines:
        print(line)
    summary = (f"the edge's fault targets on the virtual cluster (kill, stall, edge restart): "
               f"{'met' if met else 'NOT met'}")
    print(summary)
    return results.record_met(
        args.results, met, script=__file__, argv=argv, numbers=numbers, summary=summary,
        target="killed/stalled IU at ~50-60% load: no client-visible failure, no stream silent > 5 s, no request to "
               "it > 2 s (killed) / 5 s (stalled) after, p99 TTFT <= 1.15x baseline, a restarted IU back within 5 s "
               "of answering; an edge restart loses no request not yet streaming",
        measures="the edge's fault targets through the provisioned edges and HAProxy on the virtual cluster "
                 "(vllm-iu@N killed / stalled under systemd, an edge restarted): failures, silences, sends, TTFT")


if __name__ == "__main__":
    results.exit_with(main, __file__)
