"""Controller CPU per SSH command: fabric's ``Connection.run`` against preflight's ``exec_on`` (paramiko channel).

    .venv/bin/python bench/ssh_exec.py [--nodes 16] [--commands 5] [--sleep 1]

Starts a private sshd (this machine's /usr/sbin/sshd, its own config, key and host key in a temp dir,
listening on 127.0.250.1:2222 only; needs root) and opens one connection per simulated node to it, as
preflight does. Then, side by side on the same connections, every node runs ``--commands`` commands
``sh -c 'sleep S; echo done'`` one after another, all nodes at once: first through fabric's
``Connection.run`` (what preflight used before ``exec_on``), then through
``preflight.transport.exec_on``. The table gives this process's CPU (user + system, all threads) per
command and the ratio. Wall time is mostly the remote side (sshd forks a session and a shell per command,
on the same 2 cores) and is printed for reference only. Target: exec_on <= 0.5x fabric's CPU per command.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import results  # noqa: E402  (bench/, the script's own dir)
from verdict import shown  # noqa: E402

from preflight.transport import _ssh_libraries, exec_on  # noqa: E402

ADDRESS, PORT = "127.0.250.1", 2222
TARGET = 0.5


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def start_sshd(tmp: Path) -> subprocess.Popen:
    for name in ("host", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / name)], check=True)
    (tmp / "sshd_config").write_text(
        f"ListenAddress {ADDRESS}:{PORT}\nHostKey {tmp}/host\nAuthorizedKeysFile {tmp}/id.pub\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\nUsePAM no\nStrictModes no\n"
        "MaxStartups 1000\nMaxSessions 1000\n")
    (tmp / "known_hosts").write_text(f"[{ADDRESS}]:{PORT} " + " ".join((tmp / "host.pub").read_text().split()[:2]))
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation dir
    sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(tmp / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "sshd.log", "w"))
    time.sleep(0.5)
    if sshd.poll() is not None:
        raise SystemExit(f"sshd exited {sshd.returncode}: {(tmp / 'sshd.log').read_text()[-500:]}")
    return sshd


def connect(tmp: Path, count: int) -> list:
    fabric, paramiko, _ = _ssh_libraries()
    connections = []
    for _ in range(count):
        conn = fabric.Connection(host=ADDRESS, user="root", port=PORT, connect_timeout=30,
                                 connect_kwargs={"key_filename": [str(tmp / "id")], "look_for_keys": False,
                                                 "allow_agent": False})
        conn.client.load_host_keys(str(tmp / "known_hosts"))
        conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        conn.open()
        connections.append(conn)
    return connections


def measure(connections: list, commands: int, command: str, how: str) -> tuple[float, float]:
    def one(conn) -> None:
        for _ in range(commands):
            if how == "fabric":
                result = conn.run(command, hide=True, warn=True, timeout=120, in_stream=False)
                rc, out = result.exited, result.stdout
            else:
                rc, out, _, _, _ = exec_on(conn.client.get_transport(), command, 120)
            if rc != 0 or out != "done\n":
                raise SystemExit(f"{how}: `{command}` gave rc {rc}, stdout {out[-200:]!r}")

    started_cpu, started = cpu(), time.monotonic()
    with ThreadPoolExecutor(len(connections)) as pool:
        list(pool.map(one, connections))
    return cpu() - started_cpu, time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--commands", type=int, default=5)
    parser.add_argument("--sleep", type=float, default=1.0)
    results.add_argument(parser, __file__)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/ssh_exec.py starts sshd: run it as root")
    command = f"sh -c 'sleep {args.sleep:g}; echo done'"
    with tempfile.TemporaryDirectory(prefix="ssh-exec-bench-") as tmp:
        sshd = start_sshd(Path(tmp))
        try:
            connections = connect(Path(tmp), args.nodes)
            rows = {how: measure(connections, args.commands, command, how) for how in ("fabric", "exec_on")}
            for conn in connections:
                conn.close()
        finally:
            sshd.terminate()
            sshd.wait(10)
    total = args.nodes * args.commands
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"controller CPU per SSH command, {args.nodes} connections x {args.commands} commands `{command}`, "
          f"{os.cpu_count()} CPUs, load average {load}")
    print("| runner | CPU s | CPU ms per command | wall s (reference) |")
    print("|---|---:|---:|---:|")
    for how, (spent, wall) in rows.items():
        print(f"| {how} | {spent:.2f} | {spent / total * 1000:.1f} | {wall:.1f} |")
    ratio = rows["exec_on"][0] / rows["fabric"][0]
    print(f"exec_on / fabric CPU: {shown(ratio, TARGET)} (target <= {TARGET}: {'met' if ratio <= TARGET else 'NOT met'})")
    per_command = {how: round(spent / total * 1000, 1) for how, (spent, _) in rows.items()}
    results.record(args.results, script=__file__, host=f"load average {load}", target=f"exec_on <= {TARGET}x fabric",
                   verdict="met" if ratio <= TARGET else "not met",
                   numbers={f"{args.nodes}_connections": {"fabric_cpu_ms_per_command": per_command["fabric"],
                                                          "exec_on_cpu_ms_per_command": per_command["exec_on"],
                                                          "ratio": round(ratio, 3)}},
                   summary=f"exec_on / fabric CPU {shown(ratio, TARGET)}x at {args.nodes} connections "
                           f"({per_command['exec_on']} / {per_command['fabric']} ms per command)")


if __name__ == "__main__":
    main()
