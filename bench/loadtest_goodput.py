"""Goodput of the production mix through the edge's score routing and through least connections, side by
side: the same pool, the same arrivals, the same SLOs.

A local pool on 127.0.72.N (``--units`` nodes, each one simulated vLLM IU on 127.0.72.(11 + n) and its
real agent: the IUs in one child process, the agents in another; a dev Consul), and three ways in front of
it. Each rate is sent in ``--windows`` windows; in each window every way gets the same Poisson trace (a
seed per window), one after another in an order that rotates, so the shared host's load over the run falls
on all three alike:

- ``edge``: eas-edge routing on the agents' scores (pushed, announce channel on: the shipped default path);
- ``edge least-in-flight``: the same eas-edge code on a Consul holding the IUs' registrations and no score
  body, push off, so every pick fails open to the least in-flight IU (edge/pool/pick.py): least connections
  with everything else of the edge (its hop, admission, retries) the same;
- ``haproxy leastconn``: Debian's HAProxy (``balance leastconn``) straight to the IUs: the load balancer an
  operator would otherwise put there.

Load: ``operate.loadtest`` (open loop, token-id prompts) with the production mix's prompts and TTFT limits
(operate/scenarios/production-mix.yml: p99 <= 850 / 2,200 / 5,500 ms) and ~24-token answers: the limits
judge time to first token, and the mix's 150-600-token answers would make the Python edge and simulators
stream ~5,000 events/s on this 2-core host, measuring its CPU rather than routing.

Per run: goodput = requests answered within their class's TTFT limit per second of the arrival window
(DistServe's definition, per request), the share within, p99 TTFT per class and the SLO verdicts (a class
with fewer than ``--min-samples`` requests is "too few": its p99 is near its maximum). Target: at the
highest rate, the edge's goodput >= 1.0x each least-connections baseline's.

    .venv/bin/python bench/loadtest_goodput.py --rates 6,8,10,12 --duration 60 --windows 3 --results
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results  # noqa: E402
from bench.edge_procs import DevConsul, start_edge  # noqa: E402
from bench.verdict import shown  # noqa: E402
from eas_wire.signing import generate_key_pair  # noqa: E402
from operate import loadtest  # noqa: E402
from operate.scenario import Scenario, load_scenario, parse_scenario  # noqa: E402

NET = "127.0.72"
ROUTERS = ("edge", "edge least-in-flight", "haproxy leastconn")
OUTPUT_TOKENS = {"mean": 24, "sigma": 0.3}
TARGET_RATIO = 1.0


def scenario() -> Scenario:
    """The production mix's prompts, shares and TTFT limits with ~24-token answers (module docstring)."""
    data = {"name": "production-prompts", "classes": {}}
    for klass in load_scenario().classes:
        data["classes"][klass.name] = {"share": klass.share,
                                       "prompt_tokens": {"mean": klass.prompt.mean, "sigma": klass.prompt.sigma},
                                       "output_tokens": dict(OUTPUT_TOKENS),
                                       "slo": {"ttft_p99_ms": klass.slo.ttft_p99_ms}}
    return parse_scenario(data, "production-prompts")


def serve_ius(spec: str) -> None:
    """A child: ``units`` simulated nodes' IUs, registered on their catalog nodes, each node's agent config
    written beside its stand-in GPU file; prints {IU: address}, runs until stdin closes. ``spec``: JSON
    {units, consul, agent_port, keys_file, workdir}."""
    from consul_io.client import ConsulIO
    from sim.vllm.node import SimulatedNode
    from sim.vllm.registration import IUService, register_on_catalog_node

    args = json.loads(spec)
    io, nodes = ConsulIO(args["consul"]), []
    for n in range(args["units"]):
        host = f"{NET}.{11 + n}"
        node = SimulatedNode(f"n{n + 1}", "r1", args["workdir"], rates=[0.0], consul_addr=args["consul"],
                             host=host, warmup_s=0.0, seed=n).start()
        nodes.append(node)
        port = int(node.ius[0].address.rsplit(":", 1)[1])
        register_on_catalog_node(io, IUService(node.iu_id(0), node.name, node.rack, host, port, (0, 1, 2, 3), 0),
                                 host)
        node.write_config(listen=f"{host}:{args['agent_port']}", announce_keys_file=args["keys_file"])
    print(json.dumps({node.iu_id(0): node.ius[0].address for node in nodes}), flush=True)
    sys.stdin.read()
    for node in nodes:
        node.stop()


