"""A ``systemctl`` for drills run on this machine's loopback: the few verbs a drill's fault steps use, over
processes the test declared as units, so the drill runs its real steps (``kill`` a MainPID, ``systemctl start``)
through the local transport without a systemd.

Declared units live in ``$CLUSTERCTL_TEST_UNITS`` (a folder): ``<unit>.json`` holds the unit's argv, and
``<unit>.pid`` the MainPID of its last start. Verbs, as systemd 249 answers them:

- ``show --property MainPID --value UNIT``: the PID, or 0 when the process is gone (a zombie is gone);
- ``start UNIT``: starts it unless it runs (a no-op then, as systemd's);
- ``stop UNIT``: SIGTERM then SIGCONT (systemd sends both, so a frozen process sees the TERM), SIGKILL after
  10 s (TimeoutStopSec);
- ``restart UNIT``: stop, then start;
- ``--no-block`` with start, stop or restart: the job runs on its own and the command returns at once (systemctl(1):
  "Do not synchronously wait for the requested operation to finish");
- ``is-active UNIT``: ``active`` (exit 0) or ``inactive`` (exit 3);
- ``reset-failed UNIT``: nothing to reset here (no start limit), exit 0;
- ``freeze UNIT`` / ``thaw UNIT``: SIGSTOP / SIGCONT to the MainPID. systemctl(1): freeze suspends "all
  processes contained within the cgroup corresponding to the unit" (the cgroup freezer) until thaw; a declared
  unit here is one process. The unit stays ``active`` (its FreezerState changes, not its ActiveState). A unit
  that is not running cannot be frozen: exit 1 with a line on stderr.

Unlike systemd it restarts nothing by itself (no ``Restart=on-failure``): a drill's undo starts the unit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ENV = "CLUSTERCTL_TEST_UNITS"
STOP_TIMEOUT_S = 10.0


def sim_vllm_argv(address: str) -> list[str]:
    """The process of a simulated vLLM IU on ``address`` (HOST:PORT), serving from its first second: what a
    test declares as an IU's unit."""
    return [sys.executable, "-m", "sim.vllm", "--iu", f"{address}:0", "--warmup-s", "0"]


def answers_health(address: str) -> bool:
    """The IU on ``address`` (HOST:PORT) answers ``GET /health`` with 200."""
    try:
        with urllib.request.urlopen(f"http://{address}/health", timeout=1) as answer:
            return answer.status == 200
    except OSError:
        return False


def install(bin_dir: Path, units_dir: Path) -> None:
    """A ``systemctl`` in ``bin_dir`` running this module; put ``bin_dir`` first on PATH."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    units_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "systemctl"
    script.write_text(f"#!/bin/sh\n{ENV}={units_dir} exec {sys.executable} {Path(__file__).resolve()} \"$@\"\n")
    script.chmod(0o755)


def declare(units_dir: Path, unit: str, argv: list[str], log: Path) -> None:
    (units_dir / f"{unit}.json").write_text(json.dumps({"argv": argv, "log": str(log)}))


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def main_pid(units_dir: Path, unit: str) -> int:
    path = units_dir / f"{unit}.pid"
    pid = int(path.read_text()) if path.is_file() else 0
    return pid if pid and alive(pid) else 0


def start(units_dir: Path, unit: str) -> int:
    if main_pid(units_dir, unit):
        return 0
    spec = json.loads((units_dir / f"{unit}.json").read_text())
    with open(spec["log"], "ab") as log:
        proc = subprocess.Popen(spec["argv"], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
    (units_dir / f"{unit}.pid").write_text(str(proc.pid))
    return 0


def stop(units_dir: Path, unit: str) -> int:
    pid = main_pid(units_dir, unit)
    if not pid:
        return 0
    os.kill(pid, signal.SIGTERM)
    os.kill(pid, signal.SIGCONT)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        os.kill(pid, signal.SIGKILL)
    return 0


def main(argv: list[str]) -> int:
    units_dir = Path(os.environ[ENV])
    args = [a for a in argv if not a.startswith("--")]
    if argv[:1] == ["show"] and "MainPID" in argv:
        print(main_pid(units_dir, argv[-1]))
        return 0
    verb, unit = args[0], args[-1]
    if not (units_dir / f"{unit}.json").is_file():
        print(f"Failed to {verb} {unit}: Unit {unit} not found.", file=sys.stderr)
        return 5
    if "--no-block" in argv and verb in ("start", "stop", "restart"):
        subprocess.Popen([sys.executable, __file__, verb, unit], env={**os.environ, ENV: str(units_dir)},
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
        return 0
    if verb == "start":
        return start(units_dir, unit)
    if verb == "stop":
        return stop(units_dir, unit)
    if verb == "restart":
        stop(units_dir, unit)
        return start(units_dir, unit)
    if verb == "reset-failed":
        return 0
    if verb in ("freeze", "thaw"):
        pid = main_pid(units_dir, unit)
        if not pid:
            print(f"Failed to {verb} unit {unit}: unit is not active", file=sys.stderr)
            return 1
        os.kill(pid, signal.SIGSTOP if verb == "freeze" else signal.SIGCONT)
        return 0
    if verb == "is-active":
        running = bool(main_pid(units_dir, unit))
        print("active" if running else "inactive")
        return 0 if running else 3
    print(f"systemctl stand-in: {verb} is not a verb drills use", file=sys.stderr)
    return 1


def stop_all(units_dir: Path) -> None:
    for spec in units_dir.glob("*.json"):
        stop(units_dir, spec.stem)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
