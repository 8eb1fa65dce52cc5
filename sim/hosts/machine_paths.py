"""Paths inside a simulated machine, shared by the controller side and the stub tools that run in the machine.

Imports nothing: the machines see only the ``sim`` and ``preflight`` packages (read-only, under
``/usr/local/lib/clusterctl-sim``) and run them with their own python3, which has no pip packages.
"""

SIM_RUN_DIR = "/run/clusterctl-sim"  # where a machine sees its own state/ dir
# Where the stand-in nv-hostengine (DCGM's package, sim/aptrepo) keeps its pid while it runs, in place of its
# TCP listener on 127.0.0.1:5555 (machines share one network namespace): the stand-in dcgmi reaches a host
# engine only while that process lives. /run is the machine's own tmpfs, so a restart forgets it.
DCGM_HOSTENGINE_PID = "/run/nv-hostengine.pid"
