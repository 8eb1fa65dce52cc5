"""Simulated inference units: the one vLLM engine model (engine.py on roofline.py, shared with
bench/route_sim.py) and its wall-clock driver (loadmodel.py), its /metrics exposition, an HTTP server per IU and the
GPU file the stand-in nvidia-ml-py (sim/nvml_standin) answers from, so agents run unchanged on the virtual
inventory and in CI."""
