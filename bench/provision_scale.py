"""Benchmark: wall time and peak memory of site.yml on N simulated hosts, first run and idempotent rerun.

    .venv/bin/python bench/provision_scale.py [--sizes 4,16,64] [--forks 16,64] [--batches 100%] [--json OUT]

For each size a virtual inventory is created (`clusterctl virtual create`, IB racks and a RoCE rack, no
faults) in a temp dir; for each forks value the hosts are brought up fresh (`clusterctl virtual up`), then
`clusterctl provision --batches 100%` runs twice (first run, then the idempotent rerun, which must report
changed=0). Forks values above the host count are the same run (all hosts in one batch) and are
measured once, reported with the effective forks. Peak memory is the largest sum of RSS over `clusterctl provision` and all its descendants
(ansible-playbook, its forks and the module processes), sampled every 0.1 s. CPU is split into the
simulated hosts' side (module runs: each host's python wrapper logs the CPU of every run) and the
controller's (ansible-playbook, its forks, clusterctl): on real hosts only the controller's share is spent
on the machine running clusterctl. The simulated hosts are always torn down. Targets (issue 3): 64 hosts <= 4x the time of 4 hosts; rerun <= 0.5x the first run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from cluster.virtual.namespaces import PYTHON_CPU_LOG  # noqa: E402

TIMES_FIELD = re.compile(r"(\d+)m([\d.]+)s")


@dataclass
class Measurement:
    hosts: int
    forks: int
    run: str  # first | rerun
    wall_s: float
    cpu_s: float  # user + system CPU of the whole process tree (robust to other load on the machine)
    host_cpu_s: float  # of which the simulated hosts' side: module runs (python inside the hosts)
    peak_rss_mib: float
    changed: int
    failed: int
    rc: int


def clusterctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, capture_output=True, text=True)


class PeakRss:
    """Largest summed RSS of a process tree, sampled in a thread."""

    def __init__(self, pid: int, interval_s: float = 0.1):
        self.root = psutil.Process(pid)
        self.interval_s = interval_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            total = 0
            try:
                for proc in [self.root, *self.root.children(recursive=True)]:
                    try:
                        total += proc.memory_info().rss
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def host_cpu_logs(inventory: Path) -> list[Path]:
    return sorted((inventory / ".sim").glob(f"*/state/{PYTHON_CPU_LOG}"))


def host_cpu_seconds(inventory: Path) -> float:
    """CPU used by module runs on the simulated hosts: the python wrapper appends `times` after each run
    (second line: the children's user and system time)."""
    total = 0.0
    for log in host_cpu_logs(inventory):
        lines = log.read_text().splitlines()
        for children in lines[1::2]:
            total += sum(int(m) * 60 + float(s) for m, s in TIMES_FIELD.findall(children))
    return total


def provision_once(inventory: Path, forks: int, batches: str, run_dir: Path) -> tuple[float, float, float, int, int, int]:
    argv = [sys.executable, "-m", "cli.main", "provision", "-i", str(inventory), "--forks", str(forks),
            "--batches", batches, "--run-dir", str(run_dir)]
    start = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    with PeakRss(proc.pid) as rss:
        _, stderr = proc.communicate()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    changed = failed = 0
    for line in reversed((run_dir / "events.jsonl").read_text().splitlines()):
        event = json.loads(line)
        if event.get("event") == "playbook_on_stats":
            data = event["event_data"]
            changed = sum((data.get("changed") or {}).values())
            failed = sum((data.get("failures") or {}).values()) + sum((data.get("dark") or {}).values())
            break
    if proc.returncode:
        print(f"  provision exited {proc.returncode}: {stderr[-500:]}", file=sys.stderr)
    return wall, cpu, rss.peak / 2**20, changed, failed, proc.returncode


def bench_size(hosts: int, forks_list: list[int], batches: str, workdir: Path, results: list[Measurement],
               json_out: Path | None) -> None:
    inventory = workdir / f"inv-{hosts}"
    racks = max(2, hosts // 16)
    created = clusterctl("virtual", "create", str(inventory), "--nodes", str(hosts), "--racks", str(racks),
                         "--fabric", "mixed", "--faults", "none")
    if created.returncode:
        raise SystemExit(f"virtual create failed: {created.stderr}")
    # forks above the host count change nothing (one batch of `hosts` hosts): measure each effective value once
    effective = sorted({min(forks, hosts) for forks in forks_list})
    try:
        for forks in effective:
            up = clusterctl("virtual", "up", str(inventory), "--reset")  # fresh overlays: a real first run
            if up.returncode:
                raise SystemExit(f"virtual up failed: {up.stderr}")
            for run in ("first", "rerun"):
                run_dir = workdir / f"run-{hosts}-{forks}-{run}"
                for log in host_cpu_logs(inventory):
                    log.unlink()
                wall, cpu, peak, changed, failed, rc = provision_once(inventory, forks, batches, run_dir)
                host_cpu = host_cpu_seconds(inventory)
                m = Measurement(hosts, forks, run, round(wall, 1), round(cpu, 1), round(host_cpu, 1), round(peak, 1),
                                changed, failed, rc)
                print(f"  {hosts:>3} hosts, forks {forks:>2}, {run:<5}: {m.wall_s:7.1f} s wall, {m.cpu_s:7.1f} s CPU "
                      f"({m.host_cpu_s:.1f} s on the hosts), peak {m.peak_rss_mib:7.1f} MiB, changed={changed}, "
                      f"failed={failed}", flush=True)
                results.append(m)
                if json_out:
                    json_out.write_text(json.dumps([asdict(r) for r in results], indent=2))
    finally:
        clusterctl("virtual", "down", str(inventory))


def table(results: list[Measurement]) -> str:
    rows = ["| hosts | forks | first run wall (s) | rerun wall (s) | rerun/first | first CPU (s), of which hosts "
            "| rerun CPU (s), of which hosts | controller CPU per host first / rerun (s) | peak RSS first / rerun (MiB) "
            "| rerun changed |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    keyed = {(m.hosts, m.forks, m.run): m for m in results}
    for hosts, forks in dict.fromkeys((m.hosts, m.forks) for m in results):
        first, rerun = keyed.get((hosts, forks, "first")), keyed.get((hosts, forks, "rerun"))
        if not (first and rerun):
            continue
        rows.append(
            f"| {hosts} | {forks} | {first.wall_s} | {rerun.wall_s} | {rerun.wall_s / first.wall_s:.2f} "
            f"| {first.cpu_s}, {first.host_cpu_s} | {rerun.cpu_s}, {rerun.host_cpu_s} "
            f"| {(first.cpu_s - first.host_cpu_s) / hosts:.2f} / {(rerun.cpu_s - rerun.host_cpu_s) / hosts:.2f} "
            f"| {first.peak_rss_mib} / {rerun.peak_rss_mib} | {rerun.changed} |"
        )
    return "\n".join(rows)


def summary(results: list[Measurement], forks_list: list[int]) -> list[str]:
    """The two targets, and whether the run was CPU-bound (then wall time grows with hosts / cores)."""
    keyed = {(m.hosts, m.forks, m.run): m for m in results}
    lines = []
    for forks in forks_list:
        small, large = keyed.get((4, min(forks, 4), "first")), keyed.get((64, min(forks, 64), "first"))
        if small and large:
            lines.append(f"forks {forks}: 64 hosts / 4 hosts = {large.wall_s / small.wall_s:.1f}x (target <= 4x)")
    for m in results:
        if m.run == "rerun" and (first := keyed.get((m.hosts, m.forks, "first"))):
            lines.append(f"{m.hosts} hosts, forks {m.forks}: rerun / first = {m.wall_s / first.wall_s:.2f} "
                         f"(target <= 0.5)")
    cores = os.cpu_count() or 1
    for m in results:
        busy = m.cpu_s / (m.wall_s * cores)
        lines.append(f"{m.hosts} hosts {m.run}: CPU {m.cpu_s:.0f} s over {m.wall_s:.0f} s wall on {cores} cores = "
                     f"{busy:.0%} busy; {m.host_cpu_s / max(m.cpu_s, 1e-9):.0%} of it on the simulated hosts")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16,64", help="host counts, comma-separated")
    parser.add_argument("--forks", default="16,64", help="forks values, comma-separated")
    parser.add_argument("--batches", default="100%", help="--batches for provision (100%%: one batch)")
    parser.add_argument("--json", type=Path, default=None, help="also write the measurements as JSON")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    forks_list = [int(f) for f in args.forks.split(",")]
    print(f"provision_scale: sizes {sizes}, forks {forks_list}, batches {args.batches}, "
          f"{os.cpu_count()} CPUs", flush=True)
    results: list[Measurement] = []
    with tempfile.TemporaryDirectory(prefix="provision-bench-", dir="/tmp") as tmp:
        for hosts in sizes:
            bench_size(hosts, forks_list, args.batches, Path(tmp), results, args.json)
    print(table(results))
    print("\n".join(summary(results, forks_list)))


if __name__ == "__main__":
    main()
