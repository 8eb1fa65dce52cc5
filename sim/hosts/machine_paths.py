"""Paths inside a simulated machine, shared by the controller side and the stub tools that run in the machine.

Imports nothing: the machines see only the ``sim`` and ``preflight`` packages (read-only, under
``/usr/local/lib/clusterctl-sim``) and run them with their own python3, which has no pip packages.
"""

SIM_RUN_DIR = "/run/clusterctl-sim"  # where a machine sees its own state/ dir
