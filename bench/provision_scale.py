"""Benchmark: site.yml over SSH on N simulated machines, first run and idempotent rerun.

    .venv/bin/python bench/provision_scale.py [--sizes 4,16,64] [--forks 16,64] [--batches 100%] [--json OUT]

For each size a virtual inventory is created (`clusterctl virtual create`, IB racks and a RoCE rack, no
faults) in a temp dir; for each forks value the machines are booted fresh (`clusterctl virtual up`), then
`clusterctl provision --batches 100%` runs twice (first run, then the idempotent rerun, which must report
changed=0). Ansible reaches the machines as production hosts: SSH as deploy with sudo, pipelining, one
ControlPersist connection per host. Forks values above the host count are the same run and are
measured once, reported with the effective forks.

Controller CPU is what this machine spends for the run: `clusterctl provision`, ansible-playbook, its
forks and ssh clients (rusage of the children) plus the ControlPersist ssh masters, which detach from
the run (their CPU is read from /proc before and after). Machine CPU is what the machines' processes
(sshd, sudo, the module runs) used, read the same way from every machine's process tree; on real hosts
it is spent on the nodes. Peak memory is the largest sum of RSS over the run's controller process tree
(sampled every 0.1 s), also given per fork. Targets: rerun <= 0.5x the first run; controller
CPU per host on a rerun <= 1.0 CPU-s. The machines are always torn down.

`--cache preseeded,empty` also states what a local package cache saves, side by side in one run: for each
size the first run is measured twice on freshly booted machines, once as the image comes (Debian's
packages the roles install already in apt's archive cache and the lists kept: what a site's apt-cacher-ng or
local mirror gives, at best: nothing to fetch from far away) and once with apt's cache and lists emptied on
every machine first (`apt-get clean`, lists removed: a stock cloud image fetching everything from Debian's
archive). "fetched" is what apt added to each machine's archive cache and lists during the run. NVIDIA's,
HashiCorp's and the pip packages come from the stand-in repositories on loopback in both variants (a local
mirror by construction), so the table measures the Debian part only.
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
sys.path.insert(0, str(REPO))
import ansible_floor  # noqa: E402
from verdict import shown  # noqa: E402

from provision.run import runner_env  # noqa: E402
from sim.hosts import lifecycle  # noqa: E402

CONTROL_DIR = "/tmp/.clusterctl-cp"  # ansible.cfg's control_path_dir
CPU_TARGET_PER_HOST = 1.0  # controller CPU-s per host on a rerun


@dataclass
class Measurement:
    hosts: int
    forks: int
    run: str  # first | rerun
    wall_s: float
    cpu_s: float  # controller: user + system CPU of the run's processes and the ssh masters
    host_cpu_s: float  # the machines' side: sshd, sudo, module runs inside the machines
    peak_rss_mib: float
    changed: int
    failed: int
    rc: int
    apt_cache: str = "preseeded"  # preseeded | empty: apt's cache on the machines before the run
    fetched_mib: float = 0.0  # what apt added to the machines' archive cache and lists during the run


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


def ssh_master_cpu() -> dict[int, float]:
    """pid -> CPU of the ControlPersist masters (`ssh: /tmp/.clusterctl-cp/<hash> [mux]`)."""
    out = {}
    for p in psutil.process_iter(["cmdline"]):
        cmdline = p.info["cmdline"] or []
        if cmdline and cmdline[0].startswith(f"ssh: {CONTROL_DIR}/"):
            try:
                t = p.cpu_times()
                out[p.pid] = t.user + t.system
            except psutil.Error:
                continue
    return out


APT_CACHE_DIRS = ("/var/cache/apt/archives", "/var/lib/apt/lists")
EMPTY_APT_CACHE = "apt-get clean && find /var/lib/apt/lists -mindepth 1 -maxdepth 1 ! -name lock ! -name partial -delete"


def on_every_machine(inventory: Path, hosts: list[str], script: str) -> list[str]:
    """stdout of ``script`` on every machine (as root, over SSH); SystemExit naming the host when it fails."""
    out = []
    for host in hosts:
        done = lifecycle.run_on(inventory, host, "sh", "-ec", script)
        if done.returncode:
            raise SystemExit(f"{host}: {script!r} failed: {done.stderr.strip()[-300:]}")
        out.append(done.stdout)
    return out


def apt_cache_bytes(inventory: Path, hosts: list[str]) -> int:
    """Bytes in apt's archive cache and lists, summed over the machines."""
    sizes = on_every_machine(inventory, hosts, f"du -sbc {' '.join(APT_CACHE_DIRS)} | tail -n1 | cut -f1")
    return sum(int(size.strip()) for size in sizes)


