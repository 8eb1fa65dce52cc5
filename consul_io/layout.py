"""Every Consul name and key format the project uses, in one place (docs/contracts/consul-layout.md).

The client side (agent, edge, preflight, ``clusterctl scores``, the demo, the benchmarks, the ACL policies in
``consul_io/acl.py``, the IU service definitions in ``cluster/services.py``) spells these names only
through this module, and so do the roles and playbooks: through the filters in ``playbooks/filter_plugins``
(``consul_marker_key``, ``consul_maintenance``, ``cluster_node``'s ``consul`` block). ``devconsul/`` is a
Consul server and keeps Consul's own names (``_service_maintenance:``) where it implements them.
``tests/unit/consul_io/test_layout.py`` fails on a hand-written copy in Python or in the roles' and playbooks' YAML.

No imports beyond the standard library: the agent wheel, the roles' filter plugins and the reader library
all load it.
"""

from __future__ import annotations

# -- services and checks ------------------------------------------------------------------------------------
# Each node's IUs are instances of that node's own service "vllm-iu-<node>" (iu_service()); the service ID is
# the IU id. Consul grants service rights by service name only, so one name per node is what lets a node's
# registration token write its own IUs and no other node's (consul_io/acl.py).
SERVICE_NAME = "vllm-iu"  # the family: every IU service's name is "vllm-iu-<node>"
IU_SERVICE_PREFIX = f"{SERVICE_NAME}-"
EDGE_SERVICE_NAME = "eas-edge"  # the family: each edge host's service is "eas-edge-<node>", ID eas-edge-<node>
EDGE_SERVICE_PREFIX = f"{EDGE_SERVICE_NAME}-"
IU_ID_INFIX = "-iu"  # IU ids are "<node>-iu<index>" (cluster/model.py builds them with iu_id())
# Consul's own check ids for maintenance mode (https://developer.hashicorp.com/consul/api-docs/agent/service
# #enable-maintenance-mode): a critical check "_service_maintenance:<service id>", "_node_maintenance" for a node.
SERVICE_MAINT_PREFIX = "_service_maintenance:"
NODE_MAINT_CHECK = "_node_maintenance"
SERF_HEALTH_CHECK = "serfHealth"  # Consul's gossip health check of every node
SERVICE_DEFINITION_GLOB = "vllm-iu-*.json"  # the consul_agent role's definition files in the config dir
# Every IU instance carries these two tags (the edge reads the node from the tag when Meta has none).
RACK_TAG_PREFIX = "rack:"
NODE_TAG_PREFIX = "node:"

# -- KV -------------------------------------------------------------------------------------------------
EAS_PREFIX = "clusterctl/eas"  # score bodies: <prefix>/<dc>/<node> (docs/contracts/score-body.md)
PREFLIGHT_PREFIX = "clusterctl/preflight"  # release markers: <prefix>/<dc>/<iu id>
ROLLOUT_PREFIX = "clusterctl/rollout"  # the traffic rollout document: <prefix>/<dc>/document (eas_wire/rollout.py)
REPAIR_PREFIX = "clusterctl/repair"  # nodes marked for repair by clusterctl remediate: <prefix>/<dc>/<node>
DEFAULT_DATACENTER = "dc1"
DEFAULT_HTTP_ADDR = "127.0.0.1:8500"

# -- ACL policies -----------------------------------------------------------------------------------------
# One policy per job (consul_io/acl.py holds their rules; the consul_agent role creates them and links
# each token to its policy through the consul_node_acl filter). "{node}" is the node's name.
ACL_POLICIES = {
    "agent": "consul-agent-{node}",
    "registration": "vllm-iu-registration-{node}",
    "operator": "clusterctl-operator",
    "eas_agent": "eas-agent-{node}",
    "edge": "clusterctl-edge",
}


def iu_id(node: str, index: int) -> str:
    return f"{node}{IU_ID_INFIX}{index}"


def node_of_iu(iu: str) -> str:
    """The node part of an IU id ("r01n01-iu0" -> "r01n01")."""
    return iu.rsplit(IU_ID_INFIX, 1)[0]


