"""Preflight fan-out benchmark over SSH: 1, 16, 64 and 128 simulated machines, every stub command 1 s.

    .venv/bin/python bench/preflight_fanout.py [--sizes 1,16,64,128] [--parallel 64] [--delay 1] [--per-rack 16]

For each size: ``clusterctl virtual create`` (healthy nodes, 16 per rack, InfiniBand) with
``sim_command_delay_s`` set, ``virtual up``, then ``clusterctl preflight -i DIR --parallel P`` in a child
process; ``virtual down`` always. Preflight reaches every machine through ``SshTransport`` (fabric, one
connection per node for all its commands, host keys verified). Prints one table row per size: wall
time, ratio to one node, the preflight process's peak RSS, its CPU time (the controller's: SSH included)
per node, the CPU time the machines used (sshd and the stub tools: all machines share this machine's
cores, real hosts would not), the CPU floor and x floor (target <= 1.1x), and the load average when the
size finished. A second table is `bench/virtual_machines.py`'s for the same sizes (up/down time, CPU,
memory, what `down` left behind: must be nothing, else the script exits 1), so one boot per size serves both.

A 1-node run has no ib_pairs work (no peer in its rack); larger runs test their racks' rings.
numa_pinning and consul are skipped (no vllm-iu units are written; no Consul needed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
import virtual_machines  # noqa: E402
from verdict import shown  # noqa: E402

from sim.hosts import lifecycle  # noqa: E402

TARGET_X_FLOOR = 1.1
CHILD = r"""
import json, resource, sys, time
from cli.main import main
started = time.monotonic()
code = 0
try:
    main(sys.argv[2:])
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 1
self_usage = resource.getrusage(resource.RUSAGE_SELF)
children = resource.getrusage(resource.RUSAGE_CHILDREN)
with open(sys.argv[1], "w") as out:
    json.dump({"exit_code": code, "wall_s": time.monotonic() - started, "peak_rss_kib": self_usage.ru_maxrss,
               "cpu_self_s": self_usage.ru_utime + self_usage.ru_stime,
               "cpu_children_s": children.ru_utime + children.ru_stime}, out)