@dataclass(frozen=True)
class Measured:
    wall_s: float
    cpu_s: float  # controller: the command's process tree (rusage of children) + the ssh masters' CPU
    host_cpu_s: float
    peak_rss_mib: float
    returncode: int
    stderr: str


def measured(argv: list[str], inventory: Path, env: dict[str, str] | None = None) -> Measured:
    """Run ``argv`` and measure what it cost this machine (the controller) and the machines."""
    start = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    masters_before, machines_before = ssh_master_cpu(), lifecycle.machine_cpu_seconds(inventory)
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)
    with PeakRss(proc.pid) as rss:
        _, stderr = proc.communicate()
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    masters = sum(cpu - masters_before.get(pid, 0.0) for pid, cpu in ssh_master_cpu().items())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime) + masters
    host_cpu = lifecycle.machine_cpu_seconds(inventory) - machines_before
    return Measured(wall, cpu, host_cpu, rss.peak / 2**20, proc.returncode, stderr)


def provision_once(inventory: Path, forks: int, batches: str,
                   run_dir: Path) -> tuple[float, float, float, float, int, int, int]:
    argv = [sys.executable, "-m", "cli.main", "provision", "-i", str(inventory), "--forks", str(forks),
            "--batches", batches, "--run-dir", str(run_dir)]
    run = measured(argv, inventory)
    changed = failed = 0
    for line in reversed((run_dir / "events.jsonl").read_text().splitlines()):
        event = json.loads(line)
        if event.get("event") == "playbook_on_stats":
            data = event["event_data"]
            changed = sum((data.get("changed") or {}).values())
            failed = sum((data.get("failures") or {}).values()) + sum((data.get("dark") or {}).values())
            break
    if run.returncode:
        print(f"  provision exited {run.returncode}: {run.stderr[-500:]}", file=sys.stderr)
    return run.wall_s, run.cpu_s, run.host_cpu_s, run.peak_rss_mib, changed, failed, run.returncode


def ansible_floor_lines(inventory: Path, hosts: int, forks: int, workdir: Path, rerun_events: Path,
                        rerun_cpu_per_host: float) -> list[str]:
    """Ansible's per-task floor on these machines (bench/ansible_floor.py), next to the rerun it explains."""
    env = {**os.environ, **runner_env()}

    def run_cpu(playbook: Path) -> float:
        run = measured([str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory),
                        "--forks", str(forks), str(playbook)], inventory, env)
        if run.returncode:
            raise SystemExit(f"{playbook.name} failed: {run.stderr[-500:]}")
        return run.cpu_s

    costs = ansible_floor.measure_costs(workdir, hosts, run_cpu)
    counts = ansible_floor.task_counts(rerun_events.read_text().splitlines())
    return ansible_floor.floor_lines(hosts, counts, costs, rerun_cpu_per_host, CPU_TARGET_PER_HOST)


