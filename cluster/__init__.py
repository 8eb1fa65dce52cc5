"""The cluster model: racks -> nodes -> inference units (IUs), built once from the Ansible inventory.

The CLI, preflight, the agent's config rendering and the roles (through ``playbooks/filter_plugins``)
all use :func:`cluster.model.build_node`, so the layout rules live in exactly one place.
"""

from cluster.ansible.inventory import InventoryError, load_cluster, load_inventory
from cluster.model import IU, Cluster, Nic, Node, Rack

__all__ = ["IU", "Cluster", "InventoryError", "Nic", "Node", "Rack", "load_cluster", "load_inventory"]
