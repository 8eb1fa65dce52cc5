"""Entry point of the multi-call stub program: dispatch on the name it was called by."""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from pathlib import Path

from sim.hosts import machine_paths, nvidia_module
from sim.hosts.hardware import Hardware
from sim.hosts.stubs import TOOLS, UNDELAYED_TOOLS

SIM_RUN_DIR = Path(os.environ.get("CLUSTERCTL_SIM_RUN_DIR", machine_paths.SIM_RUN_DIR))


class StubUsageError(Exception):
    """Arguments the stub does not simulate; printed like the real tool's usage error (exit 1)."""


def real_program(candidates: tuple[str, ...]) -> str | None:
    """The machine's own program behind a stub: the first of ``candidates`` that exists, None when it has none."""
    return next((path for path in candidates if os.path.exists(path)), None)


def hand_to_real(candidates: tuple[str, ...], args: list[str]) -> None:
    """Replace this process with the machine's own program (the first of ``candidates`` that exists) for a call
    the stub does not simulate; StubUsageError when the machine has none."""
    real = real_program(candidates)
    if real is None:
        raise StubUsageError(f"{os.path.basename(candidates[0])}: no real program to hand this call to")
    os.execv(real, [real, *args])


def load_hardware(run_dir: Path | None = None) -> Hardware:
    run_dir = run_dir or SIM_RUN_DIR
    return Hardware.from_json(json.loads((run_dir / "host.json").read_text())["hardware"])


def log_call(tool: str, args: list[str], run_dir: Path | None = None) -> None:
    entry = {"tool": tool, "argv": [tool, *args], "time": time.time(), "pid": os.getpid()}
    with open((run_dir or SIM_RUN_DIR) / "calls.log", "a") as log:
        log.write(json.dumps(entry) + "\n")


def run_tool(tool: str, args: list[str], hw: Hardware) -> int:
    module_name, function = TOOLS[tool].split(":")
    module = importlib.import_module(f"sim.hosts.stubs.{module_name}")
    return getattr(module, function)(hw, args) or 0


def main() -> None:
    # A shell front (systemctl's) names the tool it hands over; otherwise the name this program was called by.
    tool = os.environ.pop("CLUSTERCTL_SIM_TOOL", None) or os.path.basename(sys.argv[0])
    args = sys.argv[1:]
    if tool not in TOOLS:
        sys.exit(f"{tool}: not a simulated tool (one of {', '.join(TOOLS)})")
    try:
        hw = load_hardware()
    except OSError as exc:
        sys.exit(f"{tool}: no simulated hardware description ({exc}); is this a simulated host?")
    log_call(tool, args)
    if tool == "nvidia-smi":
        # It answers only through the loaded kernel module, and reports that module's version.
        loaded = nvidia_module.loaded_version()
        refused = nvidia_module.nvidia_smi_gate(os.environ.get(nvidia_module.NVML_ENV), loaded)
        if refused:
            print(refused[1])
            sys.exit(refused[0])
        hw.versions["driver"] = str(loaded)
    if tool not in UNDELAYED_TOOLS and hw.hang is not None and (not hw.hang or tool in hw.hang):
        while True:  # the `hang` fault: never return, like a tool stuck on a wedged GPU or fabric
            time.sleep(3600)
    if tool not in UNDELAYED_TOOLS and hw.command_delay_s > 0:
        time.sleep(hw.command_delay_s)
    try:
        code = run_tool(tool, args, hw)
    except StubUsageError as exc:
        print(f"{tool}: {exc}", file=sys.stderr)
        code = 1
    except BrokenPipeError:
        code = 141
    sys.stdout.flush()
    sys.exit(code)
