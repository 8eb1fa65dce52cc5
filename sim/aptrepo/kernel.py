"""Maintainer scripts of the stand-in kernel packages: the driver's DKMS package and the running kernel's
headers, and how the driver daemons read the loaded module (see README.md beside this file)."""

from __future__ import annotations

import os

# The running kernel: the machines share this machine's, so `uname -r` on them names it too.
KERNEL = os.uname().release
HEADERS_VERSION = "1.0-0clusterctl1"

# The version of the NVIDIA kernel module the running kernel has loaded (sim/hosts/nvidia_module.py exposes it at
# boot, as the kernel does; CLUSTERCTL_SIM_ROOT lets a test run the daemons against a root of its own).
LOADED_MODULE = 'loaded=$(cat "${CLUSTERCTL_SIM_ROOT:-}/sys/module/nvidia/version" 2>/dev/null || true)\n'

# dkms's postinst for a DKMS package (dkms_common.postinst): build and install the module for the running kernel
# only when its headers are there (/lib/modules/$(uname -r)/build), else print dkms's notice and succeed. Upgrading
# first removes the module the replaced version built (its prerm runs `dkms remove`).
DKMS_POSTINST = """\
#!/bin/sh
set -e
[ "$1" = configure ] || exit 0
kernel=$(uname -r)
modules="${{CLUSTERCTL_SIM_ROOT:-}}/lib/modules/$kernel"
rm -f "$modules/updates/dkms/nvidia.ko"
echo "Loading new nvidia-{version} DKMS files..."
if [ -e "$modules/build" ]; then
  echo "Building for $kernel"
  mkdir -p "$modules/updates/dkms"
  echo "{version}" > "$modules/updates/dkms/nvidia.ko"
else
  echo "Module build for kernel $kernel was skipped since the"
  echo "kernel headers for this kernel do not seem to be installed."
fi
"""

DKMS_POSTRM = """\
#!/bin/sh
set -e
case "$1" in remove|purge) rm -f "${CLUSTERCTL_SIM_ROOT:-}/lib/modules/$(uname -r)/updates/dkms/nvidia.ko" ;; esac
"""

# Ubuntu's linux-headers-<release> ships /lib/modules/<release>/build, the link dkms looks for.
HEADERS_POSTINST = """\
#!/bin/sh
set -e
if [ "$1" = configure ]; then
  mkdir -p /lib/modules/{kernel}
  ln -sfn /usr/src/linux-headers-{kernel} /lib/modules/{kernel}/build
fi
"""

HEADERS_POSTRM = """\
#!/bin/sh
set -e
case "$1" in remove|purge) rm -f /lib/modules/{kernel}/build ;; esac
"""
