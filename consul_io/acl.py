"""The cluster's Consul ACL policies (least privilege, one per job).

Rules use Consul's rule language (https://developer.hashicorp.com/consul/docs/secure/acl/rule). Each token
from the vault is linked to exactly the policy below; ``roles/consul_agent`` creates policies and tokens
through a server (``clusterctl.infra.consul_acl``).

| Token (vault variable)                          | Policy                    | Rules                                        |
|-------------------------------------------------|---------------------------|----------------------------------------------|
| node agent (``consul_agent_acl_agent_token``)   | ``consul-agent-<node>``   | write its own node, read services            |
| file services (``..._registration_token``)      | ``vllm-iu-registration-<node>`` | write ``vllm-iu-<node>`` and ``eas-edge-<node>`` (config_file_service_registration) |
| operator (``consul_token``/``consul_token_file``) | ``clusterctl-operator``   | every ``vllm-iu-`` service (maintenance), the preflight markers, the rollout document, repair records, reads, the servers' health (``operator`` read) |
| eas-agent (``eas_agent_consul_token``)          | ``eas-agent-<node>``      | its own score key; reads the score keys, nodes |
| edge (``consul_edge_token``)                    | ``clusterctl-edge``       | read the ``vllm-iu-`` services, nodes, the score keys and the rollout document |

What each token can then do, and what it can do beyond its job, is the table "What each token can do" in
docs/contracts/consul-layout.md, which ``tests/integration/consul_io/test_acl.py`` performs cell by cell. In short:
Consul grants service rights by service *name* only, so each node's IUs are instances of that node's own
service ``vllm-iu-<node>`` and a node's registration token may write that one name (an exact rule: a prefix
rule for node ``a`` would match node ``a-b``'s name too). It can still put an instance of its own name on
another catalog node through ``catalog/register`` (Consul asks ``node:write`` only for the node's own entry);
the edge's reader routes an instance only when its service name is its catalog node's (edge/pool/view.py),
so such an instance is counted and never routed. The eas-agent token has no service rights: Consul requires
``service:write`` on the service both to update a check on it and to take it out of maintenance, so an agent
that kept TTL checks could bypass the preflight gate; it publishes its verdict in its score key only.
"""

from __future__ import annotations

from consul_io.layout import (
    EAS_PREFIX,
    IU_SERVICE_PREFIX,
    PREFLIGHT_PREFIX,
    REPAIR_PREFIX,
    ROLLOUT_PREFIX,
    acl_policy,
    edge_service,
    iu_service,
)


def agent_policy(node: str) -> str:
    # Consul's recommended agent token: node write for its own node, service read (for the agent's
    # own service watches and DNS).
    return f'node "{node}" {{ policy = "write" }}\nservice_prefix "" {{ policy = "read" }}\n'


def registration_policy(node: str) -> str:
    # The file services of a node: its IUs and, on a host of the edges group, its edge (roles/eas_edge).
    return (f'service "{iu_service(node)}" {{ policy = "write" }}\n'
            f'service "{edge_service(node)}" {{ policy = "write" }}\n')


def operator_policy() -> str:
    return (f'service_prefix "{IU_SERVICE_PREFIX}" {{ policy = "write" }}\n'
            f'key_prefix "{PREFLIGHT_PREFIX}/" {{ policy = "write" }}\n'
            f'key_prefix "{ROLLOUT_PREFIX}/" {{ policy = "write" }}\n'
            f'key_prefix "{REPAIR_PREFIX}/" {{ policy = "write" }}\n'
            'node_prefix "" { policy = "read" }\n'
            'service_prefix "" { policy = "read" }\n'
            'agent_prefix "" { policy = "read" }\n'
            # autopilot's health, which a server's restart and reboot wait on (the role's handlers,
            # consul-servers-reboot.yml): no server holds the management token for it
            'operator = "read"\n')


def eas_agent_policy(node: str, datacenter: str, kv_prefix: str = EAS_PREFIX) -> str:
    prefix = kv_prefix.strip("/")
    return (f'key "{prefix}/{datacenter}/{node}" {{ policy = "write" }}\n'
            f'key_prefix "{prefix}/" {{ policy = "read" }}\n'
            'node_prefix "" { policy = "read" }\n')


def edge_policy(kv_prefix: str = EAS_PREFIX) -> str:
    return (f'service_prefix "{IU_SERVICE_PREFIX}" {{ policy = "read" }}\n'
            'node_prefix "" { policy = "read" }\n'
            f'key_prefix "{kv_prefix.strip("/")}/" {{ policy = "read" }}\n'
            f'key_prefix "{ROLLOUT_PREFIX}/" {{ policy = "read" }}\n')


def node_policies(node: str, datacenter: str, kv_prefix: str = EAS_PREFIX) -> dict[str, str]:
    """Policy name -> rules that the tokens of ``node`` link to (the shared ones included); the names are
    :func:`consul_io.layout.acl_policy`'s."""
    rules = {
        "agent": agent_policy(node),
        "registration": registration_policy(node),
        "operator": operator_policy(),
        "eas_agent": eas_agent_policy(node, datacenter, kv_prefix),
        "edge": edge_policy(kv_prefix),
    }
    return {acl_policy(kind, node): text for kind, text in rules.items()}