"""


clusterctl = virtual_machines.clusterctl


def one_size(
    nodes: int, parallel: int, delay: float, per_rack: int, timeout: float, checks: str | None, depth: str = "standard",
) -> dict:
    racks = max(1, math.ceil(nodes / per_rack))
    with tempfile.TemporaryDirectory(prefix=f"preflight-bench-{nodes}-") as tmp:
        inventory = Path(tmp) / "inventory"
        clusterctl(
            "virtual",
            "create",
            "-i",
            str(inventory),
            "--nodes",
            str(nodes),
            "--racks",
            str(racks),
            "--faults",
            "none",
        )
        group_vars = inventory / "group_vars" / "all.yml"
        group_vars.write_text(
            group_vars.read_text().replace("sim_command_delay_s: 0.0", f"sim_command_delay_s: {delay}")
        )
        assert f"sim_command_delay_s: {delay}" in group_vars.read_text()
        machines_row = {"nodes": nodes, **virtual_machines.up_measured(inventory)}
        try:
            stats_file = Path(tmp) / "stats.json"
            document = Path(tmp) / "run.json"
            machines_before = lifecycle.machine_cpu_seconds(inventory)
            started = time.monotonic()
            subprocess.run(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    str(stats_file),
                    "preflight",
                    "-i",
                    str(inventory),
                    "--parallel",
                    str(parallel),
                    *(["--checks", checks] if checks else ["--skip", "numa_pinning,consul"]),
                    "--depth",
                    depth,
                    "--timeout",
                    str(timeout),
                    "--json",
                    str(document),
                    "--state-dir",
                    str(Path(tmp) / "state"),
                ],
                cwd=REPO,
                check=False,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            wall = time.monotonic() - started
            load = virtual_machines.load_average()
            machines_cpu = lifecycle.machine_cpu_seconds(inventory) - machines_before
            stats = json.loads(stats_file.read_text())
            run = json.loads(document.read_text())
            summary = run["summary"]
        finally:
            machines_row.update(virtual_machines.down_measured(inventory))
            machines_row["load"] = virtual_machines.load_average()
    return {"nodes": nodes, "racks": racks, "wall_s": wall, **stats, "cpu_machines_s": machines_cpu,
            "verdicts": summary["verdicts"], "problems": problems_of(run), "load": load, "machines": machines_row}


def problems_of(run: dict) -> list[str]:
    """Every result that is not PASS or SKIP, one line each: on healthy machines each one needs a cause, so
    the bench keeps them (the run's JSON goes with its temp dir)."""
    return [f"{r['verdict']} {r['node']} {r.get('iu') or '-'} {r['check']} "
            f"{(r.get('evidence') or {}).get('code', '-')}: {r.get('reason', '')}"
            for r in run.get("results", []) if r["verdict"] not in ("PASS", "SKIP")]


def table(rows: list[dict], parallel: int, delay: float, checks: str | None = None, depth: str = "standard") -> str:
    """One row per size. ``CPU floor`` is all CPU time spent (preflight + the machines) divided by this
    machine's cores: no scheduler can finish faster, and on real hosts the machines' share would be spent
    on the hosts themselves. ``x floor`` = wall / max(1-node wall, CPU floor); target <= 1.1."""
    cpus = os.cpu_count() or 1
    base = rows[0]["wall_s"]
    lines = [
        f"preflight fan-out over SSH, --parallel {parallel}, depth {depth}, every stub command {delay:g} s, "
        f"{cpus} CPUs, checks: {checks or 'all but numa_pinning,consul'}",
        "| nodes | racks | wall s | x 1 node | peak RSS MiB | controller CPU s | per node | machines CPU s "
        "| CPU floor s | x floor | target | exit | verdicts | load |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---|",
    ]
    for r in rows:
        controller = r["cpu_self_s"] + r["cpu_children_s"]
        floor = (controller + r["cpu_machines_s"]) / cpus
        x_floor = r["wall_s"] / max(base, floor)
        verdicts = " ".join(f"{k} {v}" for k, v in r["verdicts"].items() if v)
        lines.append(
            f"| {r['nodes']} | {r['racks']} | {r['wall_s']:.1f} | {r['wall_s'] / base:.2f} | "
            f"{r['peak_rss_kib'] / 1024:.0f} | {controller:.1f} | {controller / r['nodes']:.3f} | "
            f"{r['cpu_machines_s']:.1f} | {floor:.1f} | {shown(x_floor, TARGET_X_FLOOR)} | "
            f"{'met' if x_floor <= TARGET_X_FLOOR else 'NOT met'} | {r['exit_code']} | {verdicts} | {r['load']} |"
        )
    for r in rows:
        lines += [f"{r['nodes']} nodes: {p}" for p in r.get("problems", [])]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="1,16,64,128", help="node counts (comma separated; the first is the base)"
    )
    parser.add_argument("--parallel", type=int, default=64)
    parser.add_argument("--delay", type=float, default=1.0, help="seconds every simulated command takes")
    parser.add_argument("--per-rack", type=int, default=16, help="nodes per rack")
    parser.add_argument("--depth", default="standard", choices=["quick", "standard", "full"],
                        help="preflight --depth (default standard)")
    parser.add_argument("--timeout", type=float, default=120.0, help="per-command timeout given to preflight")
    parser.add_argument(
        "--checks", default=None, help="only these checks (default: all but numa_pinning,consul)"
    )
    parser.add_argument("--json", dest="json_file", default=None, help="also write the rows as JSON")
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so `virtual down` and the temp dir cleanup still run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        try:
            rows.append(one_size(size, args.parallel, args.delay, args.per_rack, args.timeout, args.checks,
                                 args.depth))
        except RuntimeError as exc:  # report what was measured, and why the rest was not
            print(f"{size} nodes: not measured: {exc}", file=sys.stderr, flush=True)
            break
        print(f"{size} nodes: {rows[-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
        if args.json_file:
            Path(args.json_file).write_text(json.dumps(rows, indent=2))
    if rows:
        print(table(rows, args.parallel, args.delay, args.checks, args.depth))
        print()
        print(virtual_machines.table([r["machines"] for r in rows]))
    if any(r["machines"]["left"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
