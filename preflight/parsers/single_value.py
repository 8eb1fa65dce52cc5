"""Parsers for the outputs that are one word or one number: the PM QoS target, the host's clock, an ECN
switch, a unit's state and a package's version.

Usage::

    from preflight.parsers import single_value
    single_value.parse_pm_qos(text).latency_us          # od -An -tu4 -N4 /dev/cpu_dma_latency -> 0
    single_value.parse_epoch(text).seconds              # date +%s -> 1764547200
    single_value.parse_ecn_switch(text).enabled         # cat /sys/class/net/IF/ecn/roce_np/enable/PRIO -> True
    single_value.parse_is_active(text).states           # systemctl is-active UNIT... -> ("active",)
    single_value.parse_dpkg_version(text).version       # dpkg-query -W -f '${Version}' PKG -> '2.21.5-1+cuda12.4'

Schemas (kinds ``pm-qos``, ``date-epoch``, ``ecn-switch``, ``systemctl-is-active``, ``dpkg-version``)::

    {"latency_us": 0}
    {"seconds": 1764547200}
    {"enabled": true}
    {"states": ["active"]}
    {"version": "2.21.5-1+cuda12.4", "package": null, "epoch": null, "upstream": "2.21.5",
     "revision": "1+cuda12.4"}

Formats:

- ``pm-qos``: od(1) with ``-An -tu4 -N4`` prints the one 32-bit unsigned number the kernel returns when
  ``/dev/cpu_dma_latency`` is read (the effective CPU latency target in microseconds; 2000000000, the
  kernel's PM_QOS_CPU_LATENCY_DEFAULT_VALUE, when nothing holds it: docs.kernel.org/power/pm_qos_interface.html),
  right-aligned in 11 columns. ASCII digits only, at most 4294967295.
- ``date-epoch``: GNU date(1) ``+%s``, seconds since the epoch, ASCII digits (a ``date`` that does not know
  ``%s`` prints it literally; a locale never changes the digits).
- ``ecn-switch``: the mlx5 driver's ``/sys/class/net/<if>/ecn/roce_np|roce_rp/enable/<prio>`` files print
  ``0`` or ``1`` (drivers/net/ethernet/mellanox/mlx5/core/en_sysfs.c, ``"%d\\n"``); nothing else is a switch.
- ``systemctl-is-active``: systemctl(1) ``is-active`` prints one state per unit, one a line, in the order
  given: ``active``, ``reloading``, ``refreshing``, ``inactive``, ``failed``, ``activating``,
  ``deactivating``, ``maintenance`` (systemd src/basic/unit-def.c, ``unit_active_state_table``) or
  ``unknown`` (older systemd, for a unit it cannot load). Its exit status is not part of the text (3 for
  "not active" is normal); messages such as ``Failed to connect to bus`` go to stderr and, pasted into
  the text, are a ParseError.
- ``dpkg-version``: ``dpkg-query -W -f '${Version}' PKG`` prints the installed version with no newline;
  ``dpkg-query -W PKG`` prints ``PKG<TAB>VERSION``, read too (the package is then named). A version is
  ``[epoch:]upstream[-revision]`` (Debian Policy 5.6.12): the epoch digits, the upstream part starting
  with a digit, ``[A-Za-z0-9.+~-]`` (a hyphen only when there is a revision, which is after the last
  one), the revision ``[A-Za-z0-9.+~]``.

Real examples (a DGX H100 on Ubuntu 22.04 with the cpu-dma-latency unit of roles/tuning)::

    $ od -An -tu4 -N4 /dev/cpu_dma_latency
              0
    $ date +%s
    1764547200
    $ cat /sys/class/net/ens1f0np0/ecn/roce_np/enable/3
    1
    $ systemctl is-active nvidia-fabricmanager
    active
    $ dpkg-query -W -f '${Version}' libnccl2
    2.21.5-1+cuda12.4

Strict, as every parser here: no line, more lines than the tool prints, or a line that is not the one
word or number expected is a ParseError naming the line; prompt lines of a paste are skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parsers.common import Line, ParseError, first_nonblank, is_prompt, lines

U32_MAX = 2**32 - 1
_DIGITS = re.compile(r"^[0-9]+$")  # str.isdigit() also takes '²' and other scripts' digits: not od's or date's
UNIT_STATES = ("active", "reloading", "refreshing", "inactive", "failed", "activating", "deactivating",
               "maintenance", "unknown")
_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(?::[a-z0-9-]+)?$")  # Policy 5.6.7, with dpkg's :arch suffix
_VERSION = re.compile(
    r"^(?:(?P<epoch>[0-9]+):)?(?P<upstream>[0-9][A-Za-z0-9.+~-]*?)(?:-(?P<revision>[A-Za-z0-9.+~]+))?$")


def _content(text: str, what: str, example: str) -> list[Line]:
    """The non-blank lines that are not a paste's prompt; ParseError naming the first line if none."""
    all_lines = lines(text)
    content = [line for line in all_lines if line.text.strip() and not is_prompt(line.text.strip())]
    if not content:
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, f"no {what} (a line such as {example!r})")
    return content


