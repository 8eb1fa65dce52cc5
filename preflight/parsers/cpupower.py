"""Parser for ``cpupower idle-info`` (linux tools/power/cpupower).

Usage::

    from preflight.parsers import cpupower
    info = cpupower.parse(text)
    info.driver                                   # 'intel_idle', 'acpi_idle', None ("Could not determine")
    [s.name for s in info.states if not s.disabled and s.latency_us > 2]   # deep states still enabled

Schema (``CpuIdleInfo.to_json()``, the contract's ``cpupower`` shape)::

    {"driver": "intel_idle", "states": [{"name": "C6", "disabled": true, "latency_us": 133}]}

cpupower prints, per analysed CPU (CPU 0 unless ``-c``), one block per idle state: its name, with
`` (DISABLED) `` appended when ``/sys/.../cpuidleN/stateM/disable`` is 1 (kernels >= 3.9), then
``Flags/Description``, ``Latency`` (exit latency, us), ``Usage`` and ``Duration`` (us). ``states`` are the
first analysed CPU's; ``cpus`` keeps every CPU's list for checks that want them all. Intel servers use
``intel_idle`` (POLL C1 C1E C6); AMD EPYC and VMs use ``acpi_idle`` (POLL C1 C2 [C3]) with ``ACPI
FFH MWAIT``/``ACPI IOPORT`` descriptions. A kernel booted with ``cpuidle.off=1`` prints "Could not
determine cpuidle driver" and no states: driver None, states [].

Real example (Xeon Platinum 8480+, kernel 5.15, C6 disabled through sysfs)::

    CPUidle driver: intel_idle
    CPUidle governor: menu
    analyzing CPU 0:

    Number of idle states: 4
    Available idle states: POLL C1 C1E C6
    POLL:
    Flags/Description: CPUIDLE CORE POLL IDLE
    Latency: 0
    Usage: 28392
    Duration: 2381633
    C1:
    Flags/Description: MWAIT 0x00
    Latency: 2
    ...
    C6 (DISABLED) :
    Flags/Description: MWAIT 0x20
    Latency: 290
    Usage: 0
    Duration: 0

A state block cut before its ``Duration`` line, or fewer blocks than ``Number of idle states``, raises
ParseError naming the last line read; so does ``idle-info --silent``, which names the states without
their blocks (nothing says whether one is disabled). Newer cpupower prints a ``Residency`` line in
each block, which is not read.

A paste without the header lines (it starts at ``analyzing CPU 0:``, or at ``Number of idle states:``) is
read when its states are complete (as many blocks as ``Number of idle states`` says): the driver is null
and a ``warnings`` entry says the header is missing; without the ``analyzing CPU N:`` line the states are
CPU 0's (cpupower's default), which a second warning says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.parsers.common import (
    Line,
    ParseError,
    first_nonblank,
    last_complete,
    last_nonblank,
    lines,
    split_runs,
)

_START = re.compile(r"^\s*(CPUidle driver:|Could not determine cpuidle driver)")
_CPU = re.compile(r"^\s*analyzing CPU (\d+):\s*$", re.IGNORECASE)
_COUNT = re.compile(r"^\s*Number of idle states:\s*(\d+)\s*$")
_STATE = re.compile(r"^\s*(\S.*?)( \(DISABLED\) )?:\s*$")
_FIELD = re.compile(r"^\s*(Flags/Description|Latency|Usage|Duration):\s*(.*?)\s*$")
_NO_STATES = re.compile(r"^\s*CPU \d+: (No idle states|Can't read idle state info)")


@dataclass(frozen=True)
class IdleState:
    name: str
    disabled: bool
    latency_us: int
    description: str | None = None
    usage: int | None = None
    duration_us: int | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "disabled": self.disabled, "latency_us": self.latency_us}


@dataclass(frozen=True)
class CpuIdleInfo:
    driver: str | None
    governor: str | None
    states: list[IdleState]
    cpus: dict[int, list[IdleState]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # header lines missing from a paste (see the module docstring)

    def to_json(self) -> dict:
        return {"driver": self.driver, "states": [state.to_json() for state in self.states]}


def parse(text: str) -> CpuIdleInfo:
    all_lines = lines(text)
    if not any(_START.match(line.text) or _CPU.match(line.text) or _COUNT.match(line.text) for line in all_lines):
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, "no cpupower idle-info output (a 'CPUidle driver:' line)")
    return last_complete(split_runs(all_lines, lambda t: bool(_START.match(t))), _parse_run)


def _parse_run(run: list[Line]) -> CpuIdleInfo:
    driver = governor = None
    cpus: dict[int, list[IdleState]] = {}
    expected: dict[int, int] = {}
    without_states: set[int] = set()
    cpu: int | None = None
    state: dict | None = None
    last_read = first_nonblank(run)
    warnings: list[str] = []
    started = any(_START.match(line.text) for line in run)
    if not any(_CPU.match(line.text) for line in run):
        count = next((line for line in run if _COUNT.match(line.text)), None)
        if count is not None:
            cpu, cpus[0] = 0, []
            warnings.append(f"line {count.no}: no 'analyzing CPU N:' line before it: read as CPU 0's idle states")
    for line in run:
        text = line.text.strip()
        if not text:
            continue
        if text.startswith("CPUidle driver:"):
            driver = text.split(":", 1)[1].strip() or None
        elif text.startswith("CPUidle governor:"):
            governor = text.split(":", 1)[1].strip() or None
        elif match := _CPU.match(text):
            cpu = int(match.group(1))
            cpus[cpu] = []
        elif match := _COUNT.match(text):
            expected[_current(cpu, line)] = int(match.group(1))
        elif _NO_STATES.match(text):
            without_states.add(_current(cpu, line))
        elif text.startswith("Available idle states:"):
            pass
        elif match := _FIELD.match(text):
            if state is None:
                raise ParseError(line.no, line.text, "idle state field before any state name")
            state[match.group(1)] = (match.group(2), line)
            if match.group(1) == "Duration":
                cpus[_current(cpu, line)].append(_typed_state(state))
                state = None
        elif match := _STATE.match(text):
            if state is not None:
                raise ParseError(line.no, line.text, f"idle state {state['name']} ends before its Duration")
            state = {"name": match.group(1), "disabled": bool(match.group(2))}
        else:
            continue  # a shell prompt, "Could not determine cpuidle governor", ...
        last_read = line
    if state is not None:
        raise ParseError(last_read.no, last_read.text, f"output ends inside idle state {state['name']}")
    if not cpus:
        raise ParseError(last_read.no, last_read.text, "cpupower output ends before 'analyzing CPU N:'")
    for number in cpus:
        if number not in expected and number not in without_states:
            raise ParseError(last_read.no, last_read.text, f"output ends before CPU {number}'s idle states")
    for number, count in expected.items():
        if count and all(not states for states in cpus.values()):
            raise ParseError(last_read.no, last_read.text, f"CPU {number} names its {count} idle states but shows "
                             "none of them (`cpupower idle-info --silent`?): no latency or disabled flag to read")
        if len(cpus.get(number, [])) < count:
            raise ParseError(last_read.no, last_read.text,
                             f"CPU {number} lists {len(cpus.get(number, []))} of {count} idle states")
    if driver is None and cpus and any(cpus.values()):
        if started:
            end = last_nonblank(run)
            raise ParseError(end.no, end.text, "idle states without a 'CPUidle driver:' line")
        first = first_nonblank(run)
        warnings.insert(0, f"line {first.no}: no 'CPUidle driver:'/'CPUidle governor:' header (a paste that "
                           f"starts below it): driver unknown")
    first_cpu = next(iter(cpus.values()), [])
    return CpuIdleInfo(driver, governor, first_cpu, cpus, tuple(warnings))


def _current(cpu: int | None, line: Line) -> int:
    if cpu is None:
        raise ParseError(line.no, line.text, "idle state information before 'analyzing CPU N:'")
    return cpu


def _typed_state(raw: dict) -> IdleState:
    def integer(key: str) -> int | None:
        if key not in raw:
            return None
        token, line = raw[key]
        if not token.isdigit():
            raise ParseError(line.no, line.text, f"{key} is not an integer ({token!r})")
        return int(token)

    latency = integer("Latency")
    if latency is None:
        token, line = raw["Duration"]
        raise ParseError(line.no, line.text, f"idle state {raw['name']} has no Latency line")
    description = raw["Flags/Description"][0] if "Flags/Description" in raw else None
    return IdleState(raw["name"], raw["disabled"], latency, description, integer("Usage"), integer("Duration"))
