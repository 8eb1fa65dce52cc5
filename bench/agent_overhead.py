"""Agent CPU per cycle: 2 IUs x 4 GPUs at 200 ms (target < 2% of one core).

Runs the real ``eas-agent run`` in a subprocess (NVML through the stand-in nvidia-ml-py, 2 simulated vLLM IUs
under load, the dev Consul) and reads its CPU time from /proc (psutil) over a measurement window, next to the agent's own
``/metrics`` (cycles, KV writes). A second table splits one cycle into its parts, timed in-process.

    .venv/bin/python bench/agent_overhead.py [--seconds 30]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import psutil
import results  # bench/, the script's own dir
from verdict import shown

from consul_io.client import ConsulIO
from devconsul.server import DevConsulServer
from eas_agent.collectors.vllm import VllmCollector
from eas_agent.score import IUInputs, Scorer
from eas_agent.vllm_metrics import parse_vllm_metrics
from eas_wire.fetch import HttpFetcher
from sim.vllm.node import SimulatedNode

TARGET_PERCENT = 2.0  # of one core, all the agent's threads


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def agent_counter(listen: str, name: str) -> float:
    text = urllib.request.urlopen(f"http://{listen}/metrics", timeout=2).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def parts(node: SimulatedNode, rounds: int = 300) -> list[tuple[str, float]]:
    """Median microseconds of each part of one cycle, for the node's IUs together."""
    fetchers = [HttpFetcher(iu.metrics_url, 1.0) for iu in node.ius]
    collectors = [VllmCollector(f) for f in fetchers]
    backend = node.gpu_backend()
    scorers = [Scorer("drain") for _ in node.ius]
    timings: dict[str, list[float]] = {
        "HTTP GET /metrics (incl. sim render)": [],
        "parse (eas_agent.vllm_metrics)": [],
        "GPU read (NVML stand-in, 8 GPUs)": [],
        "rates + drain score": [],
    }
    for k in range(rounds):
        now = time.time()
        t0 = time.perf_counter()
        texts = [f() for f in fetchers]
        t1 = time.perf_counter()
        metrics = [parse_vllm_metrics(t) for t in texts]
        t2 = time.perf_counter()
        gpus = backend.read(tuple(range(8)))
        t3 = time.perf_counter()
        for i, m in enumerate(metrics):
            reading = collectors[i].observe(now, m)
            scorers[i].score(IUInputs(f"iu{i}", reading, tuple(gpus[4 * i : 4 * i + 4])), now)
        t4 = time.perf_counter()
        for key, value in zip(timings, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            timings[key].append(value * 1e6)
        if k % 10 == 0:
            time.sleep(0.01)
    return [(k, statistics.median(v)) for k, v in timings.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0)
    results.add_argument(parser, __file__)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        DevConsulServer(addr="127.0.0.1:0") as consul,
        SimulatedNode(
            "r01n01", "r01", tmp, rates=[4.0, 7.0], consul_addr=consul.address, warmup_s=60.0
        ) as node,
    ):
        node.register_services(ConsulIO(consul.address))
        listen = f"127.0.0.1:{free_port()}"
        node.write_config(interval_s=0.2, heartbeat_s=2.0, listen=listen)
        agent = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "eas_agent.main",
                "run",
                "--config",
                str(node.config_path),
                "--log-level",
                "WARNING",
            ],
            env=node.agent_env(),
        )
        try:
            time.sleep(3.0)  # imports, first cycles, capacity estimates
            process = psutil.Process(agent.pid)
            cpu0, wall0 = sum(process.cpu_times()[:2]), time.monotonic()
            cycles0 = agent_counter(listen, "eas_agent_cycle_seconds_count")
            cycle_sum0 = agent_counter(listen, "eas_agent_cycle_seconds_sum")
            writes0 = agent_counter(listen, "eas_agent_consul_writes_total")
            time.sleep(args.seconds)
            cpu1, wall1 = sum(process.cpu_times()[:2]), time.monotonic()
            cycles1 = agent_counter(listen, "eas_agent_cycle_seconds_count")
            cycle_sum1 = agent_counter(listen, "eas_agent_cycle_seconds_sum")
            writes1 = agent_counter(listen, "eas_agent_consul_writes_total")
        finally:
            agent.terminate()
            agent.wait(5)
        cycles = cycles1 - cycles0
        cpu = cpu1 - cpu0
        wall = wall1 - wall0
        print(
            f"eas-agent, 2 IUs x 4 GPUs (stand-in NVML), 2 simulated vLLM IUs at 4 and 7 req/s, dev Consul, "
            f"{wall:.0f} s window\n"
        )
        print("| metric                              |     value |")
        print("|-------------------------------------|-----------|")
        print(f"| CPU, % of one core (all threads)    | {100 * cpu / wall:8.2f}% |")
        print(f"| cycles/s (target 5)                 | {cycles / wall:9.2f} |")
        print(f"| CPU per cycle, ms                   | {1000 * cpu / max(cycles, 1):9.2f} |")
        print(
            f"| collect+score time per cycle, ms    | "
            f"{1000 * (cycle_sum1 - cycle_sum0) / max(cycles, 1):9.2f} |"
        )
        print(f"| KV writes/s                         | {(writes1 - writes0) / wall:9.2f} |")
        print("\none cycle, in-process, median microseconds (both IUs together):\n")
        print("| part                                |      us |")
        print("|-------------------------------------|---------|")
        for name, micros in parts(node):
            print(f"| {name:35} | {micros:7.0f} |")
        percent = 100 * cpu / wall
        print(f"\ntarget: agent CPU {shown(percent, TARGET_PERCENT)}% of one core (< {TARGET_PERCENT:g}%): "
              f"{'met' if percent < TARGET_PERCENT else 'NOT met'}")
        per_cycle_ms = 1000 * cpu / max(cycles, 1)
        results.record(args.results, script=__file__, target=f"< {TARGET_PERCENT:g}% of one core",
                       verdict="met" if percent < TARGET_PERCENT else "not met",
                       numbers={"agent_cpu_pct_of_a_core": round(percent, 3), "cpu_ms_per_cycle": round(per_cycle_ms, 2),
                                "cycles_per_s": round(cycles / wall, 2),
                                "kv_writes_per_s": round((writes1 - writes0) / wall, 2)},
                       summary=f"{wall:.0f} s window: {shown(percent, TARGET_PERCENT)}% of a core "
                               f"({per_cycle_ms:.2f} ms per cycle); KV writes {(writes1 - writes0) / wall:.2f}/s")


if __name__ == "__main__":
    main()
