"""Parser for ``/proc/cmdline``: the kernel command line this boot actually runs with.

Usage::

    from preflight.parsers import cmdline
    args = cmdline.parse(text)
    args.flags, args.params["intel_idle.max_cstate"]      # (['ro', 'quiet'], '0')

Schema (``KernelCmdline.to_json()``, kind ``cmdline``)::

    {"args": ["BOOT_IMAGE=/vmlinuz-5.15.0-113-generic", "root=UUID=...", "ro", "intel_idle.max_cstate=0"],
     "params": {"BOOT_IMAGE": "/vmlinuz-5.15.0-113-generic", "root": "UUID=...", "intel_idle.max_cstate": "0"},
     "flags": ["ro"]}

The rules are the kernel's own (Documentation/admin-guide/kernel-parameters.rst, lib/cmdline.c
``next_arg()``): words separated by spaces, ``name=value`` or a bare ``name``, double quotes group a
value with spaces (``param="a b"``, the quotes removed), and ``-`` and ``_`` are the same in a parameter
name (``intel_idle.max-cstate`` is ``intel_idle.max_cstate``: names are given with ``_``). A parameter
given twice keeps its last value, as the kernel applies the last one. Everything after a bare ``--``
goes to init, not the kernel, and is left out of ``params`` and ``flags`` (kept in ``args``).

Real example (Ubuntu 22.04 GPU node, C-states held off and IOMMU in passthrough)::

    BOOT_IMAGE=/vmlinuz-5.15.0-113-generic root=UUID=3e5b0f6a-2a4e-4f1b-9a7e-1c8d7b6c5a4f ro quiet splash intel_idle.max_cstate=0 processor.max_cstate=1 iommu=pt

Strict: the file is one line; a line with no ``name=value`` at all (every boot loader passes at least
``root=``/``BOOT_IMAGE=``/``initrd=``), an unterminated quote, and control characters are ParseErrors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parsers.common import ParseError, only_line

_WORD = re.compile(r'(?:[^\s"]+|"[^"]*")+')
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


@dataclass(frozen=True)
class KernelCmdline:
    args: list[str]  # raw: the words as printed (quotes kept)
    params: dict[str, str]  # typed: name (with _) -> value, quotes removed, last wins
    flags: list[str]  # bare words (ro, quiet, nosmt)

    def value(self, name: str) -> str | None:
        return self.params.get(name.replace("-", "_"))

    def to_json(self) -> dict:
        return {"args": list(self.args), "params": dict(self.params), "flags": list(self.flags)}


def parse(text: str) -> KernelCmdline:
    line = only_line(text, "kernel command line", "BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro")
    if _CONTROL.search(line.text):
        raise ParseError(line.no, line.text, "control characters in a kernel command line")
    if line.text.count('"') % 2:
        raise ParseError(line.no, line.text, "unterminated double quote")
    args = _WORD.findall(line.text)
    params: dict[str, str] = {}
    flags: list[str] = []
    for word in args:
        if word == "--":
            break  # the rest is init's
        name, equals, value = word.partition("=")
        name = name.replace('"', "").replace("-", "_")
        if equals:
            params[name] = value.replace('"', "")
        else:
            flags.append(name)
    if not params:
        raise ParseError(line.no, line.text, "no name=value parameter (not a kernel command line)")
    return KernelCmdline(args, params, flags)
