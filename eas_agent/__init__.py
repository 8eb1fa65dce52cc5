"""EAS agent (EAS: Entropy-Aware Scheduler, the design's name for scoring each inference unit's load and
routing to the least loaded): per-node load scores for inference units (IUs), published to Consul.

Layout: ``collectors`` (vLLM /metrics, NVML, network) -> ``score`` (profiles ``drain`` and ``seed``) ->
``publisher`` (one KV key per node, its only output) through ``consul_io`` (the only package that talks to
Consul); ``http`` serves ``/scores`` and the announce channel. What crosses to the edge is ``eas_wire``
(the score body, the stream, the announce messages); the edge's reader of the pool is ``edge.pool``, which
this package never imports. The simulated IUs of the virtual cluster are ``sim.vllm``, never shipped here.
"""
