"""The stand-in for nvidia-ml-py (``pynvml.py`` here; what it answers and from which file: its docstring), and
the three ways the simulators put it under the agent's unchanged ``NvmlBackend``:

- the virtual cluster's machines: the package index serves it as the ``nvidia-ml-py`` distribution
  (sim/pypi/build.py), and it reads the file ``virtual up`` writes (its default path);
- an ``eas-agent run`` subprocess on this machine: :func:`agent_env` puts this directory first on the
  subprocess's PYTHONPATH and names the file;
- an agent run in-process (tests, benchmarks): :func:`nvml_backend`, the agent's ``NvmlBackend`` over an
  instance of the module of its own, so that agents in one process each read their node's file.

Nothing here ships with the agent: production imports ``pynvml`` by name, never this package
(tests/guards/test_import_lint.py).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from eas_agent.collectors.gpu import NvmlBackend

STANDIN_DIR = Path(__file__).resolve().parent
MODULE_FILE = STANDIN_DIR / "pynvml.py"
FILE_ENV = "CLUSTERCTL_SIM_NVML_FILE"  # the module's own FILE_ENV (it imports nothing of this checkout)


def load(gpu_file: str | Path) -> ModuleType:
    """A fresh instance of the stand-in module that reads ``gpu_file`` (not registered in sys.modules)."""
    spec = importlib.util.spec_from_file_location("pynvml", MODULE_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.data_file = str(gpu_file)
    return module


def nvml_backend(gpu_file: str | Path) -> NvmlBackend:
    """What an in-process agent gets as ``gpu_backend``: NVML as the agent reads it, answered from ``gpu_file``."""
    return NvmlBackend(nvml=load(gpu_file))


def agent_env(gpu_file: str | Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) for an ``eas-agent run`` subprocess whose ``import pynvml`` is the
    stand-in reading ``gpu_file``."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STANDIN_DIR), env.get("PYTHONPATH")) if p)
    env[FILE_ENV] = str(gpu_file)
    return env
