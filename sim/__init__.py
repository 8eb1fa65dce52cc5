"""Simulators for development and tests; production packages never import this (tests/test_import_lint.py).

``sim.hosts``: the virtual cluster's hosts, their hardware description, faults and stub tools.
``sim.vllm``: the simulated vLLM (load model, /metrics exposition, HTTP server, workload, fake NVML file).
"""