def serve_agents(spec: str) -> None:
    """A child: the real agent of each node :func:`serve_ius` wrote a config for (a thread each), in a
    process apart from the IUs, as on a node the agent does not share an interpreter with vLLM; runs until
    stdin closes. ``spec``: as serve_ius's."""
    import threading

    from eas_agent.agent import Agent
    from eas_agent.config import load_config
    from sim import nvml_standin

    args = json.loads(spec)
    agents = []
    for n in range(args["units"]):
        workdir = Path(args["workdir"]) / f"n{n + 1}"
        agent = Agent(load_config(workdir / "config.yml"),
                      gpu_backend=nvml_standin.nvml_backend(workdir / "fake_gpus.json"))
        threading.Thread(target=agent.run, name=f"agent-n{n + 1}", daemon=True).start()
        agents.append(agent)
    print("agents running", flush=True)
    sys.stdin.read()
    for agent in agents:
        agent.request_stop()


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def haproxy(ius: dict[str, str], workdir: Path) -> tuple[subprocess.Popen, str]:
    """HAProxy with ``balance leastconn`` over the IUs (foreground, its config checked first)."""
    listen = f"{NET}.3:{free_port(f'{NET}.3')}"
    servers = "\n".join(f"    server {iu} {address}" for iu, address in sorted(ius.items()))
    config = workdir / "haproxy.cfg"
    config.write_text(f"""global
    maxconn 4096
defaults
    mode http
    timeout connect 5s
    timeout client 120s
    timeout server 120s
frontend clients
    bind {listen}
    default_backend ius
backend ius
    balance leastconn
{servers}
""")
    subprocess.run(["haproxy", "-c", "-q", "-f", str(config)], check=True)
    process = subprocess.Popen(["haproxy", "-db", "-f", str(config)], stdout=subprocess.DEVNULL)
    return process, listen


def wait_until(check, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"timed out waiting for {what}")


def healthz(address: str) -> dict:
    try:
        with urllib.request.urlopen(f"http://{address}/healthz", timeout=2) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def within_slo(outcome, limits: dict[str, dict[str, float]]) -> bool:
    if not outcome.ok:
        return False
    limit = limits[outcome.klass]
    return all(getattr(outcome, f"{metric}_s") <= value for metric, value in limit.items())


def summarise(router: str, result: loadtest.Result, limits) -> dict:
    good = sum(within_slo(o, limits) for o in result.outcomes)
    p99 = {name: s.latency["ttft"][99] for name, s in result.by_class.items()}
    verdicts = {f"{v.klass} {v.metric}": v.verdict for v in result.verdicts}
    return {"router": router, "rate": result.rate, "requests": len(result.outcomes),
            "errors": sum(not o.ok for o in result.outcomes), "goodput": good / result.duration_s,
            "within_share": good / len(result.outcomes) if result.outcomes else 0.0,
            "ttft_p99_ms": {k: None if v is None else (v * 1000 if v != float("inf") else "inf")
                            for k, v in p99.items()},
            "slo": verdicts, "all_met": result.passed, "lag_p99_ms": (result.lag["p99_s"] or 0) * 1000}


def merged(parts: list[loadtest.Result], min_samples: int) -> loadtest.Result:
    """One result of a router's windows at one rate (their outcomes together, their durations summed)."""
    first = parts[0]
    return loadtest.Result(first.scenario, first.endpoint, first.rate, sum(p.duration_s for p in parts),
                           [o for p in parts for o in p.outcomes], sum(p.elapsed_s for p in parts),
                           sum(p.planned for p in parts), min_samples=min_samples)


