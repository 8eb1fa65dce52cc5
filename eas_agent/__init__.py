"""EAS agent: per-node load scores for inference units (IUs), published to Consul.

Layout: ``collectors`` (vLLM /metrics, NVML, network) -> ``score`` (profiles ``drain`` and ``seed``) ->
``publisher`` (one KV key per node, TTL checks) through ``consul_io`` (the only module that talks to
Consul). ``scheduler`` is the edge's reader library; ``sim`` holds simulated IUs for the virtual inventory.
"""
