"""``systemctl show``, ``cat`` and ``is-active`` of a simulated host, answered from its unit files.

The machines run a real systemd, and every other systemctl command goes to it. These three stay
simulated while services are never started on the virtual inventory (``clusterctl_live_actions:
false``; the next issue turns them on): an HGX node's NVIDIA daemons are "active" here although no such
unit exists, and a unit written without a ``daemon-reload`` still shows what its files say. The stub
answers from the unit files themselves (fragment + drop-ins, ``%i`` expanded, later
assignments win, an empty assignment resets a list) in systemctl's ``Key=value`` form, and hands every
other command to the real systemctl.

Formats (systemd 249, Ubuntu 22.04): CPU sets and NUMA masks print as space-separated ranges
(``CPUAffinity=0-47 96-143``), ``Environment`` as its space-joined assignments; an unset property prints
empty. Services are never started on a simulated host (``ActiveState=inactive``), except the NVIDIA
daemons an HGX node runs from boot (``is-active nvidia-fabricmanager`` -> active).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from sim.hosts.hardware import Hardware, cpulist
from sim.hosts.stubs import REAL_SYSTEMCTL
from sim.hosts.stubs.main import StubUsageError

UNIT_DIRS = (Path("/etc/systemd/system"), Path("/run/systemd/system"), Path("/lib/systemd/system"),
             Path("/usr/lib/systemd/system"))
LIST_KEYS = {"Environment", "CPUAffinity", "NUMAMask", "ExecStartPre", "ExecStartPost", "After", "Wants",
             "Requires", "EnvironmentFile"}
CPU_SET_KEYS = {"CPUAffinity", "NUMAMask"}
# Daemons a provisioned HGX node runs from boot, outside what the roles start: they are "active" on a
# simulated host; every other unit is inactive (services are never started: no live actions).
HARDWARE_DAEMONS = {"nvidia-fabricmanager.service", "nvidia-persistenced.service"}
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
        (p for n in reversed(names) for d in UNIT_DIRS if (d / f"{n}.d").is_dir() for p in (d / f"{n}.d").glob("*.conf")),
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


def main(hw: Hardware, args: list[str]) -> int:
    command = next((a for a in args if not a.startswith("-")), None)
    if command == "is-active":
        return _is_active(args[args.index("is-active") + 1:])
    if command == "show":
        return _show(args[args.index("show") + 1:] + [a for a in args[: args.index("show")] if a.startswith("-")])
    if command == "cat":
        return _cat(args[args.index("cat") + 1:])
    real = next((p for p in REAL_SYSTEMCTL if os.path.exists(p)), None)
    if real is None:
        raise StubUsageError("no real systemctl to hand this command to")
    os.execv(real, [real, *args])
    return 0  # not reached
