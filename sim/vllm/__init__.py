"""Simulated inference units: a vLLM-like load model, its /metrics exposition, an HTTP server per IU and the
fake NVML file, so agents run unchanged on the virtual inventory and in CI."""
