"""``sysctl --system`` of a simulated host: reads and reports every setting as procps' sysctl does, applies none.

A machine shares the CI machine's kernel (nspawn mounts /proc/sys read-only, so the real sysctl fails with
"permission denied" on every key), and writing vm.* or kernel.* there would change the CI machine itself. The
stand-in goes through the same files in the same order as procps-ng 4 (``/etc/sysctl.d``, ``/run/sysctl.d``,
``/usr/local/lib/sysctl.d``, ``/usr/lib/sysctl.d``, ``/lib/sysctl.d``: one file per name, the first directory
wins; then ``/etc/sysctl.conf``), prints its ``* Applying <file> ...`` and ``key = value`` lines, and fails
(exit 1, ``sysctl: <file>:<line>: ...``) on a line that is not ``key = value``, as sysctl does. Every other
sysctl call (reads) goes to the real program.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sim.hosts.hardware import Hardware
from sim.hosts.stubs.main import hand_to_real

DIRS = ("/etc/sysctl.d", "/run/sysctl.d", "/usr/local/lib/sysctl.d", "/usr/lib/sysctl.d", "/lib/sysctl.d")
REAL = ("/usr/sbin/sysctl", "/sbin/sysctl")


def system_files() -> list[Path]:
    chosen: dict[str, Path] = {}
    for directory in DIRS:
        for path in sorted(Path(directory).glob("*.conf")) if Path(directory).is_dir() else []:
            chosen.setdefault(path.name, path)
    files = [chosen[name] for name in sorted(chosen)]
    return files + ([Path("/etc/sysctl.conf")] if Path("/etc/sysctl.conf").is_file() else [])


def sysctl(hw: Hardware, args: list[str]) -> int:
    if "--system" not in args:
        hand_to_real(REAL, args)
    for path in system_files():
        print(f"* Applying {path} ...")
        for number, raw in enumerate(path.read_text().splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            key, sep, value = line.lstrip("-").partition("=")
            if not sep or not key.strip():
                print(f"sysctl: {path}:{number}: Line must be of the form name=value", file=sys.stderr)
                return 1
            print(f"{key.strip()} = {value.strip()}")
    return 0