def sweep(endpoints: dict[str, str], rates: list[float], duration: float, windows: int, min_samples: int,
          seed: int) -> list[dict]:
    """Each rate in ``windows`` windows of ``duration / windows`` s; in each window every router gets the
    same trace (its own seed), in an order that rotates, so the host's load over the run falls on all three."""
    mix, rows = scenario(), []
    limits = {k.name: k.slo.limits() for k in mix.classes}
    for i, rate in enumerate(rates):
        parts: dict[str, list[loadtest.Result]] = {router: [] for router in ROUTERS}
        for w in range(windows):
            turn = (i * windows + w) % len(ROUTERS)
            for router in ROUTERS[turn:] + ROUTERS[:turn]:
                result = loadtest.run(endpoints[router], mix, rate, duration / windows, seed=seed + 100 * i + w,
                                      min_samples=min_samples)
                if result.interrupted:  # the load test took the Ctrl-C: the bench stops, its processes ended
                    raise KeyboardInterrupt
                parts[router].append(result)
        for router in ROUTERS:
            row = summarise(router, merged(parts[router], min_samples), limits)
            rows.append(row)
            print(f"  {rate:g} req/s {router:<22} goodput {row['goodput']:6.2f}/s  within {row['within_share']:6.1%}  "
                  f"p99 TTFT ms {json.dumps(row['ttft_p99_ms'])}  {'met' if row['all_met'] else 'not all met'}",
                  flush=True)
    return rows


def _ms(value) -> str:
    return "-" if value is None else ("inf" if value == "inf" else f"{value:,.0f}")


def table(rows: list[dict], rates: list[float]) -> str:
    by = {(r["rate"], r["router"]): r for r in rows}
    lines = ["| rate req/s | router | requests | errors | goodput req/s | within SLO | p99 TTFT A/B/C ms | SLOs | ratio |",
             "|---|---|---|---|---|---|---|---|---|"]
    for rate in rates:
        ours = by[(rate, "edge")]["goodput"]
        for router in ROUTERS:
            r = by[(rate, router)]
            ratio = "-" if router == "edge" else (f"{ours / r['goodput']:.3f}x" if r["goodput"] else "inf")
            slos = ", ".join(f"{k.split()[0]} {v}" for k, v in r["slo"].items())
            p99 = "/".join(_ms(r["ttft_p99_ms"].get(k)) for k in ("A", "B", "C"))
            lines.append(f"| {rate:g} | {router} | {r['requests']} | {r['errors']} | {r['goodput']:.2f} | "
                         f"{r['within_share']:.1%} | {p99} | {slos} | {ratio} |")
    for router in ROUTERS:
        met = [rate for rate in rates if by[(rate, router)]["all_met"]]
        lines.append(f"highest rate with every SLO met, {router}: {max(met):g} req/s" if met else
                     f"highest rate with every SLO met, {router}: none of the rates")
    return "\n".join(lines)


