# Part of clusterctl. Apache-2.0.
"""The options consul_restart and consul_servers_healthy read a server's health with
(module_utils/consul_health.py's HEALTH_ARGUMENT_SPEC)."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  url:
    description: The agent's HTTP API base URL.
    type: str
    required: true
  node_name:
    description: This agent's node name (autopilot's server Name); its own health never holds it back.
    type: str
    default: ""
  token:
    description: ACL token with operator:read for the health read (sent as X-Consul-Token, never logged).
    type: str
    default: ""
"""
