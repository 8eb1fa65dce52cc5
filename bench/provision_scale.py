"""Benchmark: wall time and peak memory of site.yml on N simulated hosts, first run and idempotent rerun.

    .venv/bin/python bench/provision_scale.py [--sizes 4,16,64] [--forks 16,64] [--batches 100%] [--json OUT]

For each size a virtual inventory is created (`clusterctl virtual create`, IB racks and a RoCE rack, no
faults) in a temp dir; for each forks value the hosts are brought up fresh (`clusterctl virtual up`), then
`clusterctl provision --batches 100%` runs twice (first run, then the idempotent rerun, which must report
changed=0). Forks values above the host count are the same run (all hosts in one batch) and are
measured once, reported with the effective forks. Peak memory is the largest sum of RSS over `clusterctl provision` and all its descendants
(ansible-playbook, its forks and the module processes), sampled every 0.1 s. The simulated hosts are
always torn down. Targets (issue 3): 64 hosts <= 4x the time of 4 hosts; rerun <= 0.5x the first run.
"""

from __future__ import annotations

import argparse
import json
import os
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


@dataclass
class Measurement:
    hosts: int
    forks: int
    run: str  # first | rerun
    wall_s: float
    cpu_s: float  # user + system CPU of the whole process tree (robust to other load on the machine)
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
            up = clusterctl("virtual", "up", str(inventory))  # fresh overlays: a real first run
            if up.returncode:
                raise SystemExit(f"virtual up failed: {up.stderr}")
            for run in ("first", "rerun"):
                run_dir = workdir / f"run-{hosts}-{forks}-{run}"
                wall, cpu, peak, changed, failed, rc = provision_once(inventory, forks, batches, run_dir)
                m = Measurement(hosts, forks, run, round(wall, 1), round(cpu, 1), round(peak, 1), changed, failed, rc)
                print(f"  {hosts:>3} hosts, forks {forks:>2}, {run:<5}: {m.wall_s:7.1f} s wall, {m.cpu_s:7.1f} s CPU, "
                      f"peak {m.peak_rss_mib:7.1f} MiB, changed={changed}, failed={failed}", flush=True)
                results.append(m)
                if json_out:
                    json_out.write_text(json.dumps([asdict(r) for r in results], indent=2))
    finally:
        clusterctl("virtual", "down", str(inventory))


def table(results: list[Measurement]) -> str:
    rows = ["| hosts | forks | first run wall (s) | rerun wall (s) | rerun/first | first CPU (s) | rerun CPU (s) "
            "| peak RSS first (MiB) | peak RSS rerun (MiB) | rerun changed |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    keyed = {(m.hosts, m.forks, m.run): m for m in results}
    for hosts, forks in dict.fromkeys((m.hosts, m.forks) for m in results):
        first, rerun = keyed.get((hosts, forks, "first")), keyed.get((hosts, forks, "rerun"))
        ratio = f"{rerun.wall_s / first.wall_s:.2f}" if first and rerun else "-"
        rows.append(
            f"| {hosts} | {forks} | {first.wall_s if first else '-'} | {rerun.wall_s if rerun else '-'} | {ratio} "
            f"| {first.cpu_s if first else '-'} | {rerun.cpu_s if rerun else '-'} "
            f"| {first.peak_rss_mib if first else '-'} | {rerun.peak_rss_mib if rerun else '-'} "
            f"| {rerun.changed if rerun else '-'} |"
        )
    return "\n".join(rows)


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
    firsts = {(m.hosts, m.forks): m.wall_s for m in results if m.run == "first"}
    for forks in forks_list:
        if (4, forks) in firsts and (64, forks) in firsts:
            print(f"forks {forks}: 64 hosts / 4 hosts = {firsts[(64, forks)] / firsts[(4, forks)]:.1f}x (target <= 4x)")


if __name__ == "__main__":
    main()
