"""``systemctl show``, ``cat`` and ``is-active`` of a simulated host: systemd's own answer for every unit systemd
has loaded, a simulated one only for the hardware daemons of a host not provisioned yet.

The machines run a real systemd and provisioning installs and starts the units for real, so a unit systemd
knows (``LoadState=loaded``) is answered by the real systemctl, state and all: Ansible's systemd module and
preflight see what runs. What stays simulated is a machine before its first provisioning run: an HGX node's
NVIDIA daemons (Fabric Manager, persistenced) run from boot on real hardware, so while their packages are not
installed they read "active" here, and other units that systemd does not know are answered from their unit
files (fragment + drop-ins, ``%i`` expanded, later assignments win, an empty assignment resets a list) in
systemctl's ``Key=value`` form, inactive. Every other command goes to the real systemctl.

Formats (systemd 249, Ubuntu 22.04): CPU sets and NUMA masks print as space-separated ranges
(``CPUAffinity=0-47 96-143``), ``Environment`` as its space-joined assignments; an unset property prints
empty.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from sim.hosts.hardware import Hardware, cpulist
from sim.hosts.stubs import REAL_SYSTEMCTL
from sim.hosts.stubs.main import hand_to_real, real_program

UNIT_DIRS = (Path("/etc/systemd/system"), Path("/run/systemd/system"), Path("/lib/systemd/system"),
             Path("/usr/lib/systemd/system"))
LIST_KEYS = {"Environment", "CPUAffinity", "NUMAMask", "ExecStartPre", "ExecStartPost", "After", "Wants",
             "Requires", "EnvironmentFile"}
CPU_SET_KEYS = {"CPUAffinity", "NUMAMask"}
# Daemons an HGX node runs from boot: "active" on a simulated host whose packages are not installed yet.
HARDWARE_DAEMONS = {"nvidia-fabricmanager.service", "nvidia-persistenced.service"}
# The machine's drop-in for every service (sim/hosts/machines.py): the kernel has this CI machine's few CPUs and
# one NUMA node, not the simulated host's, so systemd could not apply a binding to simulated CPUs (the unit would
# exit 215/CPUAFFINITY). systemd runs the unit unbound; `show` reports the binding the unit's own files ask for,
# which is what systemd applies on the real host.
HARNESS_DROPIN = "zz-clusterctl-sim-cpus.conf"
HARNESS_DROPIN_TEXT = (
    "# clusterctl simulated machine: its CPUs and NUMA nodes are simulated (sysfs); the kernel's are the CI\n"
    "# machine's few. Units run unbound here; `systemctl show` reports the binding their own files ask for.\n"
    "[Service]\nCPUAffinity=\nNUMAPolicy=default\nNUMAMask=\n"
)
# chrony on a machine without CAP_SYS_TIME (nspawn never gives it: the CI machine's clock is not the machines' to
# set): Debian's unit would be skipped by its ConditionCapability, so it runs chronyd -x (never touch the clock).
CHRONY_DROPIN = "zz-clusterctl-sim-clock.conf"
CHRONY_DROPIN_TEXT = (
    "# clusterctl simulated machine: no CAP_SYS_TIME (the CI machine's clock is not its to set); chronyd runs\n"
    "# with -x (measure, never adjust the clock) instead of being skipped.\n"
    "[Unit]\nConditionCapability=\n\n[Service]\nExecStart=\nExecStart=!/usr/sbin/chronyd -x $DAEMON_OPTS\n"
)
BINDING_KEYS = ("CPUAffinity", "NUMAPolicy", "NUMAMask")
DEFAULT_PROPERTIES = ("Id", "Names", "Description", "LoadState", "ActiveState", "SubState", "FragmentPath",
                      "DropInPaths", "UnitFileState")


def _unit_name(name: str) -> str:
    return name if "." in name else f"{name}.service"


def _fragment(unit: str) -> tuple[Path | None, list[Path]]:
    """(fragment path, drop-in paths) of ``unit``; instances fall back to their template."""
    names = [unit]
    if "@" in unit:
        prefix, _, rest = unit.partition("@")
        names.append(f"{prefix}@.{rest.rsplit('.', 1)[-1]}")
    fragment = next((d / n for n in names for d in UNIT_DIRS if (d / n).is_file()), None)
    dropins = sorted(
        (p for n in reversed(names) for d in UNIT_DIRS if (d / f"{n}.d").is_dir() for p in (d / f"{n}.d").glob("*.conf")
         if p.name not in (HARNESS_DROPIN, CHRONY_DROPIN)),
        key=lambda p: p.name,
    )
    return fragment, dropins


def _parse_cpu_set(value: str) -> set[int]:
    cpus: set[int] = set()
    for token in re.split(r"[\s,]+", value.strip()):
        if not token:
            continue
        low, _, high = token.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def unit_properties(unit: str) -> dict[str, str] | None:
    fragment, dropins = _fragment(unit)
    if fragment is None:
        return None
    instance = unit.partition("@")[2].rsplit(".", 1)[0]
    values: dict[str, str] = {}
    lists: dict[str, list[str]] = {}
    for path in [fragment, *dropins]:
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith(("#", ";", "[")) or "=" not in line:
                continue
            key, _, value = line.partition("=")
            key, value = key.strip(), value.strip().replace("%i", instance).replace("%I", instance)
            if key in LIST_KEYS:
                lists[key] = [] if value == "" else [*lists.get(key, []), value]
            else:
                values[key] = value
    for key, items in lists.items():
        if key in CPU_SET_KEYS:
            cpus = set().union(*(_parse_cpu_set(v) for v in items)) if items else set()
            values[key] = cpulist(sorted(cpus)).replace(",", " ") if cpus else ""
        else:
            values[key] = " ".join(items)
    enabled = any(Path("/etc/systemd/system").glob(f"*.wants/{unit}"))
    values.update({
        "Id": unit, "Names": unit, "LoadState": "loaded", "ActiveState": "inactive", "SubState": "dead",
        "FragmentPath": str(fragment), "DropInPaths": " ".join(str(p) for p in dropins),
        "UnitFileState": "enabled" if enabled else "disabled",
    })
    values.setdefault("Description", unit)
    return values


def _show(args: list[str]) -> int:
    wanted: list[str] = []
    value_only = "--value" in args
    units = []
    rest = [a for a in args if a != "--value"]
    while rest:
        arg = rest.pop(0)
        if arg in ("-p", "--property"):
            wanted += rest.pop(0).split(",") if rest else []
        elif arg.startswith(("--property=", "-p")):
            wanted += arg.split("=", 1)[1].split(",") if "=" in arg else arg[2:].split(",")
        elif not arg.startswith("-"):
            units.append(_unit_name(arg))
    blocks = []
    for unit in units:
        props = unit_properties(unit) or {"Id": unit, "Names": unit, "LoadState": "not-found",
                                          "ActiveState": "inactive", "SubState": "dead", "UnitFileState": ""}
        keys = wanted or [k for k in DEFAULT_PROPERTIES if k in props] + sorted(
            k for k in props if k not in DEFAULT_PROPERTIES)
        lines = [props.get(k, "") if value_only else f"{k}={props.get(k, '')}" for k in keys]
        blocks.append("\n".join(lines))
    print("\n\n".join(blocks))
    return 0


def _cat(args: list[str]) -> int:
    code = 0
    for name in (a for a in args if not a.startswith("-")):
        unit = _unit_name(name)
        fragment, dropins = _fragment(unit)
        if fragment is None:
            print(f"No files found for {unit}.", file=sys.stderr)
            code = 1
            continue
        for n, path in enumerate([fragment, *dropins]):
            print(f"{chr(10) if n else ''}# {path}")
            print(path.read_text(), end="" if path.read_text().endswith("\n") else "\n")
    return code


def _is_active(args: list[str]) -> int:
    """systemctl is-active: one state per unit; exit 0 only when all are active (3 otherwise)."""
    states = ["active" if _unit_name(a) in HARDWARE_DAEMONS else "inactive" for a in args if not a.startswith("-")]
    if "--quiet" not in args and "-q" not in args:
        print("\n".join(states))
    return 0 if states and all(s == "active" for s in states) else 3


def _loaded_by_systemd(real: str, units: list[str]) -> bool:
    """Whether systemd itself has every one of ``units`` (then its answer is the truth)."""
    if not units:
        return True
    done = subprocess.run([real, "show", "-p", "LoadState", "--value", *units], capture_output=True, text=True)
    states = done.stdout.split()
    return done.returncode == 0 and len(states) == len(units) and all(s == "loaded" for s in states)


def _real_show(real: str, args: list[str], units: list[str]) -> int:
    """systemd's own ``show``, with the NUMA binding keys as the unit's files (not the harness drop-in) set them."""
    done = subprocess.run([real, *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        return done.returncode
    value_only = "--value" in args
    wanted = []
    for i, arg in enumerate(args):
        if arg in ("-p", "--property") and i + 1 < len(args):
            wanted += args[i + 1].split(",")
        elif arg.startswith("--property="):
            wanted += arg.split("=", 1)[1].split(",")
        elif arg.startswith("-p") and len(arg) > 2:
            wanted += arg[2:].split(",")
    blocks = done.stdout.rstrip("\n").split("\n\n") if done.stdout.strip() else []
    out = []
    for unit, block in zip(units, blocks, strict=False):
        own = unit_properties(unit) or {}
        lines = block.split("\n")
        for n, line in enumerate(lines):
            key = wanted[n] if value_only and n < len(wanted) else line.split("=", 1)[0]
            if key in BINDING_KEYS:
                value = own.get(key, "default" if key == "NUMAPolicy" else "")
                lines[n] = value if value_only else f"{key}={value}"
        out.append("\n".join(lines))
    print("\n\n".join(out))
    return 0


def main(hw: Hardware, args: list[str]) -> int:
    command = next((a for a in args if not a.startswith("-")), None)
    real = real_program(REAL_SYSTEMCTL)
    if command in ("is-active", "show", "cat") and real is not None:
        units = [_unit_name(a) for a in args[args.index(command) + 1:] if not a.startswith("-")]
        if command == "show":  # -p VALUE is an option's argument, not a unit
            rest = args[args.index(command) + 1:]
            units = [_unit_name(a) for i, a in enumerate(rest)
                     if not a.startswith("-") and (i == 0 or rest[i - 1] not in ("-p", "--property"))]
        if _loaded_by_systemd(real, units):
            if command != "show":
                hand_to_real(REAL_SYSTEMCTL, args)
            return _real_show(real, args, units)
    if command == "is-active":
        return _is_active(args[args.index("is-active") + 1:])
    if command == "show":
        return _show(args[args.index("show") + 1:] + [a for a in args[: args.index("show")] if a.startswith("-")])
    if command == "cat":
        return _cat(args[args.index("cat") + 1:])
    hand_to_real(REAL_SYSTEMCTL, args)
    return 0  # not reached: hand_to_real replaces this process or raises StubUsageError
