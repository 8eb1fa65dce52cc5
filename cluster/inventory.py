"""Loading an inventory into the cluster model: the import path the CLI and the simulators use.

The implementation imports Ansible and so lives in :mod:`cluster.ansible.inventory` (only that package
imports Ansible); this module names its public API.
"""

from cluster.ansible.inventory import (
    ALLOW_SCRIPTS_ENV,
    InventoryError,
    LoadedInventory,
    check_syntax,
    cluster_of,
    has_template,
    load_cluster,
    load_inventory,
    problems_of,
    scripts_allowed,
)

__all__ = [
    "ALLOW_SCRIPTS_ENV", "InventoryError", "LoadedInventory", "check_syntax", "cluster_of", "has_template",
    "load_cluster", "load_inventory", "problems_of", "scripts_allowed",
]
