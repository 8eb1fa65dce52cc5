"""``vllm`` of the stand-in vllm wheel (sim/pypi): ``vllm serve MODEL ...`` checks its environment the way the
real vLLM would trip over it on a GPU node, then runs the simulated vLLM server (sim.vllm, vendored into the
wheel as ``vllm._sim``) on ``--host``/``--port`` until SIGTERM; with ``--api-key`` or ``VLLM_API_KEY`` its
``/v1/*`` endpoints refuse requests without that key (401), as vLLM's do.

Exits 1 with one line per problem (as vLLM dies at start) when:
- HOME (or XDG_CACHE_HOME) is unset or not writable: vLLM, torch, triton, numba and HF write caches there;
- CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA would number GPUs fastest-first, not as nvidia-smi/topology do;
- VLLM_PORT is set and its internal port range (VLLM_PORT .. VLLM_PORT + tensor parallel size) holds --port:
  VLLM_PORT is vLLM's first internal port, not the API port;
- CUDA_VISIBLE_DEVICES does not name --tensor-parallel-size GPUs that ``nvidia-smi -L`` lists;
- the model directory has no config.json;
- the model directory has no weight files: vLLM's DefaultModelLoader looks for ``*.safetensors``, then ``*.bin``,
  then ``*.pt`` in it and, finding none, dies with ``RuntimeError: Cannot find any model weights with
  `<model>``` (vllm/model_executor/model_loader/default_loader.py, ``_prepare_weights``); real vLLM gets
  there after the engine starts, so the line comes after its start-up logs, and never serves.
With VLLM_PORT set, the internal ports are bound like vLLM's distributed init does: a port another IU serves on
fails with "Address already in use", the race two IUs on one node run into.
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

VERSION = "0.6.6.post1"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vllm")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve")
    serve.add_argument("model")
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", default=None)
    serve.add_argument("--tensor-parallel-size", type=int, default=1)
    serve.add_argument("--max-num-seqs", type=int, default=256)
    serve.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    serve.add_argument("--max-model-len", type=int, default=None)
    serve.add_argument("--api-key", default=None)
    serve.add_argument("--enable-prefix-caching", dest="prefix_caching", action="store_true")
    serve.add_argument("--no-enable-prefix-caching", dest="prefix_caching", action="store_false")
    sub.add_parser("--version")
    args, _unknown = parser.parse_known_args(argv)  # vLLM has hundreds of engine arguments
    return args


def _writable(variable: str, env: dict[str, str]) -> str | None:
    value = env.get(variable)
    if not value:
        return f"{variable} is not set: vLLM, torch, triton, numba and HF write their caches under it"
    probe = Path(value) / ".cache" / "vllm" if variable == "HOME" else Path(value) / "vllm"
    try:
        probe.mkdir(parents=True, exist_ok=True)
        (probe / ".write-test").write_text("ok\n")
    except OSError as exc:
        return f"{variable}={value} is not writable ({exc.strerror}): vLLM's caches live there"
    return None


def _gpu_count() -> int | None:
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines()) if listed.returncode == 0 else None


def check_environment(args: argparse.Namespace, env: dict[str, str]) -> list[str]:
    problems = [p for p in (_writable("HOME", env), _writable("XDG_CACHE_HOME", env) if "XDG_CACHE_HOME" in env
                            else None) if p]
    if env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        problems.append(f"CUDA_DEVICE_ORDER={env.get('CUDA_DEVICE_ORDER', '(unset)')}: CUDA numbers GPUs fastest-first, "
                        "not by PCI bus as nvidia-smi and the topology do (set PCI_BUS_ID)")
    if env.get("VLLM_PORT"):
        try:
            first = int(env["VLLM_PORT"])
        except ValueError:
            problems.append(f"VLLM_PORT={env['VLLM_PORT']!r} is not a port number")
        else:
            last = first + args.tensor_parallel_size
            if first <= args.port <= last:
                problems.append(f"VLLM_PORT={first}: vLLM's internal ports {first}-{last} include the API port "
                                f"--port {args.port} (VLLM_PORT is the first internal port, not the API port)")
    devices = [d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    count = _gpu_count()
    if count is None:
        problems.append("no NVIDIA driver: nvidia-smi -L failed")
    elif not all(d.strip().isdigit() and int(d) < count for d in devices) or len(devices) != args.tensor_parallel_size:
        problems.append(f"CUDA_VISIBLE_DEVICES={env.get('CUDA_VISIBLE_DEVICES', '(unset)')}: need "
                        f"--tensor-parallel-size {args.tensor_parallel_size} GPUs among the {count} nvidia-smi lists")
    if not (Path(args.model) / "config.json").is_file():
        problems.append(f"{args.model}: no config.json (not a model directory)")
    elif (missing := weights_problem(Path(args.model), args.model)) is not None:
        problems.append(missing)
    return problems


WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")  # vLLM's load_format auto, with its fall back to .pt


def weights_problem(directory: Path, model: str) -> str | None:
    """vLLM's error for a model directory without weight files (None: it has some)."""
    if any(any(p.is_file() for p in directory.glob(pattern)) for pattern in WEIGHT_PATTERNS):
        return None
    return f"RuntimeError: Cannot find any model weights with `{model}`"


def bind_internal_ports(args: argparse.Namespace, env: dict[str, str]) -> list[socket.socket]:
    if not env.get("VLLM_PORT"):
        return []
    held = []
    for port in range(int(env["VLLM_PORT"]), int(env["VLLM_PORT"]) + args.tensor_parallel_size + 1):
        sock = socket.socket()
        try:
            sock.bind((args.host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise SystemExit(f"vllm: internal port {port} (from VLLM_PORT): [Errno 98] Address already in use") from exc
            raise
        sock.listen()
        held.append(sock)
    return held


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["--version"], ["-v"]):
        print(VERSION)
        return 0
    args = parse(argv)
    env = dict(os.environ)
    problems = check_environment(args, env)
    if problems:
        for problem in problems:
            print(f"vllm serve: {problem}", file=sys.stderr)
        return 1
    held = bind_internal_ports(args, env)
    from vllm._sim.vllm.server import SimulatedIU  # vendored sim.vllm (see sim/pypi/build.py)

    try:
        # vLLM's rule: --api-key, else VLLM_API_KEY; /v1/* then needs it
        server = SimulatedIU(args.host, args.port, arrival_rate=float(env.get("CLUSTERCTL_SIM_ARRIVAL_RATE", "1.0")),
                             seed=args.port, warmup_s=30.0, api_key=args.api_key or env.get("VLLM_API_KEY") or None
                             ).start()
    except OSError as exc:
        print(f"vllm serve: --host {args.host} --port {args.port}: {exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"vllm {VERSION} (clusterctl stand-in) serving {args.served_model_name or args.model} on "
          f"http://{args.host}:{args.port}", flush=True)
    stop.wait()
    server.stop()
    for sock in held:
        sock.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
