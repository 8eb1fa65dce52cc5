"""eas-edge: an OpenAI-compatible reverse proxy in front of a pool of vLLM inference units (IUs).

Membership and health come from Consul (``vllm-iu`` services and their checks, through the reader library
``eas_agent.scheduler``); scores from the agents' KV snapshot and, fresher, from one blocking-query
connection per node to the agent's ``GET /scores?index=`` (:mod:`edge.feed`); every request is routed with
``pick()`` (:mod:`edge.routing`) and proxied by :mod:`edge.proxy` (aiohttp), streams chunk by chunk.
Entry points: ``eas-edge --config edge.yml`` and ``clusterctl edge serve``; config in :mod:`edge.config`.

The edge imports only aiohttp, py-consul, prometheus-client, PyYAML and the reader library (no Ansible,
click or rich): ``tests/integration/edge/test_feed_config.py`` keeps it so.
"""