def bench_size(hosts: int, forks_list: list[int], batches: str, workdir: Path, results: list[Measurement],
               json_out: Path | None, caches: list[str], references: list[str] | None) -> None:
    """Measure one size; with ``references`` (a list), Ansible's floor after each rerun is appended to it."""
    inventory = workdir / f"inv-{hosts}"
    racks = max(2, hosts // 16)
    created = clusterctl("virtual", "create", "-i", str(inventory), "--nodes", str(hosts), "--racks", str(racks),
                         "--fabric", "mixed", "--faults", "none")
    if created.returncode:
        raise SystemExit(f"virtual create failed: {created.stderr}")
    # forks above the host count change nothing (one batch of `hosts` hosts): measure each effective value once
    effective = sorted({min(forks, hosts) for forks in forks_list})
    # the cache comparison runs at the largest forks value: a first run only (a rerun installs nothing)
    runs = [(forks, "preseeded", ("first", "rerun")) for forks in effective if "preseeded" in caches]
    runs += [(effective[-1], cache, ("first",)) for cache in caches if cache != "preseeded"]
    try:
        for forks, cache, kinds in runs:
            up = clusterctl("virtual", "up", "-i", str(inventory), "--reset")  # fresh overlays: a real first run
            if up.returncode:
                raise SystemExit(f"virtual up failed: {up.stderr}")
            names = list(lifecycle.simulated_hosts(inventory))
            if cache == "empty":
                on_every_machine(inventory, names, EMPTY_APT_CACHE)
            for run in kinds:
                run_dir = workdir / f"run-{hosts}-{forks}-{cache}-{run}"
                cached = apt_cache_bytes(inventory, names)
                wall, cpu, host_cpu, peak, changed, failed, rc = provision_once(inventory, forks, batches, run_dir)
                fetched = (apt_cache_bytes(inventory, names) - cached) / 2**20
                m = Measurement(hosts, forks, run, round(wall, 1), round(cpu, 1), round(host_cpu, 1), round(peak, 1),
                                changed, failed, rc, cache, round(fetched, 1))
                print(f"  {hosts:>3} hosts, forks {forks:>2}, apt cache {cache}, {run:<5}: {m.wall_s:7.1f} s wall, "
                      f"{m.cpu_s:7.1f} s CPU (+{m.host_cpu_s:.1f} s in the machines), peak {m.peak_rss_mib:7.1f} MiB, "
                      f"changed={changed}, failed={failed}, apt fetched {m.fetched_mib} MiB", flush=True)
                results.append(m)
                if run == "rerun" and references is not None:
                    references += ansible_floor_lines(inventory, hosts, forks, workdir, run_dir / "events.jsonl",
                                                      m.cpu_s / hosts)
                if json_out:
                    json_out.write_text(json.dumps([asdict(r) for r in results], indent=2))
    finally:
        clusterctl("virtual", "down", "-i", str(inventory))


def table(results: list[Measurement]) -> str:
    rows = ["| hosts | forks | first run wall (s) | rerun wall (s) | rerun/first | controller CPU first / rerun (s) "
            "| controller CPU per host first / rerun (s) | machines' CPU first / rerun (s) "
            "| peak RSS first / rerun (MiB) | peak RSS per fork (MiB) | rerun changed |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    keyed = {(m.hosts, m.forks, m.run): m for m in results if m.apt_cache == "preseeded"}
    for hosts, forks in dict.fromkeys((m.hosts, m.forks) for m in results):
        first, rerun = keyed.get((hosts, forks, "first")), keyed.get((hosts, forks, "rerun"))
        if not (first and rerun):
            continue
        rows.append(
            f"| {hosts} | {forks} | {first.wall_s} | {rerun.wall_s} | {rerun.wall_s / first.wall_s:.2f} "
            f"| {first.cpu_s} / {rerun.cpu_s} | {first.cpu_s / hosts:.2f} / {rerun.cpu_s / hosts:.2f} "
            f"| {first.host_cpu_s} / {rerun.host_cpu_s} | {first.peak_rss_mib} / {rerun.peak_rss_mib} "
            f"| {max(first.peak_rss_mib, rerun.peak_rss_mib) / forks:.1f} | {rerun.changed} |"
        )
    return "\n".join(rows)


def cache_table(results: list[Measurement]) -> str:
    """First runs with apt's cache pre-seeded vs. empty, side by side per size (empty when not measured)."""
    firsts = {(m.hosts, m.apt_cache): m for m in results if m.run == "first"}
    rows = ["| hosts | first run wall, apt cache empty / pre-seeded (s) | pre-seeded / empty "
            "| apt fetched, empty / pre-seeded (MiB, all machines) | machines' CPU empty / pre-seeded (s) |",
            "|---:|---:|---:|---:|---:|"]
    for hosts in dict.fromkeys(m.hosts for m in results):
        empty, seeded = firsts.get((hosts, "empty")), firsts.get((hosts, "preseeded"))
        if empty and seeded:
            rows.append(f"| {hosts} | {empty.wall_s} / {seeded.wall_s} | {seeded.wall_s / empty.wall_s:.2f} "
                        f"| {empty.fetched_mib} / {seeded.fetched_mib} | {empty.host_cpu_s} / {seeded.host_cpu_s} |")
    return "\n".join(rows) if len(rows) > 2 else ""


def summary(results: list[Measurement]) -> list[str]:
    """The targets, each "met" only when met, and how busy the 2 cores were (CPU-bound runs)."""
    keyed = {(m.hosts, m.forks, m.run): m for m in results if m.apt_cache == "preseeded"}
    lines = []
    for m in results:
        if m.run != "rerun" or not (first := keyed.get((m.hosts, m.forks, "first"))):
            continue
        ratio = m.wall_s / first.wall_s
        per_host = m.cpu_s / m.hosts
        lines.append(f"{m.hosts} hosts, forks {m.forks}: rerun / first = {shown(ratio, 0.5)} (target <= 0.5: "
                     f"{'met' if ratio <= 0.5 else 'NOT met'}); controller CPU per host on the rerun = "
                     f"{shown(per_host, CPU_TARGET_PER_HOST)} CPU-s (target <= {CPU_TARGET_PER_HOST}: "
                     f"{'met' if per_host <= CPU_TARGET_PER_HOST else 'NOT met'}); "
                     f"changed={m.changed} ({'idempotent' if m.changed == 0 else 'NOT idempotent'})")
    cores = os.cpu_count() or 1
    for m in results:
        busy = (m.cpu_s + m.host_cpu_s) / (m.wall_s * cores)
        lines.append(f"{m.hosts} hosts {m.run} (apt cache {m.apt_cache}): controller {m.cpu_s:.0f} s + machines {m.host_cpu_s:.0f} s CPU over "
                     f"{m.wall_s:.0f} s wall on {cores} cores = {busy:.0%} busy")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4,16,64", help="host counts, comma-separated")
    parser.add_argument("--forks", default="16,64", help="forks values, comma-separated")
    parser.add_argument("--batches", default="100%", help="--batches for provision (100%%: one batch)")
    parser.add_argument("--json", type=Path, default=None, help="also write the measurements as JSON")
    parser.add_argument("--cache", default="preseeded",
                        help="apt cache variants, comma-separated: preseeded (the image's), empty (emptied first)")
    parser.add_argument("--no-floor", action="store_true",
                        help="skip Ansible's per-task floor after each rerun (bench/ansible_floor.py; ~2 min at 4 hosts)")
    args = parser.parse_args()
    caches = args.cache.split(",")
    if unknown := set(caches) - {"preseeded", "empty"}:
        parser.error(f"--cache: unknown variant(s) {', '.join(sorted(unknown))} (preseeded, empty)")
    sizes = [int(s) for s in args.sizes.split(",")]
    forks_list = [int(f) for f in args.forks.split(",")]
    print(f"provision_scale: sizes {sizes}, forks {forks_list}, batches {args.batches}, "
          f"{os.cpu_count()} CPUs", flush=True)
    results: list[Measurement] = []
    references: list[str] | None = None if args.no_floor else []
    with tempfile.TemporaryDirectory(prefix="provision-bench-", dir="/tmp") as tmp:
        for hosts in sizes:
            bench_size(hosts, forks_list, args.batches, Path(tmp), results, args.json, caches, references)
    print(table(results))
    if cached := cache_table(results):
        print(cached)
    print("\n".join(summary(results)))
    print("\n".join(references or []))


if __name__ == "__main__":
    main()
