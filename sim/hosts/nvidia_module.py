"""The NVIDIA kernel module of a simulated machine: which version the running kernel has loaded.

A real node loads ``nvidia.ko`` at boot from what DKMS built for the running kernel
(``/lib/modules/$(uname -r)/updates/dkms/nvidia.ko``) and keeps that version until the next boot, whatever apt
installs meanwhile. The machine reproduces that:

- the image's preinstalled driver (the hardware description's ``versions.driver``; empty = none, a node with no
  driver) is seeded as that module file before the first boot;
- the stand-in ``nvidia-dkms-<branch>-open`` package (sim/aptrepo/catalog.py) replaces the file only when the
  running kernel's headers are installed, as dkms does;
- a boot unit (``LOAD_UNIT``, before sysinit.target) "loads" the file's version: it exposes it as
  ``/sys/module/nvidia/version`` and ``/proc/driver/nvidia/version``, under the machine's /run, which every boot
  starts empty. Only a reboot (a machine restart) changes what the daemons and ``nvidia-smi`` see;
- under Secure Boot (the hardware description's ``secure_boot``) the kernel loads only modules signed by a key it
  trusts. DKMS signs with the host's own MOK, trusted once enrolled through MokManager at the console, which a
  machine never has: the boot's load is refused as systemd-modules-load reports it, "Failed to insert module
  'nvidia': Key was rejected by service" (kernel/module/signing.c ``module_sig_check``: EKEYREJECTED when
  signatures are enforced, as under Secure Boot), and no module is loaded.

``nvidia-smi`` then answers as the real one does: exit 9 "couldn't communicate with the NVIDIA driver" with no
module loaded, exit 18 "Driver/library version mismatch" when the installed library (the package's version)
differs from the loaded module.
"""

from __future__ import annotations

import os
from pathlib import Path

from sim.hosts.machine_paths import SIM_RUN_DIR

KERNEL = os.uname().release  # the machines share this machine's kernel
MODULE_FILE = f"usr/lib/modules/{KERNEL}/updates/dkms/nvidia.ko"  # /lib is a link to usr/lib on the image
LOAD_UNIT = "clusterctl-sim-nvidia-module.service"
KERNEL_RUN_DIR = "/run/clusterctl-sim-kernel"
# CLUSTERCTL_SIM_ROOT: a root of a test's own instead of the machine's /.
ROOT_ENV = "CLUSTERCTL_SIM_ROOT"
NVML_ENV = "CLUSTERCTL_SIM_NVML_VERSION"  # set by the stand-in nvidia-utils package's nvidia-smi launcher

NO_DRIVER = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
             "Make sure that the latest NVIDIA driver is installed and running.")
NO_DRIVER_EXIT = 9  # nvidia-smi(1), RETURN VALUE: "NVIDIA driver is not loaded"
MISMATCH = "Failed to initialize NVML: Driver/library version mismatch"
MISMATCH_EXIT = 18  # NVML_ERROR_LIB_RM_VERSION_MISMATCH
REJECTED = "Failed to insert module 'nvidia': Key was rejected by service"  # strerror(EKEYREJECTED)
# host.json's '"secure_boot": true' (sim.hosts.machines writes the hardware there), as a grep pattern without quotes
SECURE_BOOT_PATTERN = "secure_boot...true"


def seed(upper: Path, version: str) -> None:
    """The image's preinstalled driver module (none when ``version`` is empty)."""
    if version:
        path = upper / MODULE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(version + "\n")


def load_unit() -> str:
    """The boot unit that loads the module DKMS left for the running kernel (see the module docstring)."""
    module, driver = f"{KERNEL_RUN_DIR}/module", f"{KERNEL_RUN_DIR}/driver"
    script = (
        f'ko=/lib/modules/$(uname -r)/updates/dkms/nvidia.ko; [ -f "$ko" ] || exit 0; '
        # no single quote may appear inside the unit's sh -c '...': printf's octal escape writes them
        f"if grep -q {SECURE_BOOT_PATTERN} {SIM_RUN_DIR}/host.json 2>/dev/null; then "
        f'printf "{REJECTED.replace(chr(39), chr(92) + "047")}\\n" >&2; exit 0; fi; '
        f'v=$(tr -cd 0-9. < "$ko"); mkdir -p {module}/nvidia {driver}/nvidia; '
        f'echo "$v" > {module}/nvidia/version; '
        f'printf "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  %s  Release Build  '
        f'(dvs-builder@U16-I3-B03-4-3)\\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\\n" '
        f'"$v" > {driver}/nvidia/version; '
        f"mount -t overlay overlay -o ro,lowerdir={module}:/sys/module /sys/module && "
        f"mount --bind {driver} /proc/driver && mount -o remount,bind,ro /proc/driver"
    )
    return (
        "# The NVIDIA kernel module of this simulated machine (clusterctl virtual): the version DKMS built for the\n"
        "# running kernel, loaded at boot and kept until the next one (sim/hosts/nvidia_module.py).\n"
        "[Unit]\nDescription=Load the simulated NVIDIA kernel module\nDefaultDependencies=no\n"
        "Before=sysinit.target\n\n[Service]\nType=oneshot\nRemainAfterExit=yes\n"
        # systemd expands %-specifiers in ExecStart: printf's %s is written %%s
        f"ExecStart=/bin/sh -c '{script.replace('%', '%%')}'\n"
    )


def loaded_version(root: Path | None = None) -> str | None:
    """The loaded module's version, None when no NVIDIA module is loaded."""
    root = root or Path(os.environ.get(ROOT_ENV, "/"))
    try:
        return (root / "sys/module/nvidia/version").read_text().strip() or None
    except OSError:
        return None


def nvidia_smi_gate(library: str | None, loaded: str | None) -> tuple[int, str] | None:
    """(exit code, stdout) of an nvidia-smi that cannot talk to the driver, None when it can. ``library``: the
    installed NVML's driver version (None: the machine's own stub, which has no library of a version)."""
    if loaded is None:
        return NO_DRIVER_EXIT, NO_DRIVER
    if library and library != loaded:
        return MISMATCH_EXIT, f"{MISMATCH}\nNVML library version: {'.'.join(library.split('.')[:2])}"
    return None
