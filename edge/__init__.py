"""eas-edge: an OpenAI-compatible reverse proxy in front of a pool of vLLM inference units (IUs).

Membership and health come from Consul (each node's ``vllm-iu-<node>`` service and its checks, through the pool reader
:mod:`edge.pool`); scores from the agents' KV snapshot and, fresher, from one stream per node of the agent's
``GET /scores?stream=1`` (:mod:`edge.feed`; docs/contracts/scores-stream.md); every request is routed with
``pick()`` (:mod:`edge.routing`) and proxied by :mod:`edge.proxy` (aiohttp), streams chunk by chunk.
Entry points: ``eas-edge --config edge.yml`` and ``clusterctl edge serve``; config in :mod:`edge.config`.

The edge imports only aiohttp, py-consul, prometheus-client, PyYAML, the protocol it shares with the agents
(``eas_wire``) and the Consul layer (``consul_io``): no Ansible, click or rich (tests/integration/edge/test_feed_config.py),
nothing of the agent (tests/guards/test_import_lint.py). Its own wheel: ``python -m provision.wheels edge DIR``.
"""
