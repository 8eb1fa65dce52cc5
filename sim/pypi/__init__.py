"""A local PEP 503 package index (stand-in vLLM, the EAS agent's wheel, a stand-in nvidia-ml-py and their
dependencies) for the virtual cluster; see sim.pypi.build. Served by sim.aptrepo.serve on a loopback address."""

from sim.pypi.build import build_index, build_vllm_standin, constraints

__all__ = ["build_index", "build_vllm_standin", "constraints"]