def _one_word(text: str, what: str, example: str) -> tuple[Line, list[str]]:
    """The one content line and its words; a second content line is a ParseError naming it."""
    content = _content(text, what, example)
    if len(content) > 1:
        raise ParseError(content[1].no, content[1].text, f"a {what} is one line")
    return content[0], content[0].text.split()


def _number(text: str, what: str, example: str, maximum: int) -> int:
    line, words = _one_word(text, what, example)
    if len(words) != 1 or not _DIGITS.match(words[0]):
        raise ParseError(line.no, line.text, f"not a {what} (ASCII digits only)")
    value = int(words[0])
    if value > maximum:
        raise ParseError(line.no, line.text, f"{what} {value} is out of range (at most {maximum})")
    return value


@dataclass(frozen=True)
class PmQos:
    latency_us: int

    def to_json(self) -> dict:
        return {"latency_us": self.latency_us}


@dataclass(frozen=True)
class Epoch:
    seconds: int

    def to_json(self) -> dict:
        return {"seconds": self.seconds}


@dataclass(frozen=True)
class EcnSwitch:
    enabled: bool

    def to_json(self) -> dict:
        return {"enabled": self.enabled}


@dataclass(frozen=True)
class UnitStates:
    states: tuple[str, ...]

    def to_json(self) -> dict:
        return {"states": list(self.states)}


@dataclass(frozen=True)
class PackageVersion:
    version: str
    package: str | None
    epoch: int | None
    upstream: str
    revision: str | None

    def to_json(self) -> dict:
        return {"version": self.version, "package": self.package, "epoch": self.epoch,
                "upstream": self.upstream, "revision": self.revision}


def parse_pm_qos(text: str) -> PmQos:
    return PmQos(_number(text, "PM QoS latency target", "         0", U32_MAX))


def parse_epoch(text: str) -> Epoch:
    # 2**63 - 1: the largest time_t; a bigger number is no clock reading.
    return Epoch(_number(text, "date +%s reading", "1764547200", 2**63 - 1))


def parse_ecn_switch(text: str) -> EcnSwitch:
    line, words = _one_word(text, "ECN enable switch", "1")
    if words not in (["0"], ["1"]):
        raise ParseError(line.no, line.text, "an ECN enable switch is 0 or 1")
    return EcnSwitch(words == ["1"])


def parse_is_active(text: str) -> UnitStates:
    states = []
    for line in _content(text, "systemctl is-active state", "active"):
        word = line.text.strip()
        if word not in UNIT_STATES:
            raise ParseError(line.no, line.text, f"not a unit state ({', '.join(UNIT_STATES)})")
        states.append(word)
    return UnitStates(tuple(states))


def parse_dpkg_version(text: str) -> PackageVersion:
    line, words = _one_word(text, "dpkg-query version", "2.21.5-1+cuda12.4")
    package = None
    fields = line.text.strip().split("\t")
    if len(fields) == 2 and _PACKAGE.match(fields[0]):  # dpkg-query -W's default ${binary:Package}\t${Version}
        package, words = fields[0], fields[1].split()
    if len(words) != 1:
        raise ParseError(line.no, line.text, "not a package version (dpkg-query -W -f '${Version}' PKG)")
    match = _VERSION.match(words[0])
    if not match:
        raise ParseError(line.no, line.text, "not a Debian version ([epoch:]upstream[-revision], upstream from a digit)")
    if match.group("revision") is None and "-" in match.group("upstream"):
        raise ParseError(line.no, line.text, "a hyphen in a Debian version is followed by the revision")
    epoch = match.group("epoch")
    return PackageVersion(words[0], package, None if epoch is None else int(epoch), match.group("upstream"),
                          match.group("revision"))
