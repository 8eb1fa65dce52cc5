"""Run simulated vLLM IUs until SIGTERM (the virtual inventory's stand-in for vLLM)::

    python -m sim.vllm --iu 127.0.1.11:8000:4.0 --iu 127.0.1.11:8001:1.5 --schema v1 \\
        --gpu-file /etc/eas-agent/fake_gpus.json --gpus 8

``--iu ADDRESS:PORT:RATE`` (requests/s) may repeat; ``--gpu-file`` writes the file the stand-in
nvidia-ml-py answers the agent's NVML calls from (sim/nvml_standin).
"""

from __future__ import annotations

import argparse
import signal
import threading

from sim.hosts import gpu_clients
from sim.vllm.fake_gpu import fake_gpus, write_fake_gpu_file
from sim.vllm.server import SimulatedIU


def parse_iu(spec: str) -> tuple[str, int, float]:
    try:
        host, port, rate = spec.rsplit(":", 2)
        return host, int(port), float(rate)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected ADDRESS:PORT:RATE, got {spec!r}") from exc


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sim.vllm", description=__doc__.splitlines()[0])
    parser.add_argument("--iu", action="append", type=parse_iu, required=True, help="ADDRESS:PORT:RATE")
    parser.add_argument("--schema", choices=("v1", "v0"), default="v1")
    parser.add_argument("--gpu-file", default=None)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--warmup-s", type=float, default=30.0)
    parser.add_argument("--slowdown", type=float, default=1.0, help="engine this many times slower (>= 1)")
    parser.add_argument("--error-fraction", type=float, default=0.0, help="share of completions answered 500")
    args = parser.parse_args(argv)
    gpu_clients.register_self()  # a CUDA process holds its visible GPUs (a simulated host's nvidia-smi reads it)
    if args.gpu_file:
        write_fake_gpu_file(args.gpu_file, fake_gpus(args.gpus, utilization=60))
    sims = [
        SimulatedIU(host, port, schema=args.schema, arrival_rate=rate, seed=i, warmup_s=args.warmup_s,
                    slowdown=args.slowdown, error_fraction=args.error_fraction).start()
        for i, (host, port, rate) in enumerate(args.iu)
    ]
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    print(" ".join(f"{s.metrics_url}" for s in sims), flush=True)
    done.wait()
    for sim in sims:
        sim.stop()


if __name__ == "__main__":
    main()
