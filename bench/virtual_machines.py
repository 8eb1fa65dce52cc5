"""Benchmark: `clusterctl virtual up` and `down` of N simulated machines: wall time and memory.

    .venv/bin/python bench/virtual_machines.py [--sizes 4,16,64,128] [--json OUT]

For each size a virtual inventory (16 nodes per rack, no faults) is created in a temp dir, then
`clusterctl virtual up` (machine image already cached: run `virtual up` once before to build it) and
`virtual down` run as child processes. Memory is the summed RSS of every machine's processes (nspawn,
systemd, journald, dbus, sshd) right after `up` returns, also per machine; PSS would be lower (the
machines share the image's pages), RSS is the conservative number. Nothing is left running: `down`
always runs, and the table says how many nspawn processes were found afterwards (must be 0).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from sim.hosts import machines, simulate  # noqa: E402


def clusterctl(*args: str) -> float:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"clusterctl {' '.join(args)} exited {done.returncode}: {done.stderr[-1500:]}")
    return time.monotonic() - started


def machines_rss(inventory: Path) -> int:
    total = 0
    nspawns = machines._our_processes(simulate.layout(inventory))[0]
    for pid in nspawns:
        try:
            root = psutil.Process(pid)
            for proc in [root, *root.children(recursive=True)]:
                total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total


def one_size(nodes: int, tmp: Path) -> dict:
    inventory = tmp / f"inv-{nodes}"
    clusterctl("virtual", "create", str(inventory), "--nodes", str(nodes), "--racks",
               str(max(1, math.ceil(nodes / 16))), "--faults", "none")
    try:
        up_s = clusterctl("virtual", "up", str(inventory))
        rss = machines_rss(inventory)
        running = len(machines._our_processes(simulate.layout(inventory))[0])
    finally:
        down_s = clusterctl("virtual", "down", str(inventory))
    left = len(machines._our_processes(simulate.layout(inventory))[0])
    return {"nodes": nodes, "up_s": up_s, "down_s": down_s, "rss_mib": rss / 2**20, "running": running,
            "left": left}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16,64,128")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="virtual-bench-", dir="/tmp") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            rows.append(one_size(size, Path(tmp)))
            print(f"{size} machines: up {rows[-1]['up_s']:.1f} s, down {rows[-1]['down_s']:.1f} s",
                  file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=2))
    print("| machines | up s | per machine s | down s | RSS MiB | per machine MiB | running after up | left after down |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['nodes']} | {r['up_s']:.1f} | {r['up_s'] / r['nodes']:.2f} | {r['down_s']:.1f} | "
              f"{r['rss_mib']:.0f} | {r['rss_mib'] / r['nodes']:.1f} | {r['running']} | {r['left']} |")


if __name__ == "__main__":
    main()
