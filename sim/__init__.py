"""Simulators for development and tests; production packages never import this (tests/guards/test_import_lint.py).

``sim.hosts``: the virtual cluster's hosts, their hardware description, faults and stub tools.
``sim.vllm``: the simulated vLLM (load model, /metrics exposition, HTTP server, workload, the GPU file).
``sim.nvml_standin``: the stand-in nvidia-ml-py (``pynvml``) that answers the agent's NVML calls from that file.
"""
