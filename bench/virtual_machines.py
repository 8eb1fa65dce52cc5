"""Benchmark: `clusterctl virtual up` and `down` of N simulated machines: wall time, CPU and memory.

    .venv/bin/python bench/virtual_machines.py [--sizes 4,16,64,128] [--json OUT]

For each size a virtual inventory (16 nodes per rack, no faults) is created in a temp dir, then
`clusterctl virtual up` (machine image already cached: run `virtual up` once before to build it) and
`virtual down` run as child processes. Measured per size:

- up / down wall time, and the CPU the `clusterctl` child itself used (user + system, its reaped children
  included: ssh-keygen, nsenter, ssh probes; not the machines, which outlive it);
- memory right after `up` returns: the summed RSS of every machine's processes (nspawn, systemd, journald,
  dbus, sshd: the conservative number) and their summed PSS (shared image pages split between the
  machines: what they really add), and the drop of this machine's MemAvailable over `up` (kernel memory,
  page cache of the overlays and tmpfs included; noisy on a shared machine);
- what `down` left behind (``sim.hosts.machines.leftovers``: processes, mounts, overlays, cgroups). It
  must be nothing at every size: the script exits 1, after printing the table, when anything is left.

Each row carries this machine's load average when its size finished (the machine is shared: wall
times are noisy, CPU seconds less so). `bench/preflight_fanout.py` measures its own up/down through :func:`up_measured`
and :func:`down_measured` and prints the same table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from sim.hosts import lifecycle, machines  # noqa: E402


class BenchError(RuntimeError):
    pass


def clusterctl(*args: str) -> tuple[float, float]:
    """Run `clusterctl ARGS` as a child; (wall s, its CPU s). A failure raises with its stderr's tail."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, capture_output=True, text=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise BenchError(f"clusterctl {' '.join(args[:2])} exited {done.returncode}: {done.stderr[-1500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise BenchError("/proc/meminfo has no MemAvailable line")


def machines_memory(inventory: Path) -> tuple[int, int, int]:
    """(summed RSS, summed PSS, processes) of every machine's process tree, nspawn included."""
    rss = pss = count = 0
    nspawns = machines._our_processes(lifecycle.layout(inventory))[0]
    for pid in nspawns:
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in tree:
            try:
                info = proc.memory_full_info()
            except psutil.Error:
                continue
            rss, pss, count = rss + info.rss, pss + info.pss, count + 1
    return rss, pss, count


def up_measured(inventory: Path) -> dict:
    available = mem_available()
    up_s, up_cpu = clusterctl("virtual", "up", "-i", str(inventory))
    dropped = available - mem_available()
    rss, pss, processes = machines_memory(inventory)
    running = len(machines._our_processes(lifecycle.layout(inventory))[0])
    return {"up_s": up_s, "up_cpu_s": up_cpu, "rss_mib": rss / 2**20, "pss_mib": pss / 2**20,
            "mem_drop_mib": dropped / 2**20, "processes": processes, "running": running}


def down_measured(inventory: Path) -> dict:
    down_s, down_cpu = clusterctl("virtual", "down", "-i", str(inventory))
    left = machines.leftovers(machines.state_dir_of(inventory))
    return {"down_s": down_s, "down_cpu_s": down_cpu, "left": left}


def one_size(nodes: int, tmp: Path) -> dict:
    inventory = tmp / f"inv-{nodes}"
    clusterctl("virtual", "create", "-i", str(inventory), "--nodes", str(nodes), "--racks",
               str(max(1, math.ceil(nodes / 16))), "--faults", "none")
    row: dict = {"nodes": nodes}
    try:
        row.update(up_measured(inventory))
    finally:
        row.update(down_measured(inventory))
    row["load"] = load_average()
    return row


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def table(rows: list[dict]) -> str:
    """One row per size; ``load`` is the 1/5/15-minute load average when the size finished."""
    lines = [
        f"virtual up/down, 16 machines per rack, image cached, {os.cpu_count()} CPUs",
        "| machines | up s | per machine s | up CPU s | down s | down CPU s | RSS MiB | PSS MiB | PSS per machine MiB "
        "| MemAvailable drop MiB | processes | running after up | left after down | load |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        left = "none" if not r["left"] else f"{len(r['left'])}: {'; '.join(r['left'][:3])}"
        lines.append(
            f"| {r['nodes']} | {r['up_s']:.1f} | {r['up_s'] / r['nodes']:.2f} | {r['up_cpu_s']:.1f} | "
            f"{r['down_s']:.1f} | {r['down_cpu_s']:.1f} | {r['rss_mib']:.0f} | {r['pss_mib']:.0f} | "
            f"{r['pss_mib'] / r['nodes']:.1f} | {r['mem_drop_mib']:.0f} | {r['processes']} | {r['running']} | {left} "
            f"| {r.get('load', '')} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16,64,128")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="virtual-bench-", dir="/tmp") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            try:
                rows.append(one_size(size, Path(tmp)))
            except BenchError as exc:  # report what was measured, and why the rest was not
                print(f"{size} machines: not measured: {exc}", file=sys.stderr, flush=True)
                break
            print(f"{size} machines: up {rows[-1]['up_s']:.1f} s, down {rows[-1]['down_s']:.1f} s, "
                  f"load average {rows[-1]['load']}", file=sys.stderr, flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=2))
    if rows:
        print(table(rows))
    if any(r["left"] for r in rows) or len(rows) < len(args.sizes.split(",")):
        sys.exit(1)


if __name__ == "__main__":
    main()
