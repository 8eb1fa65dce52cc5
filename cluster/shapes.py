"""The inventory strings that reach hosts' files, paths and command lines: their shapes and the types and
rules :mod:`cluster.spec` declares with them. Every pattern is matched with ``fullmatch``: ``$`` also matches
before a trailing newline, and 'eth0\\n' would reach the templates.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

# Linux interface names: 1..15 bytes (IFNAMSIZ-1), no '/', ':' or whitespace, not "." or "..".
IFNAME = re.compile(r"(?!\.{1,2}\Z)[A-Za-z0-9_.-]{1,15}")
# RDMA device names (ibdev): IB_DEVICE_NAME_MAX is 64.
IBDEV = re.compile(r"[A-Za-z0-9_.-]{1,63}")
# Inventory host names: DNS labels (letters, digits, '-' inside), '.'-separated, at most 253 characters (an
# IPv4 address is one too). A host name becomes IU ids, Consul node and service names and file names on the
# node and under a simulated machine's state dir, so nothing else ('..', '/', a leading dot or dash,
# whitespace) may reach a path (root deletes and writes under those paths). Simulated machines also cap it at 64 (nspawn).
HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*")
MAX_HOSTNAME = 253
# A kernel command-line argument as the cpu_cstates role writes it into GRUB_CMDLINE_LINUX, which update-grub
# sources as shell, as root: one word with no shell or grub meaning (no quote, '$', '`', ';', space, newline).
KERNEL_ARG = re.compile(r"[A-Za-z0-9_.,=:/+-]+")


class Invalid(ValueError):
    """What a coercer raises: the message, or ``parts`` ``(suffix, value, message)`` naming parts of the
    variable (``preflight_version_pins.drivr``)."""

    def __init__(self, message: str = "", parts: list[tuple[str, Any, str]] | None = None):
        super().__init__(message)
        self.parts = parts


def is_host_name(name: str) -> bool:
    return len(name) <= MAX_HOSTNAME and HOSTNAME.fullmatch(name) is not None


def ifname_rule(value: str | None) -> None:
    if value is not None and not IFNAME.fullmatch(value):
        raise Invalid("not a valid Linux interface name")


def shell_words(raw: Any) -> tuple[str, ...]:
    """ssh options as one string of shell words (Ansible's ``ansible_ssh_*_args``); null is none."""
    if raw is None or raw == "":
        return ()
    if not isinstance(raw, str):
        raise Invalid("must be a string of ssh options")
    try:
        return tuple(shlex.split(raw))
    except ValueError as exc:
        raise Invalid(f"not shell words: {exc}") from None


def consul_address(raw: Any) -> str:
    """``HOST:PORT`` of a Consul agent's HTTP API, without a scheme (the scheme is ``consul_scheme``'s)."""
    if not isinstance(raw, str) or not raw.strip():
        raise Invalid("must be a non-empty string")
    if "://" in raw:
        raise Invalid("HOST:PORT without a scheme: write the scheme as consul_scheme (consul_scheme: https), "
                      "not in the address")
    host, sep, port = raw.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise Invalid("expected HOST:PORT (the Consul agent's HTTP API, e.g. 127.0.0.1:8500)")
    return raw


def kernel_args(raw: Any) -> tuple[str, ...]:
    """A list of kernel arguments, one argument per entry (the role compares each with a word of
    /proc/cmdline, so "a=1 b=2" in one entry would never count as active)."""
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):
        raise Invalid("must be a list of kernel arguments (e.g. [iommu=pt])")
    bad = [(f"[{i}]", arg, "not a kernel argument: one word of letters, digits and _ . , = : / + - "
                            "(no spaces, quotes, '$' or newlines: update-grub sources it as shell)")
           for i, arg in enumerate(raw) if not isinstance(arg, str) or not KERNEL_ARG.fullmatch(arg)]
    if bad:
        raise Invalid(parts=bad)
    return tuple(raw)


def server_reasons(raw: Any) -> dict[str, str]:
    """``{host: reason}``: the GPU nodes an inventory runs a Consul server on, on purpose (cluster.servers)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise Invalid("must be a mapping {host: why this GPU node runs a Consul server}")
    bad = [(f".{host}", why, "the reason must be a non-empty string") for host, why in raw.items()
           if not isinstance(why, str) or not why.strip()]
    if bad:
        raise Invalid(parts=bad)
    return {str(host): why for host, why in raw.items()}