def verdict(rows: list[dict], top: float, units: int) -> tuple[str, dict[str, float]]:
    """The target line (it says "met" only when the edge's goodput at ``top`` req/s is at least
    :data:`TARGET_RATIO` times each baseline's) and those ratios."""
    by = {(r["rate"], r["router"]): r["goodput"] for r in rows}
    ours = by[(top, "edge")]
    ratios = {router: ours / by[(top, router)] if by[(top, router)] else float("inf") for router in ROUTERS[1:]}
    held = all(v >= TARGET_RATIO for v in ratios.values())
    line = (f"at {top:g} req/s ({units} IUs) the edge's goodput is "
            + ", ".join(f"{shown(v, TARGET_RATIO, 3)}x {router}'s" for router, v in ratios.items())
            + f"; target >= {TARGET_RATIO:g}x each: {'met' if held else 'NOT met'}")
    return line, ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=4)
    parser.add_argument("--rates", default="6,8,10,12", help="offered req/s, ascending (default 6,8,10,12)")
    parser.add_argument("--duration", type=float, default=60.0, help="arrival time per rate and router, s (default 60)")
    parser.add_argument("--windows", type=int, default=3, help="windows the duration is sent in, routers rotating")
    parser.add_argument("--min-samples", type=int, default=20, help="requests of a class for an SLO verdict")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--serve-ius", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--serve-agents", default=None, help=argparse.SUPPRESS)
    results.add_argument(parser, __file__)
    args = parser.parse_args(argv)
    if args.serve_ius or args.serve_agents:
        (serve_ius if args.serve_ius else serve_agents)(args.serve_ius or args.serve_agents)
        return 0
    if shutil.which("haproxy") is None:
        raise SystemExit("haproxy not found (Debian: apt-get install haproxy)")
    rates = sorted(float(r) for r in args.rates.split(",") if r)
    print(f"host: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    private, public = generate_key_pair()
    with tempfile.TemporaryDirectory() as tmp, DevConsul(f"{NET}.1") as scored, DevConsul(f"{NET}.4") as bare:
        work = Path(tmp)
        keys, key = work / "edge-keys", work / "announce.key"
        keys.write_text(public + "\n")
        key.touch(0o600)
        key.write_text(private + "\n")
        agent_port = free_port(f"{NET}.11")
        spec = json.dumps({"units": args.units, "consul": scored.address, "agent_port": agent_port,
                           "keys_file": str(keys), "workdir": str(work)})
        pool = subprocess.Popen([sys.executable, __file__, "--serve-ius", spec], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        processes, agents = [pool], None
        try:
            ius = json.loads(pool.stdout.readline())
            agents = subprocess.Popen([sys.executable, __file__, "--serve-agents", spec], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
            processes.append(agents)
            agents.stdout.readline()
            from consul_io.client import ConsulIO
            from sim.vllm.registration import IUService, register_on_catalog_node

            bare_io = ConsulIO(bare.address)
            for iu, address in ius.items():
                host, port = address.rsplit(":", 1)
                register_on_catalog_node(bare_io, IUService(iu, iu.split("-")[0], "r1", host, int(port),
                                                            (0, 1, 2, 3), 0), host)
            edge, edge_at = start_edge(scored.address, ["--listen", f"{NET}.2:0", "--admin-listen", f"{NET}.2:0",
                                                        "--agent-port", str(agent_port),
                                                        "--announce-key-file", str(key)])
            processes.append(edge)
            plain, plain_at = start_edge(bare.address, ["--listen", f"{NET}.5:0", "--admin-listen", f"{NET}.5:0",
                                                        "--no-push"])
            processes.append(plain)
            balancer, balancer_at = haproxy(ius, work)
            processes.append(balancer)
            wait_until(lambda: healthz(edge_at).get("fresh_scores") == len(ius), "fresh scores of every IU at the edge")
            wait_until(lambda: healthz(plain_at).get("routable_ius") == len(ius), "every IU routable (no scores)")
            endpoints = {"edge": f"http://{edge_at}", "edge least-in-flight": f"http://{plain_at}",
                         "haproxy leastconn": f"http://{balancer_at}"}
            rows = sweep(endpoints, rates, args.duration, args.windows, args.min_samples, args.seed)
        finally:
            for process in reversed(processes):
                if process in (pool, agents):
                    process.stdin.close()
                else:
                    process.terminate()
            for process in processes:
                process.wait(15)
    print(table(rows, rates))
    line, ratios = verdict(rows, max(rates), args.units)
    print(line)
    results.record(args.results, script=__file__, numbers={"rows": rows, "ratios_at_top_rate": {  # None: the baseline had none
                       k: v if v != float("inf") else None for k, v in ratios.items()}},
                   summary=line, target=f"goodput (requests within their TTFT limit per second) through the edge "
                                        f">= {TARGET_RATIO:g}x least connections' at the highest rate",
                   verdict=results.verdict_of(line), argv=[__file__, *(sys.argv[1:] if argv is None else argv)],
                   measures="goodput of the production mix (4 simulated IUs) through the edge's scores vs "
                            "least connections (the edge failing open, HAProxy leastconn), same arrivals")
    return 0


if __name__ == "__main__":
    sys.exit(main())