def is_iu_of(iu: str, node: str) -> bool:
    """Whether ``iu`` is named as one of ``node``'s IUs ("<node>-iu<n>")."""
    head, sep, index = iu.rpartition(IU_ID_INFIX)
    return bool(sep) and head == node and index.isdigit()


def iu_service(node: str) -> str:
    """The Consul service name of ``node``'s IUs ("r01n01" -> "vllm-iu-r01n01")."""
    return f"{IU_SERVICE_PREFIX}{node}"


def edge_service(node: str) -> str:
    """The Consul service name of the edge on ``node`` ("r01n01" -> "eas-edge-r01n01"): one name per host, as
    for the IUs, so a node's registration token writes its own edge and no other host's."""
    return f"{EDGE_SERVICE_PREFIX}{node}"


def is_iu_service(name: str) -> bool:
    """Whether ``name`` is some node's IU service (``vllm-iu-<node>``)."""
    return name.startswith(IU_SERVICE_PREFIX) and len(name) > len(IU_SERVICE_PREFIX)


def maintenance_check(service_id: str) -> str:
    return f"{SERVICE_MAINT_PREFIX}{service_id}"


def is_maintenance_check(check_id: str) -> bool:
    """A service's or the node's maintenance check (either takes the IU out of rotation)."""
    return check_id.startswith(SERVICE_MAINT_PREFIX) or check_id == NODE_MAINT_CHECK


def maintained_service(check_id: str) -> str | None:
    """The service ID a service maintenance check holds in maintenance; None for any other check."""
    return check_id.removeprefix(SERVICE_MAINT_PREFIX) if check_id.startswith(SERVICE_MAINT_PREFIX) else None


def health_check_id(iu: str) -> str:
    """The id of the HTTP check on the IU's vLLM ``/health`` in its service definition."""
    return f"{SERVICE_NAME}:{iu}:health"


def rack_tag(rack: str) -> str:
    return f"{RACK_TAG_PREFIX}{rack}"


def node_tag(node: str) -> str:
    return f"{NODE_TAG_PREFIX}{node}"


def tagged_node(tag: str) -> str | None:
    """The node a ``node:<node>`` tag names; None for any other tag."""
    return tag.removeprefix(NODE_TAG_PREFIX) if tag.startswith(NODE_TAG_PREFIX) else None


def service_definition_file(iu: str) -> str:
    return SERVICE_DEFINITION_GLOB.replace("*", iu)


def score_prefix(datacenter: str, kv_prefix: str = EAS_PREFIX) -> str:
    """The KV prefix holding every node's score body in ``datacenter`` (with the trailing slash)."""
    return f"{kv_prefix.strip('/')}/{datacenter}/"


def score_key(datacenter: str, node: str, kv_prefix: str = EAS_PREFIX) -> str:
    return f"{score_prefix(datacenter, kv_prefix)}{node}"


def rollout_prefix(datacenter: str) -> str:
    """The KV prefix the edges watch for the rollout document (with the trailing slash)."""
    return f"{ROLLOUT_PREFIX}/{datacenter}/"


def rollout_key(datacenter: str) -> str:
    """The KV key of ``datacenter``'s traffic rollout document (``clusterctl rollout`` writes, edges read)."""
    return f"{rollout_prefix(datacenter)}document"


def acl_policy(kind: str, node: str) -> str:
    """The name of the ACL policy of job ``kind`` (a key of :data:`ACL_POLICIES`) for ``node``."""
    return ACL_POLICIES[kind].format(node=node)


def marker_key(datacenter: str, iu: str) -> str:
    """KV key that records that preflight released this IU; without it the role keeps the IU in maintenance."""
    return f"{PREFLIGHT_PREFIX}/{datacenter}/{iu}"


def repair_key(datacenter: str, node: str) -> str:
    """KV key recording that ``clusterctl remediate`` took ``node`` out for repair, and why."""
    return f"{REPAIR_PREFIX}/{datacenter}/{node}"
