"""Version reporters: ``ofed_info -s`` (MLNX_OFED) and ``nv-fabricmanager --version``.

``ofed_info -s`` prints the OFED release followed by a colon (``MLNX_OFED_LINUX-23.10-1.1.9.0:``);
``nv-fabricmanager --version`` prints ``Fabric Manager version is : 550.90.07``.
"""

from __future__ import annotations

from sim.hosts.hardware import Hardware
from sim.hosts.stubs.main import StubUsageError


def ofed_info(hw: Hardware, args: list[str]) -> int:
    if args != ["-s"]:
        raise StubUsageError("only ofed_info -s is simulated")
    print(f"{hw.versions['ofed']}:")
    return 0


def nv_fabricmanager(hw: Hardware, args: list[str]) -> int:
    if not set(args) & {"-v", "--version"}:
        raise StubUsageError("only nv-fabricmanager --version is simulated (the daemon does not run here)")
    print(f"Fabric Manager version is : {hw.versions['fabric_manager']}")
    return 0
